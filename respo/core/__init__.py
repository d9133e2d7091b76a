"""respo core: pure functions of tensors (torch only). Ratios, kernels, objectives, aggregation,
advantages, input checks, weight diagnostics, per-token staleness and MoE routing diagnostics. Metrics are detached
tensors; the caller converts them."""

from respo.core.advantages import ADVANTAGE_KINDS, group_advantages
from respo.core.aggregation import AGG_MODES, agg_loss
from respo.core.diagnostics import weight_diagnostics
from respo.core.kernels import (
    RESPO_NEG,
    RESPO_POS,
    VESPO_NEG,
    VESPO_POS,
    respo_kernel,
    respo_phi,
    truncated_kernel,
    two_branch,
    unit_kernel,
    vespo_kernel,
    vespo_phi,
)
from respo.core.moe_diagnostics import (
    LoadBalance,
    RouterShift,
    expert_load,
    load_balance,
    missing_index,
    moe_metrics,
    router_shift,
    routing_dtype,
)
from respo.core import objectives as _objectives
from respo.core.objectives import (
    OBJECTIVES,
    Objective,
    build_objective,
    get_objective,
    hyperparameters,
    kernel_from_spec,
    policy_loss,
    sequence_kernels,
)
from respo.core.ratios import fold_rollout_log_ratio, sequence_log_ratio, token_log_ratio
from respo.core.staleness import token_staleness_metrics

# ``<name>_loss`` of every objective in the registry (``respo.core.objectives``), those registered later too
globals().update({name: getattr(_objectives, name) for name in _objectives.LOSS_FUNCTIONS})


def __getattr__(attr: str):
    if _objectives.loss_function_name(attr) is None:
        raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")
    return getattr(_objectives, attr)


__all__ = [
    "ADVANTAGE_KINDS", "AGG_MODES", "OBJECTIVES", "Objective", "RESPO_NEG", "RESPO_POS", "VESPO_NEG", "VESPO_POS",
    "agg_loss", "build_objective", "fold_rollout_log_ratio", "get_objective", "group_advantages", "hyperparameters",
    "kernel_from_spec", "policy_loss", "respo_kernel", "respo_phi", "sequence_kernels", "sequence_log_ratio",
    "token_log_ratio", "token_staleness_metrics", "truncated_kernel", "two_branch", "unit_kernel", "vespo_kernel",
    "vespo_phi",
    "weight_diagnostics", "LoadBalance", "RouterShift", "expert_load", "load_balance", "missing_index", "moe_metrics",
    "router_shift", "routing_dtype", *_objectives.LOSS_FUNCTIONS,
]  # fmt: skip
