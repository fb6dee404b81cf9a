#!/usr/bin/env bash
# The GPU run of issue 27, in the background on the lent machine (tools/device/step.py --launch):
# one train-head run: prompts the target writes and its answers (generated once, kept in GPU memory,
# with EAGLE-3's layer streams), the heads of ARCHS (default eagle3,mtp) on them, each packed to come
# back; then the engine bench on the GPU with them.
#
#   [ARCHS=eagle3,peagle] [K=4] bash tools/device/pipeline.sh TARGET NAME BUDGET_MIN BENCH_DRAFTERS [train-head options...]
#   (BENCH_DRAFTERS: HEADS stands for the run's folder, each head in HEADS/ARCH, e.g. none,ngram,mtp:HEADS/mtp); K: the bench's draft length (3)
set -euo pipefail
target=$1 name=$2 budget=$3 drafters=$4
shift 4
run=/tmp/vb/runs/$name
mkdir -p "$run"
archs=${ARCHS:-eagle3,mtp}
outs=()
for h in ${archs//,/ }; do outs+=(-o "$run/$h"); done
echo "== $(date +%T) train-head $archs"
python3 -m vocabbridge train-head --target "$target" --device "${DEVICE:-cuda}" --arch "$archs" --data "$run/data" \
    "${outs[@]}" --budget-minutes "$budget" --json "$@" > "$run/heads.json"
for h in ${archs//,/ }; do python3 tools/device/pack.py "$run/$h" "$run/pack-$h"; done
echo "== $(date +%T) bench"
d=${drafters//HEADS/$run}
python3 benchmarks/bench_engine_drafters.py --target "$target" --device "${DEVICE:-cuda}" -k "${K:-3}" --drafters "$d" --out "$run/engine.md" ${BENCH_ARGS:-}
echo "== $(date +%T) PIPELINE DONE"
