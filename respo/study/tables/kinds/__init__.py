"""The built-in kinds of ``respo table``, one module each, registered in the order the command lists them."""

from respo.study.tables.fill_blocks import KIND as _FILL
from respo.study.tables.kinds import breakdown, calib, factorial, headline, mismatch, regime, replay, staleness
from respo.study.tables.registry import register

#: The built-in kinds, in the order of ``respo table``'s choices.
BUILTIN = (calib.KIND, headline.KIND, regime.KIND, staleness.KIND, replay.KIND, factorial.KIND, breakdown.KIND,
           mismatch.KIND, _FILL)
for _kind in BUILTIN:
    register(_kind)
