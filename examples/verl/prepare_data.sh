#!/usr/bin/env bash
# Write verl/DAPO-format parquet (train.parquet, test.parquet) for examples/verl/run_paper.sh.
#
# Usage:
#   examples/verl/prepare_data.sh OUT_DIR JSONL [--problem-key problem --answer-key answer]
#       a local JSONL with one math problem per line (e.g. DAPO-Math-17k exported to JSONL)
#   examples/verl/prepare_data.sh OUT_DIR --arithmetic 4096
#       procedurally generated 3-digit additions, for smoke tests (nothing is downloaded)
#
# Rows use data_source "math_dapo", so verl's default reward scores +1 (correct) / -1 (incorrect).
set -euo pipefail

if [[ $# -lt 2 ]]; then
  sed -n '2,10p' "$0"
  exit 2
fi
OUT_DIR="$1"; shift
PYTHON="${PYTHON:-python3}"
if [[ "$1" == --arithmetic ]]; then
  exec "$PYTHON" -m respo.integrations.verl.prepare_data --out-dir "$OUT_DIR" "$@"
fi
JSONL="$1"; shift
exec "$PYTHON" -m respo.integrations.verl.prepare_data --out-dir "$OUT_DIR" --jsonl "$JSONL" "$@"
