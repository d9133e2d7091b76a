#!/usr/bin/env bash
# The real-model regime calibration (configs/real/regime.toml says what each cell is for), resumable:
# re-running this script continues every sweep where it stopped. Run it from a worktree at a fixed commit:
#
#   git worktree add ../calib HEAD && cd ../calib && ln -s ../main/.venv ../main/.venv-vllm . \
#       && nohup scripts/real_regime_calib.sh > regime.log 2>&1 &
#
# Step 0 builds the warm start once (float32 where the CPU emulates bfloat16: the sft's dtype auto), then two
# lanes of one process each: lane A the staleness cells, lane B the on-policy controls and then regime M.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-runs/real}
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
mkdir -p "$OUT"
COMMON=(--preset calibrate --config configs/real/regime.toml --objectives vespo --jobs 1
        --set model=smollm2-135m-instruct)

"$PY" -m respo sft --model smollm2-135m-instruct --task worded_addition --threads 2 \
    --record "$OUT/regime-warm-start.json"

lane_a() {
    "$PY" -m respo sweep "${COMMON[@]}" --reuse 8 --updates 16 --lrs 1e-5,3e-6 --seeds 0 --out "$OUT/regime-s"
    "$PY" -m respo sweep "${COMMON[@]}" --reuse 32 --updates 32 --lrs 3e-6 --seeds 0 --out "$OUT/regime-s"
}
lane_b() {
    "$PY" -m respo sweep "${COMMON[@]}" --reuse 1 --updates 24 --lrs 1e-5,3e-6 --seeds 1 --set eval_prompts=128 \
        --out "$OUT/regime-control"
    "$PY" -m respo sweep "${COMMON[@]}" --reuse 8 --updates 16 --lrs 1e-6 --seeds 0 --set engine_dtype=bfloat16 \
        --set rollout_bypass=true --out "$OUT/regime-m"
}
lane_a > "$OUT/regime-lane-a.log" 2>&1 &
a=$!
lane_b > "$OUT/regime-lane-b.log" 2>&1 &
b=$!
status=0
wait $a || status=1
wait $b || status=1
exit $status
