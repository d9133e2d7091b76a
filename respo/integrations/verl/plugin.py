"""verl's ``verl.plugins`` entry point: ``import verl`` loads this module (respo's package metadata names it),
which registers respo's policy losses, so ``loss_mode=respo`` works in a verl process without a code change
or ``VERL_USE_EXTERNAL_MODULES``.

verl logs a plugin that fails to load at DEBUG only, so a registration that fails here says so in a
warning naming the error, and verl goes on without respo's losses.
"""

from __future__ import annotations

import sys
import warnings


def load() -> None:
    """Register respo's losses with verl (idempotent); on failure, a `RuntimeWarning` naming the error.

    When it is ``import respo.integrations.verl`` that imports verl (and so this plugin), that module is still
    being initialised here and registers the losses itself once it is: nothing is done, nothing is said."""
    partial = sys.modules.get("respo.integrations.verl")
    if partial is not None and not hasattr(partial, "register"):
        return
    try:
        from respo.integrations.verl import register

        register()
    except Exception as e:  # noqa: BLE001 - any failure is said here, not lost in verl's DEBUG log
        warnings.warn(f"respo could not register its policy losses with verl ({type(e).__name__}: {e}); "
                      "loss_mode=respo and respo's other losses are not available in this process",
                      RuntimeWarning, stacklevel=2)


load()
