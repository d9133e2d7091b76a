"""respo core: pure functions of tensors (torch only). Ratios, kernels, objectives, aggregation,
advantages, input checks, weight diagnostics and MoE routing diagnostics. Metrics are detached
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
from respo.core.objectives import (
    OBJECTIVES,
    Objective,
    build_objective,
    cispo_loss,
    get_objective,
    gmpo_loss,
    grpo_loss,
    gspo_loss,
    hyperparameters,
    kernel_from_spec,
    policy_loss,
    reinforce_loss,
    reshaped_loss,
    respo_loss,
    sapo_loss,
    sequence_kernels,
    topr_loss,
    vespo_loss,
)
from respo.core.ratios import fold_rollout_log_ratio, sequence_log_ratio, token_log_ratio

__all__ = [
    "ADVANTAGE_KINDS", "AGG_MODES", "OBJECTIVES", "Objective", "RESPO_NEG", "RESPO_POS", "VESPO_NEG", "VESPO_POS",
    "agg_loss", "build_objective", "cispo_loss", "fold_rollout_log_ratio", "get_objective", "gmpo_loss", "group_advantages", "grpo_loss", "gspo_loss",
    "hyperparameters", "kernel_from_spec", "policy_loss", "reinforce_loss", "reshaped_loss", "respo_kernel",
    "respo_loss", "respo_phi", "sapo_loss", "sequence_kernels", "sequence_log_ratio", "token_log_ratio", "topr_loss",
    "truncated_kernel", "two_branch", "unit_kernel", "vespo_kernel", "vespo_loss", "vespo_phi",
    "weight_diagnostics", "LoadBalance", "RouterShift", "expert_load", "load_balance", "missing_index", "moe_metrics",
    "router_shift", "routing_dtype",
]  # fmt: skip
