"""respo inside TRL: RespoGRPOTrainer trains a tiny local model on the CPU, and its loss on fixed
inputs is the core's ``policy_loss`` (float64), with TRL's vLLM importance-sampling ratio folded
into log W in log space. TRL's own ``vespo`` is cross-checked against the core's ``vespo``.

The model is a tiny Qwen3 built from a config and the tokenizer a character vocabulary built
locally (respo.runtime), saved with ``save_pretrained`` so TRL loads them from a path.
"""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

import respo  # noqa: E402
from respo.integrations.trl import (  # noqa: E402
    RespoGRPOConfig,
    RespoGRPOTrainer,
    fold_importance_sampling_ratio,
    objective_for,
)
from respo.runtime.models import build_policy  # noqa: E402
from respo.runtime.tokenizer import build_char_tokenizer  # noqa: E402

TINY = dict(num_hidden_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=16)


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tokenizer):
    path = tmp_path_factory.mktemp("tiny-qwen3")
    build_policy("tiny-dense", tokenizer, seed=0, **TINY).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def prompts_dataset():
    return datasets.Dataset.from_dict({"prompt": ["12+34=", "5+6=", "70+8=", "1+1=", "9+9=", "3+40="]})


def length_reward(completions, **kwargs):
    """+1 for completions of at least 4 characters, −1 otherwise (varies within a group)."""
    return [1.0 if len(c) >= 4 else -1.0 for c in completions]


def config(tmp_path, **overrides) -> RespoGRPOConfig:
    base = dict(
        output_dir=str(tmp_path / "out"),
        loss_type="respo",
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=6,
        learning_rate=1e-2,
        beta=0.0,
        report_to=[],
        logging_steps=1,
        use_cpu=True,
        bf16=False,
        save_strategy="no",
        seed=0,
        disable_tqdm=True,
    )
    base.update(overrides)
    return RespoGRPOConfig(**base)


def test_loss_type_routing():
    assert objective_for("respo") == "respo" and objective_for("gspo") == "gspo"
    assert objective_for("respo_vespo") == "vespo" and objective_for("respo_grpo") == "grpo"
    assert objective_for("vespo") is None and objective_for("dapo") is None  # TRL's own
    assert objective_for("m2po") == "m2po" and objective_for("decoupled") == "decoupled"  # TRL lacks them


def test_bad_hyperparameters_fail_at_config_time(tmp_path):
    with pytest.raises(ValueError, match="beta"):
        config(tmp_path, respo_pos=[2.0, 0.0, 2.0])
    with pytest.raises(ValueError, match="unknown hyperparameter"):
        config(tmp_path, loss_type="reshaped", respo_hparams={"pos": [1, 1, 1]})
    with pytest.raises(ValueError, match="respo_loss_agg_mode"):
        config(tmp_path, respo_loss_agg_mode="mean")


def test_trains_two_steps_on_stale_samples_and_logs_diagnostics(tmp_path, model_dir, tokenizer):
    # steps_per_generation = 2 > grad accumulation 1: the second step trains on samples of the
    # policy before the first update, so TRL computes old_per_token_logps and W != 1.
    args = config(tmp_path, max_steps=2, steps_per_generation=2)
    trainer = RespoGRPOTrainer(
        model=model_dir, reward_funcs=length_reward, args=args, train_dataset=prompts_dataset(), processing_class=tokenizer
    )
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    steps = [h for h in trainer.state.log_history if "loss" in h]
    assert len(steps) == 2
    assert all(math.isfinite(h["loss"]) for h in steps)
    assert any(h["grad_norm"] > 0 for h in steps)
    changed = sum(not torch.equal(before[n], p.detach()) for n, p in trainer.model.named_parameters())
    assert changed > 0
    for key in ("respo/log_w/p10", "respo/frac_starved", "respo/coef_mean", "respo/ess_w", "entropy"):
        assert all(key in h for h in steps), key
    # the second step is off-policy: its weights moved away from W = 1
    assert steps[1]["respo/log_w/max"] - steps[1]["respo/log_w/min"] > 0


def fixed_inputs(tokenizer, B=4, T=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    # equal-length prompts: no left padding, so no fully masked attention row (NaN in eager backward)
    enc = tokenizer(["12+34=", "56+78=", "90+12=", "34+56="][:B], return_tensors="pt", padding=True)
    completion_ids = torch.randint(4, len(tokenizer), (B, T), generator=g)
    lengths = torch.tensor([T, 3, 1, 4])[:B]
    completion_mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
    return {
        "prompt_ids": enc["input_ids"],
        "prompt_mask": enc["attention_mask"],
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": torch.tensor([1.2, -0.8, 0.5, -1.5], dtype=torch.float64)[:B],
    }


def reference_logp(model, inputs):
    """log π(completion tokens) from a plain forward: logits at positions P-1 .. L-2."""
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    att = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    T = inputs["completion_ids"].size(1)
    logits = model(input_ids=ids, attention_mask=att).logits[:, -T - 1 : -1]  # (B, T, V)
    return torch.log_softmax(logits.double(), dim=-1).gather(-1, inputs["completion_ids"].unsqueeze(-1)).squeeze(-1)


@pytest.fixture(scope="module")
def fp64_trainer(tmp_path_factory, tokenizer):
    model = build_policy("tiny-dense", tokenizer, seed=1, dtype=torch.float64, attn_implementation="eager", **TINY)
    args = config(tmp_path_factory.mktemp("fp64"), gradient_accumulation_steps=2, steps_per_generation=4)
    trainer = RespoGRPOTrainer(
        model=model, reward_funcs=length_reward, args=args, train_dataset=prompts_dataset(), processing_class=tokenizer
    )
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 2  # what Trainer.train() sets for each accumulation window
    return trainer


def _with_stale_old_logp(trainer, inputs, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        logp = reference_logp(trainer.model, inputs)
    inputs["old_per_token_logps"] = logp + 0.8 * torch.randn(logp.shape, generator=g, dtype=torch.float64)
    inputs["num_items_in_batch"] = torch.tensor(37.0, dtype=torch.float64)  # tokens of the whole generation batch
    return inputs


@pytest.mark.parametrize("ratio_shape", [None, "token", "sequence"])
def test_loss_on_fixed_inputs_equals_core(fp64_trainer, tokenizer, ratio_shape):
    trainer = fp64_trainer
    inputs = _with_stale_old_logp(trainer, fixed_inputs(tokenizer))
    mask = inputs["completion_mask"].double()
    g = torch.Generator().manual_seed(2)
    log_rho = None
    if ratio_shape == "token":
        ratio = torch.exp(0.3 * torch.randn(mask.shape, generator=g, dtype=torch.float64))
        inputs["importance_sampling_ratio"] = ratio
        log_rho = torch.log(ratio)  # Σ_t m·log ρ_it
    elif ratio_shape == "sequence":
        ratio = torch.exp(0.5 * torch.randn(mask.shape[0], 1, generator=g, dtype=torch.float64))
        inputs["importance_sampling_ratio"] = ratio
        log_rho = torch.log(ratio).expand_as(mask) / mask.sum(-1, keepdim=True)  # once per sequence

    trainer.model.zero_grad()
    loss = trainer._compute_loss(trainer.model, inputs)
    loss.backward()
    grad = trainer.model.lm_head.weight.grad.clone() if trainer.model.lm_head.weight.grad is not None else None

    # The core on the same inputs: token-mean over the accumulation window as TRL's dapo does:
    # 37 tokens per generation batch / 1 process · 2 accumulation steps / 4 steps per generation.
    trainer.model.zero_grad()
    logp = reference_logp(trainer.model, inputs)
    core, _ = respo.policy_loss(
        "respo", logp, inputs["old_per_token_logps"], inputs["advantages"], mask,
        rollout_log_ratio=log_rho, global_tokens=37.0 * 2 / 4,
    )  # fmt: skip
    core.backward()
    # TRL's fused LM head computes log-probs in float32 even for a float64 model, so the match is
    # at float32 precision; the core side is float64.
    assert abs(loss.item() - core.item()) < 1e-6 * max(1.0, abs(core.item())), (loss.item(), core.item())
    ref_grad = trainer.model.lm_head.weight.grad
    assert grad is not None and torch.allclose(grad.double(), ref_grad, rtol=1e-5, atol=1e-7)
    if ratio_shape is not None:
        plain, _ = respo.policy_loss(
            "respo", logp, inputs["old_per_token_logps"], inputs["advantages"], mask, global_tokens=18.5
        )
        assert abs(plain.item() - core.item()) > 1e-6  # the ratio matters


def test_sequence_ratio_fold_by_hand():
    # One row, 3 tokens, sequence ratio 2: log ρ_t = ln2/3 each, summing to ln 2 (not 3·ln 2).
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    log_rho, kept = fold_importance_sampling_ratio(torch.tensor([[2.0]]), mask)
    assert torch.allclose(log_rho, torch.tensor([[1.0, 1.0, 1.0, 0.0]]) * math.log(2) / 3)
    assert torch.equal(kept, mask)
    # token_mask mode: rejected tokens (ratio 0) leave the objective
    log_rho, kept = fold_importance_sampling_ratio(torch.tensor([[1.5, 0.0, 1.0, 9.0]]), mask)
    assert torch.equal(kept, torch.tensor([[1.0, 0.0, 1.0, 0.0]]))
    assert log_rho[0, 0].item() == pytest.approx(math.log(1.5)) and log_rho[0, 3].item() == 0.0
    with pytest.raises(ValueError, match="1 row"):
        fold_importance_sampling_ratio(torch.tensor([[1.0, -1.0, 1.0, 1.0]]), mask)


def test_trls_own_vespo_matches_cores_vespo(fp64_trainer, tokenizer):
    # Cross-check: TRL's built-in loss_type="vespo" and respo's "respo_vespo" on the same inputs
    # (same normaliser: TRL's vespo uses the dapo token count).
    trainer = fp64_trainer
    inputs = _with_stale_old_logp(trainer, fixed_inputs(tokenizer), seed=3)
    ours = trainer._compute_loss(trainer.model, inputs)
    saved = trainer.loss_type, trainer.respo_objective, trainer.respo_hparams
    try:
        trainer.loss_type, trainer.respo_objective, trainer.respo_hparams = "respo_vespo", "vespo", {}
        core_vespo = trainer._compute_loss(trainer.model, inputs)
        trainer.loss_type, trainer.respo_objective = "vespo", None
        trl_vespo = trainer._compute_loss(trainer.model, inputs)
    finally:
        trainer.loss_type, trainer.respo_objective, trainer.respo_hparams = saved
    assert abs(core_vespo.item() - trl_vespo.item()) < 1e-6 * max(1.0, abs(trl_vespo.item()))  # float32 log-probs
    assert abs(ours.item() - trl_vespo.item()) > 1e-6  # respo is not vespo


def test_the_core_objective_is_built_once_not_per_micro_batch(fp64_trainer, tokenizer, monkeypatch):
    trainer = fp64_trainer
    built = []
    real = respo.build_objective
    monkeypatch.setattr(respo, "build_objective", lambda name, **hp: built.append(name) or real(name, **hp))
    saved = trainer.respo_objective, trainer.respo_hparams, trainer._respo_built
    trainer._respo_built = None
    inputs = _with_stale_old_logp(trainer, fixed_inputs(tokenizer), seed=3)
    try:
        first = trainer._compute_loss(trainer.model, inputs)
        second = trainer._compute_loss(trainer.model, inputs)
        assert built == [trainer.respo_objective]  # two micro-batches, one build
        assert torch.equal(first, second)
        # reassigning the objective is honoured: one more build, another loss
        trainer.respo_objective, trainer.respo_hparams = "vespo", {}
        third = trainer._compute_loss(trainer.model, inputs)
        assert built[1:] == ["vespo"] and abs(third.item() - first.item()) > 1e-6
    finally:
        trainer.respo_objective, trainer.respo_hparams, trainer._respo_built = saved


def _as(trainer, loss_type, objective, hparams, inputs, **attrs):
    """``trainer._compute_loss`` with another loss type (and TRL attributes) on the same inputs."""
    saved = {k: getattr(trainer, k) for k in ("loss_type", "respo_objective", "respo_hparams", *attrs)}
    try:
        trainer.loss_type, trainer.respo_objective, trainer.respo_hparams = loss_type, objective, hparams
        for k, v in attrs.items():
            setattr(trainer, k, v)
        return trainer._compute_loss(trainer.model, inputs)
    finally:
        for k, v in saved.items():
            setattr(trainer, k, v)


@pytest.mark.parametrize("objective, hparams", [("m2po", {"tau": 0.3}), ("decoupled", {"cap": 3.0})])
def test_m2po_and_decoupled_which_trl_lacks_equal_the_core(fp64_trainer, tokenizer, objective, hparams):
    # In TRL one optimizer step sees one accumulation window, so decoupled's π_prox is the current policy
    # (the core's default when prox_logp is left out). Same normaliser as the other respo losses (37·2/4).
    trainer = fp64_trainer
    loss, grad, core, metrics = _trainer_and_core(trainer, tokenizer, objective, hparams, seed=5)
    assert 0 < metrics["corr/mask_frac"].item() < 1  # the correction silences some tokens here
    assert abs(loss.item() - core.item()) < 1e-6 * max(1.0, abs(core.item())), (loss.item(), core.item())
    assert torch.allclose(grad.double(), trainer.model.lm_head.weight.grad, rtol=1e-5, atol=1e-7)
    assert "respo/corr/mask_frac" in trainer._metrics["train"]


def _trainer_and_core(trainer, tokenizer, objective, hparams, seed, **core_kw):
    """The trainer's loss for ``objective`` and its lm_head gradient, then the core's loss on a plain forward
    (its gradient left in the model) with TRL's normaliser (37 tokens of the generation batch · 2/4)."""
    inputs = _with_stale_old_logp(trainer, fixed_inputs(tokenizer), seed=seed)
    trainer.model.zero_grad()
    loss = _as(trainer, objective, objective, hparams, inputs)
    loss.backward()
    grad = trainer.model.lm_head.weight.grad.clone()
    trainer.model.zero_grad()
    logp = reference_logp(trainer.model, inputs)
    mask = inputs["completion_mask"].double()
    core, metrics = respo.policy_loss(objective, logp, inputs["old_per_token_logps"], inputs["advantages"], mask,
                                      global_tokens=37.0 * 2 / 4, **core_kw, **hparams)  # fmt: skip
    core.backward()
    return loss, grad, core, metrics


def test_respo_opsm_equals_trls_own_off_policy_masking(fp64_trainer, tokenizer):
    # TRL's native OPSM: loss_type="dapo" (PPO clip ε = 0.2, no dual clip) with off_policy_mask_threshold = δ,
    # its KL from old_per_token_logps (no vLLM). respo's "opsm" on the same inputs: the same loss.
    trainer = fp64_trainer
    inputs = _with_stale_old_logp(trainer, fixed_inputs(tokenizer), seed=6)
    delta = 0.3
    trl = _as(trainer, "dapo", None, {}, inputs, off_policy_mask_threshold=delta, epsilon_low=0.2, epsilon_high=0.2)
    ours = _as(trainer, "opsm", "opsm", {"delta": delta}, inputs)
    unmasked = _as(trainer, "opsm", "opsm", {"delta": 1e9}, inputs)
    assert abs(ours.item() - trl.item()) < 1e-6 * max(1.0, abs(trl.item())), (ours.item(), trl.item())
    assert abs(ours.item() - unmasked.item()) > 1e-6  # δ drops a sequence on these inputs


# ------------------------------------------------------------------------------------------------
# LUSPO against TRL's own; DPPO, KL rejection and batch-normalised TIS, which TRL lacks, equal the core
# ------------------------------------------------------------------------------------------------


def test_respo_luspo_equals_trls_own_luspo(fp64_trainer, tokenizer):
    # TRL's loss_type="luspo" with importance_sampling_level="sequence" (the paper's setup): GSPO's clip of
    # exp(mean_t log r) times each sequence's length, mean over the B rows, / accumulation steps. respo's
    # "respo_luspo" on the same inputs: seq-mean-token-sum over B·accum sequences. Value and gradient, 1e-6.
    trainer = fp64_trainer
    inputs = _with_stale_old_logp(trainer, fixed_inputs(tokenizer), seed=7)
    trainer.model.zero_grad()
    trl = _as(trainer, "luspo", None, {}, inputs, importance_sampling_level="sequence", epsilon_low=0.2, epsilon_high=0.2)
    trl.backward()
    trl_grad = trainer.model.lm_head.weight.grad.clone()
    trainer.model.zero_grad()
    ours = _as(trainer, "respo_luspo", "luspo", {}, inputs)
    ours.backward()
    assert objective_for("respo_luspo") == "luspo" and objective_for("luspo") is None  # TRL's own stays TRL's
    assert abs(ours.item() - trl.item()) < 1e-6 * max(1.0, abs(trl.item())), (ours.item(), trl.item())
    assert torch.allclose(trainer.model.lm_head.weight.grad, trl_grad, rtol=1e-6, atol=1e-9)
    gspo = _as(trainer, "respo_gspo", "gspo", {"clip_ratio_low": 0.2, "clip_ratio_high": 0.2}, inputs)
    assert abs(gspo.item() - ours.item()) > 1e-6  # the length scaling matters on these inputs


@pytest.mark.parametrize("delta", [1.5, 1.1])  # above 1 + ε (a dual clip at δ) and below it
def test_two_sided_equals_trls_own_delta_clipping(fp64_trainer, tokenizer, delta):
    # TRL 1.16's own two-sided clip: loss_type="dapo" (ε = 0.2, its token-mean over the accumulation window) with
    # GRPOConfig.delta = δ, run by TRL's _compute_loss. respo's "two_sided" on the same inputs, value and gradient.
    trainer = fp64_trainer
    inputs = _with_stale_old_logp(trainer, fixed_inputs(tokenizer), seed=9)
    saved = trainer.args.delta
    try:
        trainer.args.delta = delta
        trainer.model.zero_grad()
        trl = _as(trainer, "dapo", None, {}, inputs, epsilon_low=0.2, epsilon_high=0.2)
        trl.backward()
        trl_grad = trainer.model.lm_head.weight.grad.clone()
        trainer.args.delta = None
        plain = _as(trainer, "dapo", None, {}, inputs, epsilon_low=0.2, epsilon_high=0.2)
    finally:
        trainer.args.delta = saved
    trainer.model.zero_grad()
    ours = _as(trainer, "two_sided", "two_sided", {"delta": delta}, inputs)
    ours.backward()
    assert objective_for("two_sided") == "two_sided"
    assert abs(ours.item() - trl.item()) < 1e-6 * max(1.0, abs(trl.item())), (ours.item(), trl.item())
    assert torch.allclose(trainer.model.lm_head.weight.grad, trl_grad, rtol=1e-5, atol=1e-7)  # TRL's float32 log-probs
    assert abs(plain.item() - trl.item()) > 1e-6  # δ acts on these inputs


@pytest.mark.parametrize("objective, hparams, key", [
    ("dppo_tv", {"delta_low": 0.02, "delta_high": 0.02}, "corr/masked_tokens"),
    ("dppo_kl", {"delta_low": 0.01, "delta_high": 0.01}, "corr/masked_tokens"),
    ("klrs", {"agg": "token", "estimator": "k2", "threshold": 0.1, "base": "grpo"}, "rs/masked_tokens"),
    ("tis", {"batch_normalize": True, "level": "token"}, "corr/batch_norm_factor"),
])  # fmt: skip
def test_objectives_trl_lacks_equal_the_core(fp64_trainer, tokenizer, objective, hparams, key):
    trainer = fp64_trainer
    assert objective_for(objective) == objective
    loss, grad, core, metrics = _trainer_and_core(trainer, tokenizer, objective, hparams, seed=8, global_seqs=4 * 2)
    assert abs(loss.item() - core.item()) < 1e-6 * max(1.0, abs(core.item())), (loss.item(), core.item())
    assert torch.allclose(grad.double(), trainer.model.lm_head.weight.grad, rtol=1e-5, atol=1e-7)
    if key != "corr/batch_norm_factor":
        assert 0 < metrics[key].item() < 1  # the correction acts on these inputs
    assert f"respo/{key}" in trainer._metrics["train"]


def test_the_loglinear_proximal_policy_is_refused_in_trl(tmp_path):
    with pytest.raises(ValueError, match="prox_method='loglinear' needs each token's policy version"):
        config(tmp_path, loss_type="decoupled", respo_hparams={"prox_method": "loglinear"})
    with pytest.raises(ValueError, match="prox_method='loglinear' needs each token's policy version"):
        config(tmp_path, loss_type="klrs", respo_hparams={"base": "decoupled", "base_kwargs": {"prox_method": "loglinear"}})


def test_config_parses_from_the_command_line():
    # TRL's scripts parse configs with HfArgumentParser; respo's fields go through it.
    from transformers import HfArgumentParser

    (args,) = HfArgumentParser(RespoGRPOConfig).parse_args_into_dataclasses(
        ["--output_dir", "/tmp/respo-cli", "--use_cpu", "true", "--loss_type", "reshaped",
         "--respo_hparams", '{"pos_kernel": "respo(2,0.5,2)", "neg_kernel": "vespo(3,2)"}']
    )  # fmt: skip
    assert args.objective_hparams() == {"pos_kernel": "respo(2,0.5,2)", "neg_kernel": "vespo(3,2)"}
    (args,) = HfArgumentParser(RespoGRPOConfig).parse_args_into_dataclasses(
        ["--output_dir", "/tmp/respo-cli", "--use_cpu", "true", "--respo_pos", "2", "0.25", "4"]
    )
    assert args.loss_type == "dapo" and args.objective_hparams() == {}  # TRL's default loss stays TRL's
    args.loss_type = "respo"
    assert args.objective_hparams() == {"pos": (2.0, 0.25, 4.0), "neg": (1.0, 0.5, 2.0)}
