"""Trainer equivalences on the tiny dense preset (random init, 1 thread).

Rewards come from the addition task with DAPO's overlong penalty (max_len 12, buffer 11): a random
policy never answers correctly, so every reward is -1 + penalty(length) in [-2, -1] and the group
advantages are non-zero, i.e. the updates really move the policy.
"""

import copy

import pytest
import torch

import respo
from respo.runtime.models import build_policy
from respo.runtime.tasks import get_task
from respo.runtime.tokenizer import build_char_tokenizer
from respo.train.config import Forward, Sampling, TrainConfig, apply_overrides
from respo.train.policy import Policy
from respo.runtime.engines.respo import RespoEngine
from respo.train.rollout import recompute_logp, sample_rollout
from respo.train.update import UpdateSettings, make_optimizer, update_step
from trainer_support import rollout as _rollout, setup, small_cfg as _cfg  # noqa: F401 (setup is a fixture)

torch.set_num_threads(1)


KWARGS = {"reshaped": {"pos_kernel": respo.respo_kernel(2.0, 0.5, 2.0), "neg_kernel": respo.vespo_kernel(3.0, 2.0)}}


@pytest.mark.parametrize("micro_batch", [0, 2])
def test_on_policy_first_update_has_log_w_exactly_zero_for_every_objective(setup, micro_batch):
    # N = 1, one mini-batch: the training forward must reproduce old_logp bitwise, so log W = 0 and
    # every ratio is exactly 1 (no tolerance), with or without micro-batching.
    cfg = _cfg(micro_batch=micro_batch)
    batch = _rollout(setup, cfg, cfg.prompts)
    assert batch.adv.abs().sum() > 0  # real learning signal
    for name in sorted(respo.OBJECTIVES):
        model = copy.deepcopy(setup[0].model)
        opt, sched = make_optimizer(model, cfg)
        c = apply_overrides(cfg, {"objective": name, "objective_kwargs": KWARGS.get(name, {})})
        m, _ = update_step(model, opt, sched, batch, UpdateSettings.of(c))
        assert float(m["log_w/min"]) == 0.0 and float(m["log_w/max"]) == 0.0, name
        assert torch.isfinite(m["loss"]) and float(m["grad_norm"]) > 0, name


def test_on_policy_shortcut_equals_recomputation(setup):
    # The sync loop skips recomputing old_logp for the first mini-batch of a rollout step and takes the
    # detached training forward instead: the update must be bitwise the same as with the recomputation,
    # the old_logp it returns must be the recomputation, and the batch it was given is left untouched.
    cfg = _cfg(micro_batch=4)
    batch = _rollout(setup, cfg, cfg.prompts)
    weights = []
    for on_policy in (False, True):
        b = copy.deepcopy(batch)
        if on_policy:
            b.old_logp = torch.zeros_like(b.mask)
        model = copy.deepcopy(setup[0].model)
        opt, sched = make_optimizer(model, cfg)
        _, old_logp = update_step(model, opt, sched, b, UpdateSettings.of(cfg), on_policy=on_policy)
        weights.append([p.detach().clone() for p in model.parameters()])
        assert torch.equal(old_logp, batch.old_logp)
        if on_policy:
            assert torch.equal(b.old_logp, torch.zeros_like(b.mask))
    assert all(torch.equal(a, b) for a, b in zip(*weights))


def test_staleness_k_minus_1_changes_log_w(setup):
    # N = 2: mini-batch 1 is on-policy (log W = 0); mini-batch 2 comes after one update (staleness 1),
    # so its log W can no longer be exactly 0 everywhere. This is the check that the test above can fail.
    cfg = _cfg(reuse=2)
    batch = _rollout(setup, cfg, cfg.rollout_prompts)
    model = copy.deepcopy(setup[0].model)
    opt, sched = make_optimizer(model, cfg)
    rows = cfg.mini_batch_seqs
    m1, _ = update_step(model, opt, sched, batch.rows(0, rows), UpdateSettings.of(cfg))
    m2, _ = update_step(model, opt, sched, batch.rows(rows, 2 * rows), UpdateSettings.of(cfg))
    assert float(m1["log_w/min"]) == 0.0 == float(m1["log_w/max"])
    assert float(m2["log_w/max"]) - float(m2["log_w/min"]) > 0


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_micro_batching_does_not_change_the_update(setup, agg):
    # 8 rows as one chunk vs 4 chunks of 2 rows with the global token/sequence normaliser: the summed
    # gradient is the same up to float rounding. Plain SGD with lr 1 makes the weight change equal to
    # the (clipped) gradient; AdamW's first step, ~lr*sign(g), would amplify rounding in tiny entries.
    cfg = _cfg(loss_agg_mode=agg, objective="grpo")
    batch = _rollout(setup, cfg, cfg.prompts)
    after = []
    for micro in (0, 2):
        model = copy.deepcopy(setup[0].model)
        c = apply_overrides(cfg, {"micro_batch": micro})
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda u: 1.0)
        m, _ = update_step(model, opt, sched, batch, UpdateSettings.of(c))
        after.append((torch.cat([p.detach().flatten() for p in model.parameters()]), m))
    (w0, m0), (w1, m1) = after
    assert torch.allclose(m0["loss"], m1["loss"], atol=1e-6, rtol=1e-5)
    assert torch.allclose(m0["grad_norm"], m1["grad_norm"], rtol=1e-4)
    start = torch.cat([p.detach().flatten() for p in setup[0].model.parameters()])
    assert (w0 - start).abs().max() > 1e-5  # the step moved the weights...
    assert torch.allclose(w0, w1, atol=1e-6)  # ...by the same gradient


@pytest.mark.parametrize("replay", [False, True])
def test_moe_routing_recorded_replayed_and_shift_logged(replay):
    # tiny-moe: the rollout records every token's experts; with routing_replay the old-logp and training
    # forwards use them. Either way the first update is on-policy (log W == 0 exactly) and the router
    # shift between sampling (KV-cached decode) and the training forward is logged and small.
    tok = build_char_tokenizer()
    model = build_policy("tiny-moe", tok, seed=0)
    task = get_task("addition", overlong=(12, 11))
    pool = task.examples("train", 16, 0)
    cfg = _cfg(model="tiny-moe", routing_replay=replay, micro_batch=4)
    policy = Policy(model, tok, {})
    engine = RespoEngine(policy.model, policy.tokenizer, dtype=cfg.dtype)
    batch, _ = sample_rollout(engine, task, pool, [0, 1], Sampling.of(cfg), torch.Generator().manual_seed(0), 0)
    batch.adv = respo.group_advantages(batch.rewards, cfg.group_size, kind=cfg.adv_kind)  # (S,)
    L, n_layers, k = batch.input_ids.shape[1], model.config.num_hidden_layers, model.config.num_experts_per_tok
    assert batch.routing is not None and tuple(batch.routing.shape) == (8, L, n_layers, k)
    batch.old_logp = recompute_logp(model, batch, Forward.of(cfg), mini_batch=cfg.mini_batch_seqs)
    opt, sched = make_optimizer(model, cfg)
    m, _ = update_step(model, opt, sched, batch, UpdateSettings.of(cfg))
    assert float(m["log_w/min"]) == 0.0 == float(m["log_w/max"])
    assert 0.0 <= float(m["router_shift"]) < 0.05
    # per-layer shift and the rollout's expert load are logged too; with replay the training forward uses
    # exactly the recorded experts, so no layer shifts
    for layer in range(n_layers):
        assert 0.0 <= float(m[f"router_shift/layer_{layer}"]) <= float(m["router_shift/any_layer"])
        if replay:
            assert float(m[f"router_shift/layer_{layer}"]) == 0.0
    assert float(m["load_max"]) >= 1.0 and float(m["load_entropy"]) > 0.0


@pytest.mark.parametrize("objective", ["respo", "grpo"])
def test_off_policy_training_learns(tmp_path, objective):
    # The whole loop (sync, N = 2, so every second update is off-policy) must move the policy where the
    # reward points. Reward = -1 + overlong penalty falling linearly from length 1 to 12, so a shorter
    # response is strictly better; a random init answers with ~10 tokens (EOS is 1 of 26 tokens). Measured
    # (seed 0): ReSPO 9.7, 10.1 -> 1.0 tokens in 24 updates at lr 3e-3.
    import json

    from respo.train.trainer import train

    cfg = _cfg(prompts=4, lr=3e-3, reuse=2, updates=24, threads=1, objective=objective, out_dir=str(tmp_path / "r"))
    run = train(cfg)
    recs = [json.loads(line) for line in open(run / "metrics.jsonl")]
    length = [r["response_length"] for r in recs]
    assert sum(length[:2]) / 2 > 6 and sum(length[-4:]) / 4 < 3, length
    assert [r["staleness_max"] for r in recs[:4]] == [0, 1, 0, 1]
    # time/update is the update's whole wall time: it holds the phases the sync loop runs one after another
    assert all(r["time/update"] >= sum(r.get(f"time/{k}", 0.0) for k in ("sample", "old_logp", "train")) for r in recs)


def test_preset_from_scratch_gets_the_tasks_alphabet():
    # A text task trained from a preset without warm start must not encode its prompts as <unk>:
    # the char tokenizer takes the task's alphabet (as the warm start's SFT does).
    from respo.train.policy import load_run_policy

    cfg = apply_overrides(TrainConfig(), {"warm_start": False, "task": "reasoning_gym:basic_arithmetic"})
    tok = load_run_policy(cfg).tokenizer
    text = "What is 3+4?"
    assert tok.unk_token_id not in tok(text)["input_ids"]
    assert tok.decode(tok(text)["input_ids"], skip_special_tokens=True) == text
    # arithmetic tasks keep the small vocabulary (unchanged random-init models for the presets)
    assert len(load_run_policy(apply_overrides(TrainConfig(), {"warm_start": False})).tokenizer) == 4 + 22


def test_train_leaves_threads_and_global_rngs_as_it_found_them(tmp_path):
    # The run seeds torch/random/numpy and sets cfg.threads while it runs, and puts all of them back.
    import random

    import numpy as np

    from respo.train.trainer import train

    threads = torch.get_num_threads()
    torch.manual_seed(7), random.seed(7), np.random.seed(7)
    expected = (torch.rand(3), random.random(), np.random.rand())
    torch.manual_seed(7), random.seed(7), np.random.seed(7)
    train(_cfg(updates=1, threads=threads + 1, out_dir=str(tmp_path / "r")))
    assert torch.get_num_threads() == threads
    drawn = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(drawn[0], expected[0]) and drawn[1:] == expected[1:]


def test_model_directory_kind_is_decided_by_its_files(tmp_path):
    # A directory with a warm start's info file loads as a warm start; a broken one raises instead of
    # falling back to a plain Hugging Face load. A plain saved model loads without the info file.
    from respo.runtime.sft import INFO_FILE
    from respo.train.policy import load_run_policy, weights_sha256

    tok = build_char_tokenizer()
    build_policy("tiny-dense", tok, seed=0).save_pretrained(tmp_path / "plain")
    tok.save_pretrained(tmp_path / "plain")
    policy = load_run_policy(apply_overrides(TrainConfig(), {"model": str(tmp_path / "plain")}))
    assert policy.info == {"source": "dir", "path": str(tmp_path / "plain"),
                           "weights_sha256": weights_sha256(build_policy("tiny-dense", tok, seed=0))}
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / INFO_FILE).write_text("{}")
    with pytest.raises((OSError, ValueError)):  # no tokenizer files: the real error surfaces
        load_run_policy(apply_overrides(TrainConfig(), {"model": str(tmp_path / "broken")}))


@pytest.mark.parametrize("grad_clip, clipped", [(1e-6, 1.0), (0.0, 0.0), (1e6, 0.0)])
def test_grad_clipped_says_whether_clipping_fired(setup, grad_clip, clipped):
    # grad_clip = 1e-6 is far below any real gradient norm, so clipping scales the update down (1);
    # 0 disables clipping and 1e6 is never reached (0). The recorded grad_norm is the norm before clipping.
    cfg = _cfg(grad_clip=grad_clip)
    batch = _rollout(setup, cfg, cfg.prompts)
    model = copy.deepcopy(setup[0].model)
    opt, sched = make_optimizer(model, cfg)
    m, _ = update_step(model, opt, sched, batch, UpdateSettings.of(cfg))
    assert float(m["grad_norm"]) > 1e-6
    assert float(m["grad_clipped"]) == clipped


def test_a_run_builds_its_objective_once_and_train_writes_no_report(tmp_path, monkeypatch):
    # The objective (hyperparameters checked, aggregation settled) is built once per run, not per update,
    # and train() only trains: report.md and curve.png are the CLI's and the demo's to write.
    import respo.train.update as update
    from respo.train.trainer import train

    built = []
    real = update.build_objective
    monkeypatch.setattr(update, "build_objective", lambda *a, **kw: built.append(a) or real(*a, **kw))
    run = train(_cfg(updates=3, reuse=1, objective="gspo", loss_agg_mode="token-mean", out_dir=str(tmp_path / "r")))
    assert built == [("gspo",)]
    assert (run / "summary.json").is_file() and not (run / "report.md").exists() and not (run / "curve.png").exists()


def _stale_batch(setup, cfg):
    """A rollout batch of ``cfg.prompts`` from the setup's policy and a copy of that policy one REINFORCE update
    past it, with its optimizer and schedule: ``(batch, model, opt, sched)``, the batch stale by one update."""
    batch = _rollout(setup, cfg, cfg.prompts)
    model = copy.deepcopy(setup[0].model)
    opt, sched = make_optimizer(model, cfg)
    update_step(model, opt, sched, batch, UpdateSettings.of(apply_overrides(cfg, {"objective": "reinforce"})))
    return batch, model, opt, sched


@pytest.mark.filterwarnings("ignore:Seems like `optimizer.step\\(\\)` has been overridden:UserWarning")  # the gradient capture
def test_decoupled_in_the_reuse_schedule_needs_no_proximal_forward(setup):
    # The trainer takes one optimizer step per mini-batch, so the proximal policy of an update is the policy
    # being differentiated; its log-probs are the training forward itself (bitwise the recomputation, see
    # test_on_policy_shortcut_equals_recomputation) and cost no extra forward. decoupled then has r = 1 and its
    # update equals token MIS on [0, C] of π_θ/π_old.
    cfg = _cfg(micro_batch=4)
    batch, model, opt, sched = _stale_batch(setup, cfg)
    runs = {}
    for name, kw in (("decoupled", {"cap": 1.02}), ("mis", {"level": "token", "lo": 0.0, "hi": 1.02})):
        m = copy.deepcopy(model)
        o, s = make_optimizer(m, cfg)
        grads, step = [], o.step
        o.step = lambda *a, **k: (grads.extend(p.grad.clone() for p in m.parameters() if p.grad is not None), step(*a, **k))[1]
        metrics, _ = update_step(m, o, s, batch, UpdateSettings.of(apply_overrides(cfg, {"objective": name, "objective_kwargs": kw})))
        runs[name] = (grads, metrics)
    (g_dec, m_dec), (g_mis, m_mis) = runs["decoupled"], runs["mis"]
    assert 0 < float(m_dec["corr/mask_frac"]) < 1 and float(m_dec["corr/mask_frac"]) == float(m_mis["corr/mask_frac"])
    # the same gradient up to float32 rounding (the loss values differ: −b·Â against −c·Â·logp)
    assert len(g_dec) == len(g_mis) > 0 and any(g.abs().sum() > 0 for g in g_dec)
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-6 * float(b.abs().max())) for a, b in zip(g_dec, g_mis))
    assert "chi2_token" in m_dec and "corr/silenced_adv_share/pos" in m_dec


def test_m2po_diagnostics_describe_the_mask_each_micro_batch_applied(setup):
    # M2PO selects over the batch of each call, so with micro-batches the training step silences a
    # per-micro-batch selection; the update's logged corr/ fractions must count that selection, not the one
    # the whole mini-batch would give.
    from respo.core import corrections as C

    cfg = _cfg(micro_batch=2)
    batch, model, opt, sched = _stale_batch(setup, cfg)
    before = copy.deepcopy(model)
    tau = 1e-4  # small enough that each micro-batch drops some tokens
    metrics, _ = update_step(model, opt, sched, batch, UpdateSettings.of(apply_overrides(cfg, {"objective": "m2po", "objective_kwargs": {"tau": tau}})))
    logp = recompute_logp(before, batch, Forward.of(cfg), mini_batch=cfg.mini_batch_seqs)  # π_θ before the step, per micro-batch as the training forward saw it
    log_w = C.token_log_weight(logp, batch.old_logp, batch.mask)
    valid = batch.mask > 0
    applied = torch.cat([C.m2po_keep(log_w[i:i + 2], batch.mask[i:i + 2], tau) for i in range(0, len(batch.mask), 2)])
    whole = C.m2po_keep(log_w, batch.mask, tau)
    expected = float((valid & ~applied).sum() / valid.sum())
    assert float((valid & ~whole).sum() / valid.sum()) != pytest.approx(expected)  # the example tells the two apart
    assert float(metrics["corr/mask_frac"]) == pytest.approx(expected, rel=1e-6)


def test_weights_sha256_is_the_starting_policys_identity():
    # the same weights give the same digest; one value moved by one ulp, or another seed's weights,
    # give another; a preset from scratch records none (its weights
    # depend on the run's seed, so they are not one starting policy shared by the seeds)
    from respo.train.policy import load_run_policy, weights_sha256

    tok = build_char_tokenizer()
    a, b = build_policy("tiny-dense", tok, seed=0), build_policy("tiny-dense", tok, seed=0)
    assert weights_sha256(a) == weights_sha256(b) and len(weights_sha256(a)) == 64
    assert weights_sha256(build_policy("tiny-dense", tok, seed=1)) != weights_sha256(a)
    with torch.no_grad():
        p = next(b.parameters())
        p.view(-1)[0] = torch.nextafter(p.view(-1)[0], torch.tensor(float("inf")))
    assert weights_sha256(b) != weights_sha256(a)
    scratch = load_run_policy(apply_overrides(TrainConfig(), {"model": "tiny-dense", "warm_start": False}))
    assert "weights_sha256" not in scratch.info
