#!/usr/bin/env bash
# Regenerates every table of reports/real from the committed calib/runs.csv; given run directories (or the
# calibration sweep's --out directory), first rewrites calib/report.md, its figures and calib/runs.csv from them.
# Run from the repository root:
#   bash reports/real/make_reports.sh                                    # tables only, from calib/runs.csv
#   bash reports/real/make_reports.sh runs/real/calib/runs/*             # report, runs.csv and tables from runs
#   CELLS=calib-b1 bash reports/real/make_reports.sh runs/real/calib-b1/runs/*   # the B = 1 probe of N = 32
#   CELLS=pilot-b1 bash reports/real/make_reports.sh runs/real/pilot-b1          # the pilot (its sweep directory)
#   the 2 x 2 study of the branches: one report per starting policy, made as its page (branches/README.md) says
# TITLE overrides the report's first heading; CELLS names the folder under reports/real (default calib).
set -euo pipefail
PY=${PY:-.venv/bin/python}
R=reports/real
CELLS=${CELLS:-calib}
TITLE=${TITLE:-"Real model (SmolLM2-135M-Instruct): regime calibration"}

if [ "$#" -gt 0 ]; then
  $PY -m respo report "$@" --out $R/$CELLS --kernels-figure reports/kernels.png --title "$TITLE"
fi

# tables from runs.csv (the run directories are not needed): the blocks of README.md and calib/table.md
$PY -m respo table fill $R/README.md $R/calib/table.md
# the 2 x 2 study's page (regenerated from branches/runs.csv as its seeds finish)
$PY -m respo table fill $R/branches/README.md
