"""SkyRL's side of tests/integrations/test_integration_skyrl.py: respo's plug-in inside the installed SkyRL.

Run by the .venv-skyrl interpreter as ``python skyrl_side.py <in.pt> <out.pt>`` with this checkout on
PYTHONPATH. It imports ``respo.integrations.skyrl`` (which registers respo's losses through SkyRL's
``PolicyLossRegistry.register``), registers the extra variants the payload asks for, and for each case
scales the advantages with SkyRL's ``apply_loss_reduction_to_advantages_minibatch``, fetches the loss by
name with ``PolicyLossRegistry.get`` (a respo loss or one of SkyRL's own), builds SkyRL's
``AlgorithmConfig`` with ``AlgorithmConfig.from_dict_config`` and calls the loss; the loss, the gradient
wrt log_probs and the metrics go back. Cases that must fail return the error's message.

Python 3.11: SkyRL 0.3.0 declares Python >= 3.11, but ``skyrl.backends`` imports ``skyrl.tinker.types``,
whose pydantic models use ``typing.TypedDict``, and pydantic refuses that before 3.12 ("Please use
`typing_extensions.TypedDict` instead of `typing.TypedDict` on Python < 3.12"), so ``import
skyrl.backends.skyrl_train.utils.ppo_utils`` fails on 3.11. The torch 2.13.0 CPU build here is for 3.11
only, so before SkyRL is imported this script makes ``typing.TypedDict`` the ``typing_extensions`` one
(what pydantic asks for). Nothing of SkyRL is replaced.
"""

import importlib.metadata
import sys
import typing

if sys.version_info < (3, 12):
    import typing_extensions

    typing.TypedDict = typing_extensions.TypedDict

import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from skyrl.backends.skyrl_train.utils import ppo_utils  # noqa: E402
from skyrl.backends.skyrl_train.utils.ppo_utils import (  # noqa: E402
    PolicyLossRegistry,
    apply_loss_reduction_to_advantages_minibatch,
)
from skyrl.train.config import AlgorithmConfig  # noqa: E402

import respo.integrations.skyrl as plugin  # noqa: E402  (registers respo's losses)


def _config(overrides):
    return AlgorithmConfig.from_dict_config(OmegaConf.create(overrides or {}))


def _call(fn, case):
    cfg = _config(case.get("config"))
    adv = apply_loss_reduction_to_advantages_minibatch(
        advantages=case["advantages"], loss_mask=case["loss_mask"], loss_reduction=cfg.loss_reduction,
        micro_batch_size=case["advantages"].shape[0], max_seq_len=cfg.max_seq_len,
        prompt_boundaries=case.get("prompt_boundaries"),
    )  # fmt: skip
    x = case["log_probs"].clone().requires_grad_(True)
    loss, metrics = fn(x, case["old_log_probs"], adv, config=cfg, loss_mask=case["loss_mask"],
                       rollout_logprobs=case.get("rollout_logprobs"))  # fmt: skip
    loss.backward()
    return {"loss": loss.detach(), "grad": x.grad, "metrics": {k: float(v) for k, v in metrics.items()}}


def run(case):
    fn = PolicyLossRegistry.get(case["name"])
    if case.get("roundtrip"):  # as SkyRL ships a loss to its registry actor and workers
        fn = ppo_utils.cloudpickle.loads(ppo_utils.cloudpickle.dumps(fn))
    if case.get("expect_error"):
        try:
            _call(fn, case)
        except ValueError as e:
            return {"error": str(e)}
        return {"error": None}
    return _call(fn, case)


def main(src, dst):
    payload = torch.load(src, weights_only=True)
    registered = {}
    for reg in payload.get("register", []):
        registered = plugin.register(reg["objective"], name=reg.get("name"), **reg.get("hparams", {}))
    again = dict(plugin.register())  # a second registration of the defaults changes nothing
    refused = {}
    for key, reg in payload.get("refuse", {}).items():
        try:
            plugin.register(reg["objective"], name=reg.get("name"), **reg.get("hparams", {}))
            refused[key] = None
        except ValueError as e:
            refused[key] = str(e)
    available = PolicyLossRegistry.list_available()
    builtins = {name: PolicyLossRegistry.get(name).__module__ for name in payload.get("builtins", [])}
    results = {
        "skyrl": importlib.metadata.version("skyrl"), "torch": str(torch.__version__), "available": available,
        "registered": dict(registered or plugin.REGISTERED), "builtin_modules": builtins, "refused": refused,
        "registered_again": again,
        "types": {name: type(PolicyLossRegistry.get(name)).__name__ for name in available},
        "cases": {name: run(case) for name, case in payload["cases"].items()},
    }  # fmt: skip
    torch.save(results, dst)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
