#!/usr/bin/env bash
# The GPU heal of issue 28, in the background on the lent machine (tools/device/step.py --launch):
# the target writes prompts and answers at the GPU's scale (train-head's data path: --magpie, bf16,
# top-k soft labels; an MTP head is trained on the side from the same data, a few epochs), the
# drafter is transplanted onto the target's tokenizer, a copy is healed on those answers (its new
# rows, then the whole model for WHOLE of the steps), both are benched on the GPU beside the
# drafter's other modes, and the healed weights are packed to come back (tools/device/pack.py).
# On a GPU train-head keeps EAGLE-3 data in memory, but an MTP head's it writes as shards, which the
# heal reads whole (--heal-data: a given folder's shards are taken as they are).
#
#   [WHOLE=0.3] [K=4] bash tools/device/heal.sh TARGET DRAFTER NAME HEAL_MIN [train-head options...]
#   e.g. bash tools/device/heal.sh qwen2.5-coder-1.5b smollm2-135m q15heal 8 --magpie 20000 --new-tokens 200 --epochs 1
#
# HEAL_MIN is the healing's own budget (its data are on disk by then); train-head's --budget-minutes
# and --magpie size the data. What comes back ($run/pack-healed: weights-NN.safetensors, each at most
# 15 MiB, fetch them in calls of at most 8 files; tools/device/pack.py --unpack --file model.safetensors)
# replaces the tensors of a zero-shot transplant made here with the same command, which is
# deterministic: `vocabbridge transplant DRAFTER --to TARGET -o drafters/NAME`.
#
# DATA=FOLDER: heal on data written elsewhere (a CPU heal's --heal-data folder, made small by
# tools/device/slim_data.py) instead of the target's: no train-head, no bench, and TARGET may then be
# a weightless folder of the target's tokenizer, config and generation config (the transplant reads
# no target weights with --init mean), so that only the drafter's GGUF need travel.
set -euo pipefail
target=$1 drafter=$2 name=$3 minutes=$4
shift 4
run=/tmp/vb/runs/$name
mkdir -p "$run"
# Both models resolve before minutes of data are spent (a missing part fails here, not at the transplant).
python3 -m vocabbridge transplant "$drafter" --to "$target" --plan-only --format json > "$run/plan.json"
if [ -n "${DATA:-}" ]; then
    data=$DATA
else
    data=$run/data
    echo "== $(date +%T) data: the target's prompts and answers (train-head), an MTP head on the side"
    python3 -m vocabbridge train-head --target "$target" --device "${DEVICE:-cuda}" --arch mtp --data "$data" \
        -o "$run/mtp" --json "$@" > "$run/mtp.json"
fi
echo "== $(date +%T) transplant"
python3 -m vocabbridge transplant "$drafter" --to "$target" -o "$run/zero-shot" --overwrite --format json > "$run/transplant.json"
rm -rf "$run/healed"
cp -r "$run/zero-shot" "$run/healed"
echo "== $(date +%T) heal for $minutes minutes"
python3 -m vocabbridge transplant "$drafter" --to "$target" -o "$run/healed" --heal-only --heal-data "$data" \
    --heal-minutes "$minutes" --heal-whole "${WHOLE:-0}" --format json > "$run/heal.json"
python3 tools/device/pack.py --file model.safetensors --changed "$run/zero-shot" "$run/healed" "$run/pack-healed"
echo "== $(date +%T) PACKED: $(ls "$run/pack-healed" | wc -l) files in $run/pack-healed"
[ -n "${DATA:-}" ] && { echo "== $(date +%T) HEAL DONE (given data: no target here to bench with)"; exit 0; }
echo "== $(date +%T) bench"
python3 benchmarks/bench_engine_drafters.py --target "$target" --device "${DEVICE:-cuda}" -k "${K:-4}" \
    --drafters "${BENCH_DRAFTERS:-none,ngram,$drafter:text,$run/zero-shot,$run/healed,$run/healed:ngram+draft,mtp:$run/mtp}" \
    --out "$run/engine.md" ${BENCH_ARGS:-}
echo "== $(date +%T) HEAL DONE"
