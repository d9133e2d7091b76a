"""Run names and objective labels of the study: one place, built from the core's published kernels.

A sweep names each run directory after its grid coordinates (`run_name`), and every table labels a
run by its objective (`objective_label`). ``reshaped`` runs (one kernel per advantage sign) are
labelled by branch: ``respo+/vespo-`` is ReSPO's positive kernel with VESPO's negative kernel. The
kernel specs are read from `respo.core.objectives.hyperparameters`, so the labels follow the core's
defaults:

    ReSPO  φ⁺ = respo(2,0.5,2) = ((1+W)/2)·e^(1−W),  φ⁻ = respo(1,0.5,2) = √W·e^(2(1−√W))
    VESPO  φ⁺ = vespo(2,3) = W²·e^(3(1−W)),          φ⁻ = vespo(3,2) = W³·e^(2(1−W))
"""

from __future__ import annotations

import re
from pathlib import Path

from respo.core.objectives import hyperparameters

__all__ = ["kernel_spec", "RESPO_POS", "RESPO_NEG", "VESPO_POS", "VESPO_NEG", "ABLATION_KERNELS", "LONG_KERNELS", "objective_fields", "label_slug",
           "objective_label", "run_name", "norm_spec"]


def kernel_spec(family: str, params) -> str:
    """The core's spec string of a kernel, e.g. ``kernel_spec("respo", (2.0, 0.5, 2.0)) == "respo(2,0.5,2)"``."""
    return f"{family}(" + ",".join(f"{float(x):g}" for x in params) + ")"


RESPO_POS = kernel_spec("respo", hyperparameters("respo")["pos"])
RESPO_NEG = kernel_spec("respo", hyperparameters("respo")["neg"])
VESPO_POS = kernel_spec("vespo", hyperparameters("vespo")["pos"])
VESPO_NEG = kernel_spec("vespo", hyperparameters("vespo")["neg"])

#: Branch-ablation objectives: label -> (pos_kernel, neg_kernel) specs for the core's ``reshaped``.
ABLATION_KERNELS = {
    "respo+/vespo-": (RESPO_POS, VESPO_NEG),  # ReSPO's positive branch, VESPO's negative
    "vespo+/respo-": (VESPO_POS, RESPO_NEG),  # VESPO's positive branch, ReSPO's negative
}
#: Negative-branch variants under ReSPO's positive branch (long-response presets).
LONG_KERNELS = {
    "respo+/truncated-": (RESPO_POS, "truncated(1)"),  # φ⁻ = min(W, 1) (TOPR's negative branch)
    "respo+/respo0-": (RESPO_POS, "respo(1,0.5,0)"),  # ReSPO's φ⁻ with λ⁻ = 0: √W, no decay
}


def norm_spec(spec: str) -> str:
    """A kernel spec without whitespace (``"respo(2, 0.5, 2)"`` -> ``"respo(2,0.5,2)"``)."""
    return re.sub(r"\s+", "", str(spec))


def objective_label(objective: str, objective_kwargs: dict | None = None) -> str:
    """Short label of an objective + its kernel choice (``reshaped`` runs are named by branch; a
    pair with no label is ``POS+/NEG-``; the core's ``reshaped`` defaults fill a missing branch)."""
    kw = objective_kwargs or {}
    if objective == "reshaped":
        spec = {**hyperparameters("reshaped"), **kw}
        pair = (norm_spec(spec["pos_kernel"]), norm_spec(spec["neg_kernel"]))
        for label, kernels in {**ABLATION_KERNELS, **LONG_KERNELS}.items():
            if tuple(map(norm_spec, kernels)) == pair:
                return label
        return f"{pair[0]}+/{pair[1]}-"
    return objective if not kw else objective + "(" + ",".join(f"{k}={v}" for k, v in sorted(kw.items())) + ")"


def objective_fields(label: str, kernels: dict | None = None) -> dict:
    """The config fields of an objective label: a plain name as itself, a label of ``kernels`` (default
    `ABLATION_KERNELS`) as ``reshaped`` with that pair of kernels."""
    kernels = ABLATION_KERNELS if kernels is None else kernels
    if label in kernels:
        pos, neg = kernels[label]
        return {"objective": "reshaped", "objective_kwargs": {"pos_kernel": pos, "neg_kernel": neg}}
    return {"objective": label}


def label_slug(label: str) -> str:
    """An objective label as a file name: ``respo+/vespo-`` -> ``respopos.vesponeg``."""
    return re.sub(r"[^A-Za-z0-9.]+", "-", label.replace("+/", "pos.").replace("-", "neg").rstrip("/"))


def run_name(ov: dict) -> str:
    """Directory name from the grid coordinates, e.g. ``tiny-dense_grpo_N8_G8_lr3e-05_s0``."""
    label = label_slug(objective_label(ov.get("objective", "respo"), ov.get("objective_kwargs")))
    parts = [Path(str(ov.get("model", "tiny-dense"))).name, label, f"N{ov.get('reuse', 1)}", f"G{ov.get('group_size', 8)}",
             f"lr{ov.get('lr', 0):g}", f"s{ov.get('seed', 0)}"]
    if ov.get("routing_replay"):
        parts.append("rr")
    if ov.get("loss_agg_mode"):  # an aggregation override is a run of its own
        parts.append(ov["loss_agg_mode"])
    if "updates" in ov:
        parts.append(f"u{ov['updates']}")
    return "_".join(str(p) for p in parts)
