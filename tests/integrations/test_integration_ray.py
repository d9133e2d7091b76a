"""Registration inside Ray worker processes, where verl computes the policy loss.

Starts Ray for real on the CPU (one module-scoped cluster) and runs tasks in fresh worker
processes that only ``import verl``: with the runtime_env that ``python -m
respo.integrations.verl.main_ppo`` gives verl's ``ray.init`` (``VERL_USE_EXTERNAL_MODULES``),
``get_policy_loss_fn("respo")`` in the worker is respo's and computes the core's value; without it
(the control) the worker has no "respo" loss.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

ray = pytest.importorskip("ray")
pytest.importorskip("verl")

from respo.integrations.verl.main_ppo import ENV_VAR, MODULE, worker_runtime_env  # noqa: E402

# Ship this module's functions to the workers by value (the tests directory is not importable there).
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def ray_cluster():
    saved = os.environ.pop(ENV_VAR, None)  # the workers must not inherit the registration from us
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield
    finally:
        ray.shutdown()
        if saved is not None:
            os.environ[ENV_VAR] = saved


def fixed_inputs():
    """float64 (B, T) inputs with both advantage signs and a ragged mask."""
    g = torch.Generator().manual_seed(11)
    old = -2 * torch.rand(4, 5, generator=g, dtype=torch.float64)
    logp = old + 0.7 * torch.randn(4, 5, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 1, 0], [1, 0, 0, 0, 0]], dtype=torch.bool)
    adv_seq = torch.tensor([1.0, -1.0, 0.5, -0.25], dtype=torch.float64)
    return logp, old, adv_seq, mask


def probe() -> dict:
    """Runs in a Ray worker: import verl only, then look up and evaluate the "respo" loss."""
    import os
    import sys

    import verl  # noqa: F401  (the plug-in hook runs here)
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY

    out = {
        "pid": os.getpid(),
        "env": os.environ.get("VERL_USE_EXTERNAL_MODULES"),
        "plugin_imported": "respo.integrations.verl" in sys.modules,
        "registered": "respo" in POLICY_LOSS_REGISTRY,
    }
    if not out["registered"]:
        return out
    import respo
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    fn = get_policy_loss_fn("respo")
    logp, old, adv_seq, mask = fixed_inputs()
    logp.requires_grad_()
    adv = adv_seq[:, None].expand_as(logp)
    loss, metrics = fn(old, logp, adv, mask, "token-mean", None, None)
    core, _ = respo.policy_loss("respo", logp, old, adv_seq, mask.double())
    (g_verl,) = torch.autograd.grad(loss, logp, retain_graph=True)
    (g_core,) = torch.autograd.grad(core, logp)
    out.update(
        objective=getattr(fn, "__respo_objective__", None),
        module=fn.func.__module__,
        loss=loss.item(),
        core=core.item(),
        max_grad_diff=(g_verl - g_core).abs().max().item(),
        frac_pos_low_w=metrics["respo/frac_pos_low_w"],
    )
    return out


@pytest.fixture(scope="module")
def probes(ray_cluster):
    """The three probes at once (fresh workers, two at a time on the 2 CPUs)."""
    env = worker_runtime_env()
    assert env["env_vars"][ENV_VAR].split(",")[-1] == MODULE
    # A different runtime_env gets its own fresh worker. verl's plugin discovery is off in the first two
    # (VERL_USE_EXTERNAL_PLUGINS=none), so they test the variable alone: with it the losses register, without
    # it nothing does; the third has neither the variable nor the switch, and registers through respo's
    # verl.plugins entry point alone.
    off = {"VERL_USE_EXTERNAL_PLUGINS": "none"}
    hook_env = {**env, "env_vars": {**env["env_vars"], **off}}
    control_env = {"env_vars": {"RESPO_RAY_CONTROL": "1", **off}}
    entry_env = {"env_vars": {"RESPO_RAY_ENTRY_POINT": "1"}}
    refs = [ray.remote(probe).options(runtime_env=e).remote() for e in (hook_env, control_env, entry_env)]
    with_hook, control, entry = ray.get(refs)
    return with_hook, control, entry


def test_worker_registration_through_entry_points_runtime_env(probes):
    import respo

    with_hook, _, _ = probes
    assert with_hook["pid"] != os.getpid()
    assert with_hook["plugin_imported"] and with_hook["registered"]
    assert with_hook["objective"] == "respo" and with_hook["module"] == "respo.integrations.verl"
    # The worker's value equals the core's, in the worker and here in the driver.
    logp, old, adv_seq, mask = fixed_inputs()
    driver_core, _ = respo.policy_loss("respo", logp, old, adv_seq, mask.double())
    assert with_hook["loss"] == pytest.approx(with_hook["core"], rel=1e-12, abs=0)
    assert with_hook["loss"] == pytest.approx(driver_core.item(), rel=1e-12, abs=0)
    assert with_hook["max_grad_diff"] < 1e-14
    assert 0.0 <= with_hook["frac_pos_low_w"] <= 1.0


def test_control_worker_without_hook_has_no_respo_loss(probes):
    _, control, _ = probes
    assert control["env"] is None
    assert not control["plugin_imported"] and not control["registered"]


def test_a_worker_registers_through_the_entry_point_alone(probes):
    # no VERL_USE_EXTERNAL_MODULES: `import verl` loaded respo's verl.plugins entry point, and the loss in the
    # worker is the core's
    _, _, entry = probes
    assert entry["env"] is None and entry["plugin_imported"] and entry["registered"]
    assert entry["objective"] == "respo" and entry["loss"] == pytest.approx(entry["core"], rel=1e-12, abs=0)
