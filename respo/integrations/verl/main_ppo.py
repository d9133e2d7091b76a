"""verl's ``main_ppo`` with respo's policy losses registered in every process.

    python -m respo.integrations.verl.main_ppo actor_rollout_ref.actor.policy_loss.loss_mode=respo [overrides]

verl computes the policy loss inside Ray worker processes (the actor workers), not in the driver,
so importing :mod:`respo.integrations.verl` in the driver alone is not enough. verl 0.9.1 imports
the comma-separated modules in ``VERL_USE_EXTERNAL_MODULES`` whenever a process runs
``import verl`` (``verl/__init__.py``). This entry point

1. registers the losses in the driver (so Hydra/config validation sees them),
2. appends ``respo.integrations.verl`` to ``VERL_USE_EXTERNAL_MODULES`` in the driver's
   environment (inherited by a local Ray cluster that ``ray.init`` starts), and
3. puts the same variable into ``ray_kwargs.ray_init.runtime_env.env_vars``, which verl passes to
   ``ray.init`` as the job's runtime environment, so workers on an existing multi-node cluster
   (``ray start``; ``RAY_ADDRESS``) import it too,

then runs verl's own ``main`` on the same Hydra config (verl's ``ppo_trainer.yaml``; every verl
override works unchanged, and Hydra flags such as ``--cfg job`` print the composed config without
starting anything).

Without this entry point, the same effect: ``export VERL_USE_EXTERNAL_MODULES=respo.integrations.verl``
before ``ray start`` on every node and before ``python -m verl.trainer.main_ppo``, or point
``actor_rollout_ref.actor.policy_loss._target_`` at ``respo.integrations.verl.RespoPolicyLossConfig``
(the worker that builds the actor config then imports the module).
"""

from __future__ import annotations

import os
from typing import Any, Optional

import hydra
from omegaconf import DictConfig, open_dict

import respo.integrations.verl  # noqa: F401  (registers the losses in this process)

ENV_VAR = "VERL_USE_EXTERNAL_MODULES"
MODULE = "respo.integrations.verl"


def external_modules_value(existing: Optional[str] = None) -> str:
    """``VERL_USE_EXTERNAL_MODULES`` with ``respo.integrations.verl`` appended once (other modules kept)."""
    existing = os.environ.get(ENV_VAR, "") if existing is None else existing
    modules = [m.strip() for m in existing.split(",") if m.strip()]
    if MODULE not in modules:
        modules.append(MODULE)
    return ",".join(modules)


def worker_runtime_env(base: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """A Ray ``runtime_env`` whose processes register respo's losses on ``import verl``.

    Args:
        base: a runtime_env to extend (not modified).

    Returns:
        a copy of ``base`` with ``env_vars[VERL_USE_EXTERNAL_MODULES]`` including this module.
    """
    env = dict(base or {})
    env_vars = dict(env.get("env_vars") or {})
    env_vars[ENV_VAR] = external_modules_value(env_vars.get(ENV_VAR, os.environ.get(ENV_VAR, "")))
    env["env_vars"] = env_vars
    return env


def install_worker_registration(config: DictConfig) -> DictConfig:
    """Set the driver's environment and ``config.ray_kwargs.ray_init.runtime_env`` (in place) so
    that every Ray process verl starts imports respo's plug-in. Returns ``config``."""
    value = external_modules_value()
    os.environ[ENV_VAR] = value
    with open_dict(config):
        if config.get("ray_kwargs") is None:
            config.ray_kwargs = {}
        if config.ray_kwargs.get("ray_init") is None:
            config.ray_kwargs.ray_init = {}
        if config.ray_kwargs.ray_init.get("runtime_env") is None:
            config.ray_kwargs.ray_init.runtime_env = {}
        runtime_env = config.ray_kwargs.ray_init.runtime_env
        if runtime_env.get("env_vars") is None:
            runtime_env.env_vars = {}
        runtime_env.env_vars[ENV_VAR] = external_modules_value(runtime_env.env_vars.get(ENV_VAR, value))
    return config


def _verl_config_dir() -> str:
    import verl.trainer.main_ppo as verl_main_ppo

    return os.path.join(os.path.dirname(os.path.abspath(verl_main_ppo.__file__)), "config")


@hydra.main(config_path=_verl_config_dir(), config_name="ppo_trainer", version_base=None)
def main(config: DictConfig) -> None:
    """Register respo's losses in the driver and in every Ray worker, then run verl's main."""
    from verl.trainer.main_ppo import main as verl_main

    install_worker_registration(config)
    verl_main.__wrapped__(config)  # verl's body, without re-entering Hydra


if __name__ == "__main__":
    main()
