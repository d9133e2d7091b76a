#!/usr/bin/env bash
# The real-model regime study, regime S (reports/real/regime/preregistration.md), resumable: re-running this
# script continues where it stopped (finished runs are skipped, a started run resumes from its checkpoint).
# Run it from a worktree at the commit that added the design:
#
#   git worktree add ../study <commit> && cd ../study && ln -s ../main/.venv ../main/.venv-vllm . \
#       && nohup scripts/real_regime_study.sh > study.log 2>&1 &
#
# Two lanes of one process each, seed by seed: lane A the arms respo and vespo, lane B the two mixed arms;
# a seed's lanes both finish before the next seed starts, so a study stopped part-way holds whole seeds.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-runs/real}
SEEDS=${SEEDS:-"0 1 2 3 4 5 6 7"}
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
COMMON=(--preset ablation --config configs/real/regime.toml --reuse 8 --updates 16 --lrs 1e-5 --jobs 1
        --set eval_prompts=128 --set model=smollm2-135m-instruct)
for seed in $SEEDS; do
    "$PY" -m respo sweep "${COMMON[@]}" --objectives respo,vespo --seeds "$seed" --out "$OUT/regime-study-a" \
        >> "$OUT/regime-study-lane-a.log" 2>&1 &
    a=$!
    "$PY" -m respo sweep "${COMMON[@]}" --objectives respo+/vespo-,vespo+/respo- --seeds "$seed" \
        --out "$OUT/regime-study-b" >> "$OUT/regime-study-lane-b.log" 2>&1 &
    b=$!
    wait $a
    wait $b
done
