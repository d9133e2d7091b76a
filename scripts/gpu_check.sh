#!/usr/bin/env bash
# Check respo on a CUDA machine: the CUDA tests, the precision / compile / step / sampler benchmarks
# on the GPU at modest sizes, and a small sweep at --jobs 8 and 16 (runs per hour), everything
# written under OUT_DIR.
#
#   scripts/gpu_check.sh OUT_DIR            # on a machine with CUDA
#   DEVICE=cpu scripts/gpu_check.sh OUT_DIR # the same steps, reduced, on the CPU (checks the script)
#
# Environment: DEVICE (default cuda), PYTHON (default .venv/bin/python, else python3),
# JOBS (default "8 16"; "2" when DEVICE=cpu). Each step's output goes to OUT_DIR/<step>.{jsonl,log};
# OUT_DIR/summary.txt lists every step with its exit code and seconds; the script exits non-zero
# when a step failed.
set -uo pipefail

OUT=${1:?usage: scripts/gpu_check.sh OUT_DIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.."
DEVICE=${DEVICE:-cuda}
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export MPLCONFIGDIR=$OUT/.mpl TORCHINDUCTOR_CACHE_DIR=$OUT/.inductor

if [ "$DEVICE" = cpu ]; then  # reduced sizes: the script's own check
  JOBS=${JOBS:-2}; LENGTHS="32 256"; ROWS=16; BATCH=16; NEW="32"; STEPS=5; SWEEP_UPDATES=2; SEEDS=0  # 4 runs
  COMPILE_LENGTHS="32"; TEST_MARK="not slow"; REPEATS=2
else
  JOBS=${JOBS:-"8 16"}; LENGTHS="32 256 1024"; ROWS=64; BATCH="64 256"; NEW="256 1024"; STEPS=20
  SWEEP_UPDATES=16; SEEDS=0,1,2,3  # 2 objectives x 2 N x 4 seeds = 16 runs
  COMPILE_LENGTHS="32 256"; TEST_MARK=""; REPEATS=3
fi
: > "$OUT/summary.txt"
status=0

step() {  # step NAME OUTFILE COMMAND...: run, record exit code and seconds
  local name=$1 out=$2; shift 2
  local t0=$SECONDS
  echo "[gpu_check] $name: $*" | tee -a "$OUT/summary.txt"
  "$@" > "$out" 2> "$OUT/$name.err"
  local rc=$?
  echo "[gpu_check] $name rc=$rc $((SECONDS - t0)) s" | tee -a "$OUT/summary.txt"
  [ $rc -eq 0 ] || status=1
}

"$PYTHON" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')" | tee -a "$OUT/summary.txt"

# 1. tests: the CUDA ones (skipped where CUDA is missing) and the precision / micro-batch ones
step tests "$OUT/tests.log" "$PYTHON" -m pytest -q -rs -m "$TEST_MARK" tests/train/test_device_precision.py tests/runtime/test_sampler.py

# 2. benchmarks (JSON lines; compilation is step 4)
step bench_precision "$OUT/bench_precision.jsonl" "$PYTHON" benchmarks/bench_precision.py --device "$DEVICE" \
  --lengths $LENGTHS --rows "$ROWS" --init-range 0.02 0.1
step bench_step "$OUT/bench_step.jsonl" "$PYTHON" benchmarks/bench_step.py --device "$DEVICE" --presets tiny-dense \
  --skip-trl --skip-step --train-batch "$ROWS" --steps 3
for dtype in float32 bfloat16; do
  step "bench_sampler_$dtype" "$OUT/bench_sampler_$dtype.jsonl" "$PYTHON" benchmarks/bench_sampler.py \
    --device "$DEVICE" --dtype "$dtype" --presets tiny-dense --batch $BATCH --new-tokens $NEW --repeats "$REPEATS" --skip-generate
done

# 3. sweeps: the quick preset's runs, K at a time on one device; runs per hour from the wall time
for K in $JOBS; do
  dir="$OUT/sweep_jobs$K"
  t0=$(date +%s.%N)
  step "sweep_jobs$K" "$OUT/sweep_jobs$K.log" "$PYTHON" -m respo sweep --preset quick --out "$dir" --jobs "$K" \
    --device "$DEVICE" --updates "$SWEEP_UPDATES" --seeds "$SEEDS" --reuse 1,4 --no-prewarm
  t1=$(date +%s.%N)
  runs=$(ls -d "$dir"/runs/*/ 2>/dev/null | wc -l)
  done_runs=$(ls "$dir"/runs/*/summary.json 2>/dev/null | wc -l)
  "$PYTHON" -c "import json,sys; r, d, s, k, dev = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), sys.argv[5]; print(json.dumps({'device': dev, 'jobs': k, 'runs': r, 'finished': d, 'wall_s': round(s, 1), 'runs_per_hour': round(d / s * 3600, 1)}))" \
    "$runs" "$done_runs" "$(awk "BEGIN {print $t1 - $t0}")" "$K" "$DEVICE" | tee -a "$OUT/summary.txt" > "$OUT/sweep_jobs$K.jsonl"
done

# 4. compilation last: on a GPU it can take minutes, and a check cut by a time limit keeps everything before it
step bench_compile "$OUT/bench_compile.jsonl" "$PYTHON" benchmarks/bench_compile.py --device "$DEVICE" \
  --max-new-tokens $COMPILE_LENGTHS --rows "$ROWS" --steps "$STEPS"

echo "[gpu_check] done, status $status; outputs in $OUT" | tee -a "$OUT/summary.txt"
exit $status
