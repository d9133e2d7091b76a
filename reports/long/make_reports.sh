#!/usr/bin/env bash
# Regenerates every table of reports/long, the tables inside report.md and the recommendation from the
# committed runs.csv files; where the run directories under runs/long exist (the sweeps' --out
# directories; see report.md for the sweep commands), first rewrites each runs.csv and the figures from
# them. Run from the repository root: bash reports/long/make_reports.sh
set -euo pipefail
PY=${PY:-.venv/bin/python}
R=reports/long
# every report links the one kernels figure, reports/kernels.png, instead of writing its own copy
report() { $PY -m respo report --kernels-figure reports/kernels.png "$@"; }

if [ -d runs/long/calib-128 ] && [ -d runs/long/h128 ] && [ -d runs/long/calib-256 ]; then
  # 128 tokens: calibration (64 updates, seed 0), pilot (64 updates, 3 seeds), main cell (256 updates)
  report runs/long/calib-128/runs/*_u64 --out $R/calib-128 --title "Long responses: 128-token calibration"
  report runs/long/calib-128/runs/*_s? --out $R/headline-128 --title "Long responses: 128-token headline pilot" --shared-lr 3e-5
  report runs/long/h128/runs/* --out $R/main-128 --title "Long responses: 128 tokens, N = 32, 256 updates (8 rollout steps)" --shared-lr 3e-5
  # 256 tokens: calibration and headline cell (64 updates; they share one sweep directory)
  report runs/long/calib-256/runs/* --out $R/calib-256 --title "Long responses: 256 tokens" --shared-lr 1e-4
fi
if compgen -G "runs/long/corr-pilot/runs/*_s[34]_u64" > /dev/null; then
  # the staleness corrections' pilot at 128 tokens (its own, rebuilt warm start; not pooled by the long
  # recommendation). Seeds 0-2's run directories are gone: their runs.csv is kept as committed, and seeds
  # 3 and 4 (run later on the same warm start, rebuilt bit for bit) have their own report and runs.csv.
  report runs/long/corr-pilot/runs/*_s[34]_u64 --out $R/corr-pilot-128/seeds-3-4 \
      --title "Staleness corrections at 128 tokens: pilot, seeds 3 and 4" --shared-lr 3e-5
fi
if [ -d runs/long/h128c ]; then
  # the staleness corrections over 8 rollout steps at 128 tokens (256 updates; the corrections' pilot's
  # rebuilt warm start)
  report runs/long/h128c/runs/* --out $R/corr-main-128 \
      --title "Staleness corrections at 128 tokens: N = 32, 256 updates (8 rollout steps)" --shared-lr 3e-5
fi
if [ -d runs/long/h128f ]; then
  # the staleness corrections in the main 128-token cell (256 updates; main-128's warm start, rebuilt with an
  # identical SFT record). Its VESPO run at lr 1e-4, seed 0 is a reproduction check of main-128's (equal in every column) and
  # is left out: main-128/runs.csv holds that seed.
  report $(ls -d runs/long/h128f/runs/* | grep -v '/tiny-dense_vespo_N32_G8_lr0.0001_s0_u256$') \
      --out $R/main-128-corrections \
      --title "Staleness corrections in the 128-token main cell: N = 32, 256 updates (8 rollout steps)" --shared-lr 3e-5
fi
if [ -d runs/long/h128e ]; then
  # decoupled PPO, the crossed ablation and TIS against VESPO at lr 1e-4 (256 updates) from a third 128-token
  # warm start (the same SFT settings built on another machine: another policy, not pooled with the others)
  report runs/long/h128e/runs/* --out $R/corr-1e-4-128 \
      --title "Staleness corrections at lr 1e-4, 128 tokens, N = 32, 256 updates: a third warm start" --shared-lr 1e-4
fi
if [ -d runs/long/h128t ]; then
  # the newer trust regions and rejection rules (DPPO-TV, LUSPO, KL-k3 rejection) against VESPO and TIS at
  # 128 tokens, N = 32, 256 updates, from a fourth 128-token warm start (not pooled with the others)
  report runs/long/h128t/runs/* --out $R/trust-128 \
      --title "Newer trust regions and rejection rules at 128 tokens: N = 32, 256 updates (a fourth warm start)" --shared-lr 3e-5
fi
if [ -d runs/long/h128r ]; then
  # the frameworks' other policy-loss rules (verl's gpg, dro, kl_cov, clip_cov; prime-rl's loss; TRL's two-sided
  # clip) against VESPO at 128 tokens, N = 32, 256 updates, from main-128's start rebuilt on another machine
  report runs/long/h128r/runs/* --out $R/rules-128 \
      --title "The frameworks' other policy-loss rules at 128 tokens: N = 32, 256 updates (8 rollout steps)" --shared-lr 3e-5
fi
if [ -d runs/long/moe128 ]; then
  # the MoE cell at 128 tokens: VESPO, ReSPO and TIS with and without routing replay (tiny-moe warm start)
  report runs/long/moe128/runs/* --out $R/moe-128 --title "MoE at 128 tokens: routing replay" --shared-lr 3e-5
fi
if [ -d runs/long/moe128m ]; then
  # the same MoE cell over 8 rollout steps (256 updates; the same tiny-moe warm start, rebuilt with an identical SFT record)
  report runs/long/moe128m/runs/* --out $R/moe-128-main \
      --title "MoE at 128 tokens: routing replay, N = 32, 256 updates (8 rollout steps)" --shared-lr 3e-5
fi

# tables from runs.csv (the run directories are not needed)
$PY -m respo table calib $R/calib-128/runs.csv > $R/calib-128/table.md
$PY -m respo table headline $R/headline-128/runs.csv > $R/headline-128.md
$PY -m respo table headline $R/main-128/runs.csv > $R/main-128/table.md
$PY -m respo table calib $R/calib-256/runs.csv > $R/calib-256/table.md
$PY -m respo table headline $R/calib-256/runs.csv --reuse 32 --lrs 1e-4 > $R/calib-256/headline.md
$PY -m respo table fill $R/report.md
$PY -m respo table fill $R/corr-pilot-128/README.md
$PY -m respo table fill $R/corr-main-128/README.md
$PY -m respo table fill $R/main-128-corrections/README.md
$PY -m respo table fill $R/corr-1e-4-128/README.md
$PY -m respo table fill $R/trust-128/README.md
$PY -m respo table fill $R/rules-128/README.md
$PY -m respo table fill $R/moe-128/README.md
$PY -m respo table fill $R/moe-128-main/README.md

# which objective to use, per response length x N (32 tokens: the staleness study; "128": the long report's
# 128-token cells, the corrections' runs on the same warm start included; "128 (rebuilt)": the corrections'
# cells on another warm start), dense then MoE
{
  echo "# Which objective to use, by response length × N"
  echo
  echo "Written by reports/long/make_reports.sh from the committed runs.csv files. \"128 (rebuilt)\" marks"
  echo "the staleness corrections' first cells, which start from another 128-token warm start than the other"
  echo "128-token cells; the corrections were then also run from the long report's own 128-token warm start (\"128\")."
  echo "\"128 (third)\" is the cell at lr 1e-4 from a third warm start (the same settings built on a third machine);"
  echo "\"128 (fourth)\" is the newer trust regions' cell, from a fourth warm start with VESPO and TIS run again on it;"
  echo "\"128 (rules)\" is the frameworks' other rules' cell, from main-128's start trained on another machine, with VESPO run again."
  echo
  echo "## Dense (tiny-dense)"
  echo
  $PY -m respo recommend 32=reports/staleness/runs.csv 128=$R/headline-128/runs.csv 128=$R/main-128/runs.csv \
      128=$R/main-128-corrections/runs.csv \
      128:rebuilt=$R/corr-pilot-128/runs.csv 128:rebuilt=$R/corr-pilot-128/seeds-3-4/runs.csv \
      128:rebuilt=$R/corr-main-128/runs.csv 128:third=$R/corr-1e-4-128/runs.csv 128:fourth=$R/trust-128/runs.csv \
      128:rules=$R/rules-128/runs.csv 256=$R/calib-256/runs.csv
  echo
  echo "## Mixture of experts (tiny-moe), without routing replay"
  echo
  $PY -m respo recommend --model tiny-moe 128=$R/moe-128/runs.csv 128=$R/moe-128-main/runs.csv
  echo
  echo "## Mixture of experts (tiny-moe), with routing replay"
  echo
  $PY -m respo recommend --model tiny-moe --routing-replay 128=$R/moe-128/runs.csv 128=$R/moe-128-main/runs.csv
} > $R/recommend.md
