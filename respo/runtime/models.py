"""Policy builders: tiny Hugging Face causal LMs from config (random init), or a local directory.

Presets (``PRESETS``) are plain dicts of config fields; ``build_policy`` fills in the
vocabulary size and the special-token ids from the tokenizer, so the embedding matrix always
matches the tokenizer. Nothing is downloaded: a path is loaded with ``local_files_only``.

- ``tiny-dense``: Qwen3 (``Qwen3ForCausalLM``), hidden 128, 2 layers, 4 heads, tied embeddings.
- ``tiny-moe``: Qwen3-MoE (``Qwen3MoeForCausalLM``), the same attention stack with a sparse
  MoE MLP in every layer: 8 experts, top-2, expert width 128. ``output_router_logits`` is
  available on every forward (``model(..., output_router_logits=True).router_logits`` is a
  tuple with one ``(B*L, n_experts)`` tensor per layer).

Both presets have 1024 positions, so the longest task settings fit (85-digit scratchpad
addition: 173 prompt + 512 response tokens; 13×13-digit multiplication: 29 + 521). Qwen3's
default rotary embedding reads no position limit, so weights and outputs are those of the
earlier 512-position presets, bit for bit (only ``config.json`` differs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

_COMMON: dict[str, Any] = {
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 32,
    "max_position_embeddings": 1024,  # default RoPE: the positions only bound the context, no number depends on them
    "tie_word_embeddings": True,
    "rms_norm_eps": 1e-6,
    "initializer_range": 0.02,
    "attention_dropout": 0.0,
}

#: Preset name -> config fields. ``model_type`` selects the architecture.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny-dense": {"model_type": "qwen3", **_COMMON, "intermediate_size": 512},
    "tiny-moe": {
        "model_type": "qwen3_moe",
        **_COMMON,
        "intermediate_size": 512,  # unused unless a layer is listed in mlp_only_layers
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 128,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "router_aux_loss_coef": 0.001,
        "output_router_logits": False,
    },
}


def _config_class(model_type: str):
    from transformers import Qwen3Config, Qwen3MoeConfig

    classes = {"qwen3": Qwen3Config, "qwen3_moe": Qwen3MoeConfig}
    if model_type not in classes:
        raise ValueError(f"unknown model_type {model_type!r}; known: {sorted(classes)}")
    return classes[model_type]


def build_policy(
    preset_or_path: str | Path,
    tokenizer: PreTrainedTokenizerBase,
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    attn_implementation: str = "sdpa",
    **overrides: Any,
) -> PreTrainedModel:
    """Build a policy from a preset (random init under ``seed``) or load a local directory.

    Args:
        preset_or_path: a key of ``PRESETS`` or a directory holding a saved causal LM
            (``config.json`` + weights).
        tokenizer: sets ``vocab_size = len(tokenizer)`` and pad/bos/eos ids for presets; for a
            directory, the loaded model's vocabulary must cover ``len(tokenizer)``.
        seed: seeds ``torch`` around the random initialisation (the global RNG state is
            restored afterwards), so the same seed gives the same weights.
        dtype: parameter dtype (float32 by default: the identity tests need it).
        attn_implementation: passed to transformers ("sdpa" or "eager").
        **overrides: config fields replacing the preset's (e.g. ``num_hidden_layers=4``);
            for a directory, passed to ``from_pretrained`` as config overrides.

    Returns:
        The model in eval mode (the caller switches to ``train()``).
    """
    key = str(preset_or_path)
    if key in PRESETS:
        fields = {**PRESETS[key], **overrides}
        model_type = fields.pop("model_type")
        config = _config_class(model_type)(
            **fields,
            vocab_size=len(tokenizer),
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
        config._attn_implementation = attn_implementation
        with torch.random.fork_rng(devices=[]):  # CPU state only; restored on exit
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_config(
                config, dtype=dtype, attn_implementation=attn_implementation
            )
        return model.eval()

    path = Path(key)
    if not path.is_dir():
        raise ValueError(
            f"unknown policy {key!r}: neither a preset ({sorted(PRESETS)}) nor a local directory"
        )
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} has no config.json: not a saved Hugging Face model")
    if not any(path.glob("*.safetensors")):
        pickled = sorted(p.name for p in path.glob("*.bin")) + sorted(p.name for p in path.glob("*.pt"))
        what = f"its weights are pickled ({', '.join(pickled[:3])}), which loading could run code from" if pickled \
            else "it has no *.safetensors weights"
        raise ValueError(f"model directory {path}: {what}; respo loads safetensors only (convert them, e.g. "
                         "model.save_pretrained(dir) in a trusted environment)")
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=dtype, attn_implementation=attn_implementation, local_files_only=True, use_safetensors=True,
        **overrides
    )
    vocab = model.get_input_embeddings().weight.shape[0]
    if vocab < len(tokenizer):
        raise ValueError(
            f"model at {path} has {vocab} embeddings but the tokenizer has {len(tokenizer)} tokens"
        )
    return model.eval()


def count_parameters(model: torch.nn.Module) -> int:
    """Number of distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())
