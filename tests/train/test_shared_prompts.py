"""Each prompt computed once for the responses that share it: the same log-probs and the same gradient as one
forward per row, up to float rounding (per-token |Δ logp| <= 1e-5, ‖g − g_ref‖ / ‖g_ref‖ <= 1e-5 in float32),
in the runtime function, in the old-logp recompute and in the update, with micro-batches that split groups,
with a token budget, with an MoE policy and routing replay, and on SmolLM2-135M-Instruct."""

import copy
from pathlib import Path

import pytest
import torch

import respo.runtime.logprobs as logprobs_mod
from respo.core import group_advantages
from respo.runtime.engines.respo import RespoEngine
from respo.runtime.logprobs import position_ids_from_mask, prompt_groups, shared_prefix_token_logprobs, token_logprobs
from respo.runtime.models import build_policy
from respo.runtime.tasks import get_task
from respo.runtime.tokenizer import build_char_tokenizer
from respo.train.config import Forward, Sampling, apply_overrides
from respo.train.forward import forward_path
from respo.train.policy import Policy
from respo.train.rollout import recompute_logp, sample_rollout
from respo.train.update import UpdateSettings, update_step

from trainer_support import small_cfg

LOGP_TOL, GRAD_TOL = 1e-5, 1e-5
SMOLLM2_LOGP_TOL = 5e-5  # a 30-layer float32 model (the SmolLM2 test says why)


def _grad(model) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def _grouped_batch(vocab: int, *, groups=3, G=4, P=7, T=9, seed=0):
    """``groups`` prompts x G responses, prompts left-padded by 0..2 columns, responses of lengths T, T-1, ..."""
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(3, vocab, (groups, P), generator=g)
    pmask = torch.ones(groups, P, dtype=torch.long)
    for k in range(groups):
        pmask[k, : k % 3] = 0
    ids = torch.cat([prompts.repeat_interleave(G, 0), torch.randint(3, vocab, (groups * G, T), generator=g)], 1)
    mask = torch.cat([pmask.repeat_interleave(G, 0), torch.ones(groups * G, T, dtype=torch.long)], 1)
    for r in range(groups * G):
        mask[r, P + T - r % T:] = 0  # row r has T - r % T response tokens
    return ids * mask, mask, P


def test_prompt_groups_by_hand():
    # rows with prompts [a, a, b, a] (P = 2): the distinct prompts' first rows are 0 and 2, rows 0, 1 and 3 use 0
    ids = torch.tensor([[5, 6, 1], [5, 6, 2], [7, 6, 3], [5, 6, 4]])
    mask = torch.ones_like(ids)
    first, group = prompt_groups(ids, mask, 2)
    assert first.tolist() == [0, 2] and group.tolist() == [0, 0, 1, 0]
    # the same tokens under another left padding are another prompt; no two rows alike: None
    mask2 = torch.tensor([[0, 1, 1], [1, 1, 1]])
    assert prompt_groups(torch.tensor([[0, 6, 1], [5, 6, 1]]), mask2, 2) is None


@pytest.mark.parametrize("preset", ["tiny-dense", "tiny-moe"])
@pytest.mark.parametrize("budget", [None, 40])  # 40 logits elements: the output layer in checkpointed chunks
def test_shared_prefix_matches_one_forward_per_row(preset, budget, monkeypatch):
    tok = build_char_tokenizer()
    model = build_policy(preset, tok, seed=0)
    if budget is not None:
        monkeypatch.setattr(logprobs_mod, "LOGITS_BUDGET", budget * model.config.vocab_size)
    ids, attn, P = _grouped_batch(model.config.vocab_size)
    resp = attn[:, P:].float()  # (B, T)
    out = {}
    for shared in (False, True):
        model.zero_grad()
        if shared:
            first, group = prompt_groups(ids, attn, P)
            logp, ent = shared_prefix_token_logprobs(model, ids, attn, P, first, group, temperature=0.7,
                                                     with_entropy=True)
        else:
            logp, ent = token_logprobs(model, ids, attn, P, temperature=0.7, with_entropy=True)
        (logp * resp * torch.linspace(-1, 1, ids.shape[0]).unsqueeze(1)).sum().backward()  # signed row weights
        out[shared] = (logp.detach(), ent, _grad(model))
    m = resp.bool()
    assert (out[True][0] - out[False][0])[m].abs().max() <= LOGP_TOL
    assert (out[True][1] - out[False][1])[m].abs().max() <= LOGP_TOL
    assert _rel(out[True][2], out[False][2]) <= GRAD_TOL
    assert out[False][2].norm() > 0


def _rollout(policy, task, pool, cfg, prompts):
    engine = RespoEngine(policy.model, policy.tokenizer, dtype=cfg.dtype)
    batch, _ = sample_rollout(engine, task, pool, list(range(prompts)), Sampling.of(cfg), torch.Generator().manual_seed(0), 0)
    batch.adv = group_advantages(batch.rewards, cfg.group_size, kind=cfg.adv_kind)  # (S,)
    return batch


@pytest.mark.parametrize("model_name,extra", [
    ("tiny-dense", {"micro_batch": 0}),
    ("tiny-dense", {"micro_batch": 3}),  # micro-batches of 3 rows cut groups of 4: a prompt is run once per piece
    ("tiny-dense", {"micro_batch_tokens": 60}),
    ("tiny-moe", {"micro_batch": 4}),
    ("tiny-moe", {"micro_batch": 4, "routing_replay": True}),
])
def test_recompute_and_update_match_one_forward_per_row(model_name, extra):
    # the same rollout and the same weights scored both ways: old_logp within 1e-5 per token; a stale update
    # (the weights moved once, then a GRPO step on the rollout) gives the same gradient and metrics.
    tok = build_char_tokenizer()
    model = build_policy(model_name, tok, seed=0)
    task = get_task("addition", overlong=(12, 11))
    pool = task.examples("train", 16, 0)
    cfg = small_cfg(model=model_name, objective="grpo", prompts=3, grad_clip=0.0, **extra)
    policy = Policy(model, tok, {})
    batch = _rollout(policy, task, pool, cfg, cfg.prompts)
    with torch.no_grad():  # another policy than the one that sampled, so the ratios are not all 1
        for p in model.parameters():
            p.add_(1e-2 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    res = {}
    for shared in (False, True):
        c = apply_overrides(cfg, {"share_prompts": shared})
        assert forward_path(model, Forward.of(c)) == ("shared prompts" if shared else "one forward per row (share_prompts is off)")
        old = recompute_logp(model, batch, Forward.of(c), mini_batch=c.mini_batch_seqs)  # (S, T)
        b = copy.copy(batch)
        b.old_logp = old
        m = copy.deepcopy(model)
        opt = torch.optim.SGD(m.parameters(), lr=0.0)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda u: 1.0)
        metrics, _ = update_step(m, opt, sched, b, UpdateSettings.of(c))
        res[shared] = (old, _grad(m), metrics)
    mask = batch.mask.bool()
    assert (res[True][0] - res[False][0])[mask].abs().max() <= LOGP_TOL
    assert _rel(res[True][1], res[False][1]) <= GRAD_TOL
    for key in ("loss", "entropy", "log_w/p10", "kl_k3"):
        assert torch.allclose(torch.as_tensor(res[True][2][key]), torch.as_tensor(res[False][2][key]), atol=1e-5), key
    if extra.get("routing_replay"):
        assert float(res[True][2]["router_shift"]) == float(res[False][2]["router_shift"])


def test_forward_path_names_each_fallback():
    tok = build_char_tokenizer()
    model = build_policy("tiny-dense", tok, seed=0)
    assert forward_path(model, Forward.of(small_cfg(group_size=1))) == "one forward per row (group_size 1: no two rows share a prompt)"
    assert forward_path(model, Forward.of(small_cfg(compile=True))) == "one forward per row (compile is on)"
    assert forward_path(model, Forward.of(small_cfg())) == "shared prompts"


def test_rows_without_a_shared_prompt_take_one_forward_per_row():
    # a micro-batch of one row per prompt has nothing to share: the unshared path runs, bitwise
    tok = build_char_tokenizer()
    model = build_policy("tiny-dense", tok, seed=0)
    task = get_task("addition", overlong=(12, 11))
    cfg = small_cfg(micro_batch=1, prompts=1, group_size=2)
    batch = _rollout(Policy(model, tok, {}), task, task.examples("train", 4, 0), cfg, 1)
    a = recompute_logp(model, batch, Forward.of(cfg), mini_batch=cfg.mini_batch_seqs)
    b = recompute_logp(model, batch, Forward.of(apply_overrides(cfg, {"share_prompts": False})), mini_batch=cfg.mini_batch_seqs)
    assert torch.equal(a, b)


def test_smollm2_shared_prefix_matches_one_forward_per_row():
    """SmolLM2-135M-Instruct (30 layers, grouped-query attention, a 49,152-token vocabulary): two chat prompts of
    different lengths (so one is left-padded) x 3 responses of 5-12 tokens."""
    from respo.runtime.packaged import resolve_packaged
    from respo.runtime.pretrained_sft import load_pretrained
    CACHE, NAME = Path(__file__).resolve().parents[2] / ".cache" / "respo", "smollm2-135m-instruct"

    model, tok = load_pretrained(resolve_packaged(NAME, CACHE))
    model.train()
    prompts = [tok.apply_chat_template([{"role": "user", "content": c}], tokenize=False, add_generation_prompt=True)
               for c in ("What is 12 + 35?", "Add 481 and 23, then say the answer in words.")]
    enc = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    P, T = max(len(e) for e in enc), 13
    ids = torch.tensor([[tok.pad_token_id] * (P - len(e)) + e for e in enc for _ in range(3)])  # (6, P)
    attn = (torch.arange(P) >= torch.tensor([P - len(e) for e in enc for _ in range(3)]).unsqueeze(1)).long()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # responses the model samples (temperature 1), so the log-probs are the ones training sees
        for _ in range(T):
            logits = model(input_ids=ids, attention_mask=attn, position_ids=position_ids_from_mask(attn)).logits[:, -1]
            nxt = torch.multinomial(torch.softmax(logits, -1), 1, generator=g)  # (6, 1)
            ids, attn = torch.cat([ids, nxt], 1), torch.cat([attn, torch.ones_like(nxt)], 1)
    for r in range(6):  # responses of 13, 11, 9, ... tokens: right padding after each
        n = T - 2 * (r % 3) - r // 3
        attn[r, P + n:] = 0
    ids = ids * attn + tok.pad_token_id * (1 - attn)
    resp_mask = attn[:, P:].float()
    out = {}
    for shared in (False, True):
        model.zero_grad()
        if shared:
            first, group = prompt_groups(ids, attn, P)
            assert first.tolist() == [0, 3]
            logp, _ = shared_prefix_token_logprobs(model, ids, attn, P, first, group)
        else:
            logp, _ = token_logprobs(model, ids, attn, P)
        (logp * resp_mask * torch.tensor([1.0, -0.5, 0.3, -1.0, 0.7, 0.2]).unsqueeze(1)).sum().backward()
        out[shared] = (logp.detach(), _grad(model))
    m = resp_mask.bool()
    # 30 float32 layers: the shared path attends to the prompt's cached keys and values, one forward per row to
    # the same keys computed in its own pass, so the sums run in another order. Measured: under 1e-5 on an AVX2
    # CPU, 1.1e-5 on an AVX-512 one (the KV-cached sampler differs from a full forward by 3e-5 on the same tokens);
    # attending to the left padding instead moves the padded rows' log-probs by up to 1.9
    assert (out[True][0] - out[False][0])[m].abs().max() <= SMOLLM2_LOGP_TOL
    assert _rel(out[True][1], out[False][1]) <= GRAD_TOL


def test_response_pieces_by_hand():
    from respo.runtime.logprobs import response_pieces

    # lengths [10, 2, 9, 3]: one piece is 4 x 10 = 40 columns; the longer half (rows 0, 2) at 10 and the shorter
    # (rows 3, 1) at 3 cost 20 + 6 = 26, a 35 % saving (>= 10 %): two pieces
    pieces = response_pieces(torch.tensor([10, 2, 9, 3]))
    assert [(rows.tolist(), t) for rows, t in pieces] == [([0, 2], 10), ([3, 1], 3)]
    # lengths [10, 9, 10, 9]: two pieces would cost 20 + 18 = 38 of 40, a 5 % saving: one piece
    assert [(rows.tolist(), t) for rows, t in response_pieces(torch.tensor([10, 9, 10, 9]))] == [([0, 1, 2, 3], 10)]
    assert [(rows.tolist(), t) for rows, t in response_pieces(torch.tensor([4]))] == [([0], 4)]
