#!/usr/bin/env bash
# The GPU run of issue 27, in the background on the lent machine (tools/device/step.py --launch):
# prompts the target writes and its answers (data once, with EAGLE-3's layer streams), an EAGLE-3
# head, an MTP head on the same data, each packed to come back; then the engine bench on the GPU.
#
#   bash tools/device/pipeline.sh TARGET NAME EAGLE3_BUDGET_MIN MTP_BUDGET_MIN BENCH_DRAFTERS [train-head options...]
set -euo pipefail
target=$1 name=$2 eb=$3 mb=$4 drafters=$5
shift 5
run=/tmp/vb/runs/$name
mkdir -p "$run"
echo "== $(date +%T) eagle3"
python3 -m vocabbridge train-head --target "$target" --device "${DEVICE:-cuda}" --arch eagle3 --data "$run/data" -o "$run/eagle3" \
    --budget-minutes "$eb" --json "$@" > "$run/eagle3.json"
python3 tools/device/pack.py "$run/eagle3" "$run/pack-eagle3"
kept=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['tokens']['prompts_written_by_target'])" "$run/eagle3.json")
echo "== $(date +%T) mtp (the same data: $kept prompts written by the target)"
args=()
for a in "$@"; do args+=("$a"); done
for i in "${!args[@]}"; do [ "${args[$i]}" = "--magpie" ] && args[$((i + 1))]=$kept; done
python3 -m vocabbridge train-head --target "$target" --device "${DEVICE:-cuda}" --arch mtp --data "$run/data" -o "$run/mtp" \
    --budget-minutes "$mb" --data-share 0.02 --json "${args[@]}" > "$run/mtp.json"
python3 tools/device/pack.py "$run/mtp" "$run/pack-mtp"
echo "== $(date +%T) bench"
d=${drafters//HEADS/$run}
python3 benchmarks/bench_engine_drafters.py --target "$target" --device "${DEVICE:-cuda}" -k 3 --drafters "$d" --out "$run/engine.md"
echo "== $(date +%T) PIPELINE DONE"
