"""AReaL's side of tests/integrations/test_crosscheck_areal.py: AReaL's own functions on the cases given.

Run by the .venv-areal interpreter as ``python areal_side.py <in.pt> <out.pt>``; imports AReaL and torch
only (not respo). Each case names the AReaL function and carries its tensors and settings:

  loglinear   areal.trainer.ppo.actor.compute_prox_logp_approximations(method="loglinear")
  ppo         areal.utils.functional.ppo_actor_loss_fn (decoupled: proximal and behaviour log-probs,
              RejectionSamplingConfig for the cap), its loss, the gradient wrt logprobs and its stats
  grpo        areal.trainer.ppo.actor.grpo_loss_fn, the actor's loss (prox_logp_method, versions, ...)
  m2po_mask   areal.trainer.ppo.actor._apply_m2po_masking (the mask grpo_loss_fn applies for m2_threshold)
"""

import importlib.metadata
import sys

import torch
from areal.api.cli_args import RejectionSamplingConfig
from areal.trainer.ppo.actor import _apply_m2po_masking, compute_prox_logp_approximations, grpo_loss_fn
from areal.utils.functional import ppo_actor_loss_fn


def _rejection(case):
    rs = case.get("rejection")
    return None if rs is None else RejectionSamplingConfig(**rs)


def _with_grad(x):
    return x.clone().requires_grad_(True)


def run(case):
    kind = case["kind"]
    if kind == "loglinear":
        out = compute_prox_logp_approximations(case["old_logp"], case["logprobs"], case["versions"],
                                               case["current_version"], method="loglinear")  # fmt: skip
        return {"prox_logp": out["loglinear"]}
    if kind == "ppo":
        x = _with_grad(case["logprobs"])
        loss, stat = ppo_actor_loss_fn(
            logprobs=x, proximal_logprobs=case["prox_logp"], old_logprobs=case["old_logp"],
            advantages=case["advantages"], eps_clip=case["eps_clip"], eps_clip_higher=case["eps_clip_higher"],
            c_clip=case["c_clip"], loss_mask=case["loss_mask"], rejection_sampling=_rejection(case),
        )  # fmt: skip
        loss.backward()
        return {"loss": loss.detach(), "grad": x.grad, "clip_mask": stat["clip_mask"],
                "dual_clip_mask": stat["dual_clip_mask"], "behave_mask": stat["behave_mask"],
                "filtered_fraction": torch.tensor(float(stat["filtered_fraction"]), dtype=torch.float64)}  # fmt: skip
    if kind == "grpo":
        x = _with_grad(case["logprobs"])
        data = {"logprobs": case["old_logp"], "advantages": case["advantages"], "loss_mask": case["loss_mask"],
                "versions": case["versions"]}  # fmt: skip
        if case.get("prox_logp") is not None:
            data["prox_logp"] = case["prox_logp"]
        loss = grpo_loss_fn(
            x, torch.zeros_like(x.detach()), data, eps_clip=case["eps_clip"], eps_clip_higher=case["eps_clip_higher"],
            c_clip=case["c_clip"], rejection_sampling=_rejection(case), m2_threshold=case.get("m2_threshold"),
            current_version=case["current_version"], prox_logp_method=case["prox_logp_method"],
            use_decoupled_loss=True,
        )  # fmt: skip
        loss.backward()
        return {"loss": loss.detach(), "grad": x.grad}
    if kind == "m2po_mask":
        keep = _apply_m2po_masking(case["old_logp"], case["prox_logp"], case["loss_mask"], case["m2_threshold"])
        return {"keep": keep}
    raise ValueError(f"unknown case kind {kind!r}")


def main(src, dst):
    cases = torch.load(src, weights_only=True)
    results = {"areal": importlib.metadata.version("areal"), "torch": str(torch.__version__),
               "cases": {name: run(case) for name, case in cases.items()}}  # fmt: skip
    torch.save(results, dst)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
