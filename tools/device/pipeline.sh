#!/usr/bin/env bash
# The GPU run of issue 27, in the background on the lent machine (tools/device/step.py --launch):
# one train-head run: prompts the target writes and its answers (generated once, kept in GPU memory,
# with EAGLE-3's layer streams), an EAGLE-3 head and an MTP head on them, each packed to come back;
# then the engine bench on the GPU with both heads.
#
#   bash tools/device/pipeline.sh TARGET NAME BUDGET_MIN BENCH_DRAFTERS [train-head options...]
#   (BENCH_DRAFTERS: HEADS stands for the run's folder, e.g. none,ngram,mtp:HEADS/mtp)
set -euo pipefail
target=$1 name=$2 budget=$3 drafters=$4
shift 4
run=/tmp/vb/runs/$name
mkdir -p "$run"
echo "== $(date +%T) train-head eagle3,mtp"
python3 -m vocabbridge train-head --target "$target" --device "${DEVICE:-cuda}" --arch eagle3,mtp --data "$run/data" \
    -o "$run/eagle3" -o "$run/mtp" --budget-minutes "$budget" --json "$@" > "$run/heads.json"
for h in eagle3 mtp; do python3 tools/device/pack.py "$run/$h" "$run/pack-$h"; done
echo "== $(date +%T) bench"
d=${drafters//HEADS/$run}
python3 benchmarks/bench_engine_drafters.py --target "$target" --device "${DEVICE:-cuda}" -k 3 --drafters "$d" --out "$run/engine.md" ${BENCH_ARGS:-}
echo "== $(date +%T) PIPELINE DONE"
