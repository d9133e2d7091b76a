"""Integrations with the frameworks users run at scale (layer 4 of the design).

Each integration lives in its own module behind an optional extra and imports its
framework only when imported itself:

- :mod:`respo.integrations.verl` (extra ``verl``): importing it registers respo's
  objectives with verl's policy-loss registry; ``python -m respo.integrations.verl.main_ppo``
  is verl's ``main_ppo`` with the registration also done inside every Ray worker.
- :mod:`respo.integrations.trl` (extra ``trl``): ``RespoGRPOTrainer``/``RespoGRPOConfig``,
  TRL's ``GRPOTrainer`` with ``loss_type="respo"`` (and the other respo objectives).
- :mod:`respo.integrations.skyrl` (extra ``skyrl``): importing it registers respo's objectives
  in SkyRL's ``PolicyLossRegistry`` (``trainer.algorithm.policy_loss_type=respo``).

This package itself imports nothing, so ``import respo.integrations`` never pulls in verl, TRL or SkyRL.
"""
