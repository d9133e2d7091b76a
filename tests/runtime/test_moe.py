"""Router recording, routing replay and router-shift diagnostics on tiny random MoE models.

Every test builds its models from a config (no hub): hidden 32, 2 layers, 6 experts, top-2,
for the three supported families (Qwen3-MoE, Qwen2-MoE with a shared expert, Mixtral).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import (
    AutoModelForCausalLM,
    MixtralConfig,
    Qwen2MoeConfig,
    Qwen3Config,
    Qwen3MoeConfig,
)

from respo.core import load_balance, missing_index, moe_metrics, router_shift
from respo.runtime.moe import (
    find_moe_layers,
    is_moe,
    routing_replay,
    RoutingRecorder,
)

FAMILIES = ["qwen3_moe", "qwen2_moe", "mixtral"]
V, E, K = 32, 6, 2
_COMMON = dict(
    vocab_size=V,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=64,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    tie_word_embeddings=True,
)


def make_config(family: str, **overrides):
    if family == "qwen3_moe":
        kw = dict(num_experts=E, num_experts_per_tok=K, moe_intermediate_size=16, norm_topk_prob=True)
        return Qwen3MoeConfig(**{**_COMMON, **kw, **overrides})
    if family == "qwen2_moe":
        # norm_topk_prob=False: the un-renormalised branch is exercised here.
        kw = dict(
            num_experts=E,
            num_experts_per_tok=K,
            moe_intermediate_size=16,
            shared_expert_intermediate_size=16,
            norm_topk_prob=False,
        )
        return Qwen2MoeConfig(**{**_COMMON, **kw, **overrides})
    if family == "mixtral":
        return MixtralConfig(**{**_COMMON, "num_local_experts": E, "num_experts_per_tok": K, **overrides})
    raise KeyError(family)


def make_model(family: str, seed: int = 0, **overrides):
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(make_config(family, **overrides)).eval()


def response_logp(model, ids: torch.Tensor) -> torch.Tensor:
    """log pi(ids[:, t] | ids[:, :t]) for t >= 1, (B, L-1)."""
    logits = model(ids).logits[:, :-1].float()  # (B, L-1, V)
    return torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)


def shift_routing(model, ids: torch.Tensor, steps: int = 3, lr: float = 0.05) -> None:
    """A few AdamW steps on the sequence NLL with a large lr: moves every router."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    for _ in range(steps):
        loss = -response_logp(model, ids).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()


def ids_batch(B: int = 3, L: int = 12, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, V, (B, L), generator=g)


# ------------------------------------------------------------------------------------------
# Discovery and errors
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_recording_matches_router_logits_topk(family):
    """The recorded indices are the top-k of transformers' own ``router_logits`` output."""
    model = make_model(family)
    ids = ids_batch()
    with RoutingRecorder(model) as rec:
        out = model(ids, output_router_logits=True)
    routing = rec.routing()  # (B, L, n_layers, k)
    assert routing.shape == (3, 12, 2, K) and routing.dtype == torch.uint8
    assert rec.num_experts == E and rec.n_layers == 2
    for layer, logits in enumerate(out.router_logits):  # (B*L, E) each
        expected = logits.topk(K, dim=-1).indices.sort(-1).values.reshape(3, 12, K)
        assert torch.equal(routing[:, :, layer].long().sort(-1).values, expected)


def test_only_moe_layers_are_counted():
    """Qwen3-MoE with ``mlp_only_layers=[0]``: layer 0 is a dense MLP, one MoE layer remains."""
    model = make_model("qwen3_moe", mlp_only_layers=[0])
    assert [layer.name for layer in find_moe_layers(model)] == ["model.layers.1.mlp"]
    with RoutingRecorder(model) as rec:
        model(ids_batch())
    assert rec.routing().shape == (3, 12, 1, K)


def test_unsupported_model_raises_clear_error():
    dense = AutoModelForCausalLM.from_config(
        Qwen3Config(**{k: v for k, v in _COMMON.items()})
    )
    assert not is_moe(dense) and is_moe(make_model("mixtral"))
    with pytest.raises(ValueError, match=r"Qwen3ForCausalLM.*not a supported MoE model.*qwen3_moe"):
        RoutingRecorder(dense)
    with pytest.raises(ValueError, match="not a supported MoE model"):
        routing_replay(dense, torch.zeros(1, 4, 2, K, dtype=torch.uint8))
    with pytest.raises(ValueError, match="not a supported MoE model"):
        RoutingRecorder(torch.nn.Linear(3, 3))


def test_bad_routing_is_rejected_with_row_counts():
    model = make_model("qwen3_moe")
    ids = ids_batch()
    with RoutingRecorder(model) as rec:
        model(ids)
    routing = rec.routing()
    with pytest.raises(ValueError, match=r"n_layers=2, k=2"):
        routing_replay(model, routing[:, :, :1])
    bad = routing.clone()
    bad[1, 3, 0, 0] = E  # expert 6 does not exist; one row affected
    with pytest.raises(ValueError, match=r"outside \[0, 6\) in 1 of 3 rows"):
        routing_replay(model, bad)
    with pytest.raises(ValueError, match="replay_weights=True needs the recorded weights"):
        routing_replay(model, routing, replay_weights=True)
    with pytest.raises(ValueError, match="rows must match"):
        with routing_replay(model, routing[:2]):
            model(ids)


# ------------------------------------------------------------------------------------------
# Replay
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_replay_with_unchanged_weights_is_a_no_op(family):
    """Nothing moved: replay gives the plain log-probs and the plain gradients."""
    model = make_model(family)
    ids = ids_batch()
    with RoutingRecorder(model, record_weights=True) as rec:
        plain = response_logp(model, ids)  # (B, L-1)
    routing, weights = rec.routing(), rec.weights()

    plain.sum().backward()
    plain_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()

    with routing_replay(model, routing) as rp:
        replayed = response_logp(model, ids)
        replayed.sum().backward()
    # gather(softmax, recorded idx) equals topk's values exactly, so this is bitwise.
    assert torch.equal(replayed, plain)
    assert torch.equal(rp.router_routing(), routing)
    for name, p in model.named_parameters():
        # The router gradient flows through gather instead of topk: same maths.
        torch.testing.assert_close(p.grad, plain_grads[name], rtol=1e-5, atol=1e-7, msg=name)
    model.zero_grad()

    with routing_replay(model, routing, weights=weights, replay_weights=True):
        replayed_w = response_logp(model, ids)
        replayed_w.sum().backward()
    torch.testing.assert_close(replayed_w, plain, rtol=0, atol=1e-6)
    # Replayed weights are constants: no gradient reaches the routers.
    for layer in find_moe_layers(model):
        assert layer.router.weight.grad is None or not layer.router.weight.grad.any()


@pytest.mark.parametrize("family", FAMILIES)
def test_replay_pins_experts_after_updates(family):
    """After updates that move the routers, replay routes exactly as recorded; without it
    some tokens change experts."""
    model = make_model(family)
    ids = ids_batch(B=4, L=16)
    with RoutingRecorder(model) as rec:
        logp_old = response_logp(model, ids).detach()
    recorded = rec.routing()

    shift_routing(model, ids)

    with RoutingRecorder(model) as rec_free:
        logp_free = response_logp(model, ids)
    free = rec_free.routing()
    shift_free = router_shift(recorded, free)
    assert shift_free.overall > 0 and shift_free.any_layer > 0

    with routing_replay(model, recorded) as rp, RoutingRecorder(model) as rec_replay:
        logp_replay = response_logp(model, ids)
        logp_replay.sum().backward()
    replayed = rec_replay.routing()  # what the experts modules actually received
    shift_replay = router_shift(recorded, replayed)
    assert shift_replay.overall == 0 and shift_replay.any_layer == 0
    assert shift_replay.overlap == 1 and shift_replay.tokens == 4 * 16
    assert torch.equal(replayed, recorded)
    # Replay changes the computation (and not to the old policy: the weights moved).
    assert not torch.allclose(logp_replay, logp_free)
    assert not torch.allclose(logp_replay, logp_old)
    # The gating weights stay differentiable in the current routers.
    for layer in find_moe_layers(model):
        assert layer.router.weight.grad is not None and layer.router.weight.grad.abs().sum() > 0
    # The router's own choice in layer 0 sees the same input with or without replay.
    natural = rp.router_routing()
    assert torch.equal(natural[:, :, 0], free[:, :, 0])


def test_replay_off_is_the_plain_model_bitwise():
    """Entering and leaving the contexts leaves no trace: the model equals an untouched twin."""
    model, twin = make_model("qwen3_moe"), make_model("qwen3_moe")
    ids = ids_batch()
    with RoutingRecorder(model) as rec:
        model(ids)
    other = rec.routing().clone()
    other[..., 0] = (other[..., 1].long() + 1 + other[..., 0].long()) % E  # different experts
    other[..., 0] = torch.where(other[..., 0] == other[..., 1], (other[..., 0] + 1) % E, other[..., 0])
    with routing_replay(model, other):
        changed = model(ids).logits
    after = model(ids).logits
    assert torch.equal(after, twin(ids).logits)
    assert not torch.equal(changed, after)  # the replay did do something while on
    for module in model.modules():
        assert not module._forward_hooks and not module._forward_pre_hooks


def test_missing_positions_use_the_current_router():
    """Sentinel positions (never fed at rollout time) fall back to the router's own choice."""
    model = make_model("mixtral")
    ids = ids_batch()
    with RoutingRecorder(model) as rec:
        plain = model(ids).logits
    routing = rec.routing().clone()
    routing[:, -3:] = missing_index(routing.dtype)
    with routing_replay(model, routing):
        assert torch.equal(model(ids).logits, plain)
    # Columns beyond a shorter routing are missing too (a rollout recording lacks the last
    # sampled token). Replaying a routing whose last 3 columns come from another model shows
    # the difference: the columns replayed there change the output, a truncated routing not.
    other = make_model("mixtral", seed=5)
    with RoutingRecorder(other) as rec_other:
        other(ids)
    mixed = torch.cat([routing[:, :-3], rec_other.routing()[:, -3:]], dim=1)
    assert router_shift(mixed, rec.routing()).overall > 0
    with routing_replay(model, mixed):
        assert not torch.equal(model(ids).logits, plain)
    with routing_replay(model, routing[:, :-3]):
        assert torch.equal(model(ids).logits, plain)
    # router_shift leaves out columns present in one routing only.
    s = router_shift(rec.routing(), mixed[:, :-3], torch.ones(3, 12))
    assert s.overall == 0 and s.tokens == 3 * 9


def test_nested_recorder_installs_one_set_of_hooks():
    model = make_model("qwen3_moe")
    ids = ids_batch()
    rec = RoutingRecorder(model)
    with rec:
        with rec:  # e.g. the trainer enters it and the sampler enters it again
            model(ids)
        model(ids[:, :4])
    assert rec.num_positions == 12 + 4
    assert torch.equal(rec.routing()[:, 12:], rec.routing()[:, :4])  # same prefix, same experts
    assert all(not m._forward_pre_hooks for m in model.modules())


# ------------------------------------------------------------------------------------------
# Recording during KV-cached decoding
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_kv_cached_recording_equals_full_forward(family):
    """Prefill (B, P) + (B, 1) decode steps record the same experts as one forward (B, L)."""
    model = make_model(family)
    prompts = ids_batch(B=3, L=6, seed=3)
    attention_mask = torch.ones_like(prompts)
    prompts[0, :2], attention_mask[0, :2] = 0, 0  # left padding on row 0
    torch.manual_seed(0)
    with torch.inference_mode(), RoutingRecorder(model, record_weights=True) as rec:
        seq = model.generate(
            prompts,
            attention_mask=attention_mask,
            max_new_tokens=6,
            do_sample=True,
            pad_token_id=0,
            eos_token_id=None,
        )
        steps = [t.shape[1] for t in rec._index[0]]
    assert steps == [6, 1, 1, 1, 1, 1]  # prefill then one column per decoded token
    seq = seq.clone()  # a normal tensor, usable under autograd below
    B, L = seq.shape
    cached = rec.routing(length=L)  # the last sampled token is never fed back
    assert cached.shape == (B, L, 2, K) and rec.num_positions == L - 1
    assert (cached[:, -1] == missing_index(cached.dtype)).all()
    assert torch.isnan(rec.weights(length=L)[:, -1]).all()

    full_mask = torch.cat([attention_mask, torch.ones(B, L - 6, dtype=attention_mask.dtype)], 1)
    with RoutingRecorder(model) as rec_full:
        model(seq, attention_mask=full_mask)
    full = rec_full.routing()
    shift = router_shift(cached, full, full_mask)
    assert shift.overall == 0 and shift.tokens == full_mask[:, :-1].sum()

    # The recording made under inference_mode replays in a grad-enabled forward.
    with routing_replay(model, cached):
        logp = response_logp(model, seq)
    assert logp.requires_grad


# ------------------------------------------------------------------------------------------
# Diagnostics
# ------------------------------------------------------------------------------------------


def test_router_shift_hand_example():
    # B=1, L=3, 2 layers, k=2.
    # layer 0: a = {0,1} {2,3} {1,0};  b = {1,0} {2,4} {1,0}  -> changed at p=1 only
    # layer 1: identical (order swapped at p=0, which does not count)
    a = torch.tensor([[[[0, 1], [5, 4]], [[2, 3], [0, 1]], [[1, 0], [2, 3]]]], dtype=torch.uint8)
    b = torch.tensor([[[[1, 0], [4, 5]], [[2, 4], [0, 1]], [[1, 0], [2, 3]]]], dtype=torch.uint8)
    s = router_shift(a, b)
    torch.testing.assert_close(s.per_layer, torch.tensor([1 / 3, 0.0]))
    torch.testing.assert_close(s.overall, torch.tensor(1 / 6))  # 1 changed of 6 (token, layer)
    torch.testing.assert_close(s.any_layer, torch.tensor(1 / 3))  # token 1 of 3
    # overlap |A∩B|/k: layer 0 -> 1, 1/2, 1; layer 1 -> 1, 1, 1: mean 5.5 / 6
    torch.testing.assert_close(s.overlap, torch.tensor(5.5 / 6))
    # A response mask (1, 1) covers the last column only, where nothing changed.
    assert router_shift(a, b, torch.ones(1, 1)).overall == 0
    # A (B, L) mask selecting column 1 only: layer 0 changed there -> 1/2 overall.
    torch.testing.assert_close(router_shift(a, b, torch.tensor([[0.0, 1.0, 0.0]])).overall, torch.tensor(0.5))
    # Missing positions are left out: mark column 1 missing in b -> nothing changed.
    b_missing = b.clone()
    b_missing[0, 1] = missing_index(torch.uint8)
    s = router_shift(a, b_missing)
    assert s.overall == 0 and s.tokens == 2
    # No valid token: fractions are 0, overlap 1.
    s = router_shift(a, b, torch.zeros(1, 3))
    assert s.overall == 0 and s.overlap == 1 and s.tokens == 0


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    B=st.integers(1, 4),
    L=st.integers(1, 6),
    n_layers=st.integers(1, 3),
)
def test_router_shift_properties(seed, B, L, n_layers):
    g = torch.Generator().manual_seed(seed)
    a = torch.rand(B, L, n_layers, E, generator=g).topk(K, -1).indices.to(torch.uint8)
    b = torch.rand(B, L, n_layers, E, generator=g).topk(K, -1).indices.to(torch.uint8)
    same = router_shift(a, a.flip(-1))  # permuting within the top-k changes nothing
    assert same.overall == 0 and same.overlap == 1
    ab, ba = router_shift(a, b), router_shift(b, a)
    assert torch.equal(ab.per_layer, ba.per_layer)  # symmetric
    assert 0 <= ab.overall <= ab.any_layer <= 1
    torch.testing.assert_close(ab.overall, ab.per_layer.mean())
    # An unchanged (token, layer) has overlap 1; a changed one between 0 and (k-1)/k, so
    # 1 - overall <= overlap <= 1 - overall / k.
    assert 1 - ab.overall - 1e-6 <= ab.overlap <= 1 - ab.overall / K + 1e-6
    bal = load_balance(a, E)
    torch.testing.assert_close(bal.load.sum(-1), torch.ones(n_layers))
    assert ((bal.entropy >= 0) & (bal.entropy <= 1 + 1e-6)).all()
    assert ((bal.max_load >= 1 - 1e-6) & (bal.max_load <= E / K + 1e-6)).all()


def test_load_balance_hand_example():
    # E=4, k=2. Layer 0: every token -> {0,1}: load = [.5, .5, 0, 0]
    #   entropy = log 2 / log 4 = 0.5; max_load = 4 * .5 = 2; cv = std/mean = .25/.25 = 1
    # Layer 1: tokens -> {0,1}, {2,3}: load = [.25]*4: entropy 1, max_load 1, cv 0
    routing = torch.tensor([[[[0, 1], [0, 1]], [[1, 0], [2, 3]]]], dtype=torch.uint8)  # (1,2,2,2)
    bal = load_balance(routing, 4)
    torch.testing.assert_close(bal.load, torch.tensor([[0.5, 0.5, 0, 0], [0.25] * 4]))
    torch.testing.assert_close(bal.entropy, torch.tensor([0.5, 1.0]))
    torch.testing.assert_close(bal.max_load, torch.tensor([2.0, 1.0]))
    torch.testing.assert_close(bal.cv, torch.tensor([1.0, 0.0]))
    # Masking out token 1 leaves layer 1 with {0,1} only: the same as layer 0.
    bal = load_balance(routing, 4, torch.tensor([[1.0, 0.0]]))
    torch.testing.assert_close(bal.entropy, torch.tensor([0.5, 0.5]))

    m = moe_metrics(routing, routing, 4)
    assert set(m) >= {"moe/router_shift", "moe/router_shift/layer_1", "moe/load_entropy"}
    assert all(v.dim() == 0 and not v.requires_grad for v in m.values())
    torch.testing.assert_close(m["moe/load_entropy"], torch.tensor(0.75))
    assert m["moe/router_shift"] == 0
    assert math.isclose(float(m["moe/load_max"]), 1.5)


@pytest.mark.parametrize("family", FAMILIES)
def test_replay_no_op_in_bfloat16(family):
    """The family's dtype handling is kept: bf16 (Qwen casts the weights back, Mixtral not)."""
    model = make_model(family).to(torch.bfloat16)
    ids = ids_batch()
    with RoutingRecorder(model, record_weights=True) as rec:
        plain = model(ids).logits
    with routing_replay(model, rec.routing()):
        assert torch.equal(model(ids).logits, plain)
    with routing_replay(model, rec.routing(), weights=rec.weights(), replay_weights=True):
        assert torch.equal(model(ids).logits, plain)


def test_runtime_tiny_moe_preset_with_token_logprobs():
    """The runtime's ``tiny-moe`` policy and the trainer's recomputation (left-padded prompts)."""
    from respo.runtime.logprobs import token_logprobs
    from respo.runtime.models import build_policy
    from respo.runtime.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    model = build_policy("tiny-moe", tok, seed=0).eval()
    prompts = tok(["12+34=", "5+6="], padding=True, return_tensors="pt")
    P = prompts.input_ids.shape[1]
    g = torch.Generator().manual_seed(0)
    response = torch.randint(4, len(tok), (2, 5), generator=g)
    input_ids = torch.cat([prompts.input_ids, response], 1)  # (2, P + 5)
    attention_mask = torch.cat([prompts.attention_mask, torch.ones(2, 5, dtype=torch.long)], 1)
    response_mask = torch.ones(2, 5)

    with torch.no_grad(), RoutingRecorder(model) as rec:
        old_logp, _ = token_logprobs(model, input_ids, attention_mask, P)
    routing = rec.routing()
    assert routing.shape == (2, P + 5, 2, 2)
    with routing_replay(model, routing):
        same, _ = token_logprobs(model, input_ids, attention_mask, P)
    assert torch.equal(same, old_logp)

    with torch.no_grad():  # move every router: routing shifts on the response tokens
        for layer in find_moe_layers(model):
            layer.router.weight.add_(0.5 * torch.randn(layer.router.weight.shape, generator=g))
    with torch.no_grad(), RoutingRecorder(model) as rec_free:
        token_logprobs(model, input_ids, attention_mask, P)
    with torch.no_grad(), routing_replay(model, routing) as rp, RoutingRecorder(model) as rec_rep:
        token_logprobs(model, input_ids, attention_mask, P)
    assert router_shift(routing, rec_free.routing(), response_mask).overall > 0
    assert router_shift(routing, rec_rep.routing(), response_mask).overall == 0
    m = moe_metrics(routing, rp.router_routing(), 8, response_mask)
    assert m["moe/router_shift"] > 0 and 0 < m["moe/load_entropy"] <= 1


@pytest.mark.parametrize("impl", ["eager", "batched_mm"])
def test_replay_under_other_experts_implementations(impl):
    """The hooks sit on the router and on the experts module's inputs, so transformers'
    experts kernels (default ``grouped_mm``; here ``eager`` and ``batched_mm``) all replay."""
    model = make_model("qwen2_moe")
    model.set_experts_implementation(impl)
    ids = ids_batch()
    with RoutingRecorder(model) as rec:
        plain = model(ids).logits
    recorded = rec.routing()
    with routing_replay(model, recorded):
        assert torch.equal(model(ids).logits, plain)
    with torch.no_grad():
        for layer in find_moe_layers(model):
            layer.router.weight.mul_(-1.0)  # reverses every router's preference order
    with RoutingRecorder(model) as rec_free:
        model(ids)
    with routing_replay(model, recorded), RoutingRecorder(model) as rec_replay:
        model(ids)
    assert router_shift(recorded, rec_free.routing()).overall > 0.5
    assert torch.equal(rec_replay.routing(), recorded)


def test_runtime_sampler_records_rollout_routing():
    """``sample(..., router_recorder=rec)``: the recording covers prompt + response columns
    (all but the last sampled token, never fed back) and matches the trainer's full forward."""
    from respo.runtime.logprobs import token_logprobs
    from respo.runtime.models import build_policy
    from respo.runtime.sampler import sample
    from respo.runtime.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    model = build_policy("tiny-moe", tok, seed=0).eval()
    rec = RoutingRecorder(model)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        ro = sample(model, tok, ["1+2=", "34+5=", "6+78="], max_new_tokens=6, generator=g,
                    router_recorder=rec, stop_at_eos=False)
    B, L = ro.input_ids.shape
    assert rec.num_positions == L - 1
    routing = rec.routing(length=L)  # (B, L, 2, 2), last column missing
    with torch.no_grad(), RoutingRecorder(model) as rec_full:
        plain, _ = token_logprobs(model, ro.input_ids, ro.attention_mask, ro.response_start)
    shift = router_shift(routing, rec_full.routing(), ro.attention_mask)
    assert shift.overall == 0 and shift.tokens == ro.attention_mask[:, :-1].sum()
    # The trainer may pass the unpadded recording: the missing last column is the same thing.
    for r in (routing, rec.routing()):
        with torch.no_grad(), routing_replay(model, r):
            replayed, _ = token_logprobs(model, ro.input_ids, ro.attention_mask, ro.response_start)
        assert torch.equal(replayed, plain)
    torch.testing.assert_close(plain * ro.response_mask, ro.behaviour_logp, rtol=0, atol=1e-5)


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_replay_under_gradient_checkpointing(use_reentrant):
    """The recomputation in backward replays the same experts: gradients equal the plain
    replayed forward's exactly."""
    model = make_model("qwen3_moe")
    ids = ids_batch()
    with RoutingRecorder(model) as rec:
        model(ids)
    recorded = rec.routing()
    with torch.no_grad():
        for layer in find_moe_layers(model):
            layer.router.weight.mul_(-1.0)  # every set moves without replay
    model.train()

    def replayed_grads():
        model.zero_grad()
        with routing_replay(model, recorded):
            response_logp(model, ids).sum().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    expected = replayed_grads()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": use_reentrant})
    got = replayed_grads()
    for name in expected:
        assert torch.equal(got[name], expected[name]), name


def test_register_another_family(monkeypatch):
    """OLMoE is not built in; registering its block (same router contract) makes it work."""
    from transformers import OlmoeConfig
    from transformers.models.olmoe.modeling_olmoe import OlmoeSparseMoeBlock

    from respo.runtime import moe
    from respo.runtime.moe import families

    monkeypatch.setattr(families, "_EXTRA_FAMILIES", [])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        OlmoeConfig(**_COMMON, num_experts=E, num_experts_per_tok=K, norm_topk_prob=False)
    ).eval()
    with pytest.raises(ValueError, match=r"OlmoeForCausalLM \(model_type='olmoe'\) is not a supported"):
        RoutingRecorder(model)
    moe.register_moe_family(moe.MoEFamily("olmoe", OlmoeSparseMoeBlock, lambda r: bool(r.norm_topk_prob)))
    assert "olmoe" in moe.supported_families()
    ids = ids_batch()
    with RoutingRecorder(model) as rec:
        plain = model(ids).logits
    with routing_replay(model, rec.routing()):
        assert torch.equal(model(ids).logits, plain)


def test_cat_routings_pads_trimmed_micro_batches():
    from respo.runtime.moe import cat_routings

    sentinel = missing_index(torch.uint8)
    a = torch.zeros(2, 3, 1, K, dtype=torch.uint8)  # micro-batch trimmed to 3 columns
    b = torch.ones(1, 5, 1, K, dtype=torch.uint8)
    out = cat_routings([a, b])
    assert out.shape == (3, 5, 1, K)
    assert (out[:2, 3:] == sentinel).all() and (out[:2, :3] == 0).all() and (out[2] == 1).all()
    assert cat_routings([a], length=4).shape == (2, 4, 1, K)
    with pytest.raises(ValueError, match="more than length=4"):
        cat_routings([b], length=4)
    # The padded columns are left out of router_shift: a fully-masked comparison counts 2*3 + 5.
    assert router_shift(out, out, torch.ones(3, 5)).tokens == 11


def test_core_diagnostics_import_only_torch():
    """respo.core.moe_diagnostics is torch-only, and respo.core is the one public path to it."""
    import subprocess
    import sys

    code = (
        "import sys, respo.core.moe_diagnostics; "
        "bad = [m for m in sys.modules if m.startswith(('transformers', 'respo.runtime'))]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    import respo.core
    from respo.core import moe_diagnostics
    from respo.runtime import moe

    for name in ("router_shift", "load_balance", "expert_load", "moe_metrics", "missing_index", "routing_dtype"):
        assert getattr(respo.core, name) is getattr(moe_diagnostics, name) and name in respo.core.__all__
        assert not hasattr(moe, name), name  # not re-exported by the runtime


def test_routing_dtype_and_sentinel():
    # uint8 holds experts 0..254 with 255 as the sentinel; int16 up to 32767 experts, sentinel -1
    from respo.core import routing_dtype

    assert routing_dtype(255) == torch.uint8 and missing_index(torch.uint8) == 255
    assert routing_dtype(256) == torch.int16 and missing_index(torch.int16) == -1
    with pytest.raises(ValueError, match="int16"):
        routing_dtype(32768)


def test_builtin_family_table_names_the_supported_families():
    from respo.runtime.moe import BUILTIN_FAMILIES, supported_families

    assert [row[0] for row in BUILTIN_FAMILIES] == FAMILIES
    assert supported_families()[: len(FAMILIES)] == FAMILIES


@pytest.mark.parametrize("family", FAMILIES)
def test_recorder_and_replay_leave_no_hooks(family):
    """Both contexts install their hooks the same way and take every one off on exit."""
    model = make_model(family)

    def n_hooks():
        return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())

    ids = ids_batch()
    assert n_hooks() == 0
    with RoutingRecorder(model) as rec:
        with rec:  # nested use keeps one set of hooks: block pre-hook + experts pre-hook per layer
            assert n_hooks() == 2 * 2
        assert n_hooks() == 2 * 2
        model(ids)
    assert n_hooks() == 0
    with routing_replay(model, rec.routing()) as rp:
        assert n_hooks() == 2 * 2  # block pre-hook + router hook per layer
        with pytest.raises(RuntimeError, match="already active"):
            rp.__enter__()
    assert n_hooks() == 0
