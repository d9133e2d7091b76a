"""respo: stable off-policy RL of language models under high rollout staleness (ReSPO and baselines).

The public API is the core (torch only); the embedded runtime (``respo.runtime``, ``respo.train``)
and the integrations (``respo.integrations.verl``, ``respo.integrations.trl``) are imported on demand.
"""

from respo.core import *  # noqa: F401,F403
from respo.core import __all__ as _core_all
from respo.core import objectives as _objectives

__version__ = "0.1.0"
__all__ = list(_core_all) + ["__version__"]


def __getattr__(attr: str):
    """``<name>_loss`` of an objective registered after import (``respo.core.objectives``)."""
    if _objectives.loss_function_name(attr) is None:
        raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")
    return getattr(_objectives, attr)
