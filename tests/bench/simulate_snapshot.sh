#!/usr/bin/env bash
# simulate_snapshot.sh - every policy of the registry simulated on the bundled traces, at
# several cache sizes and prefetch distances, with --json and --decision-log, into one
# folder: run it before and after a change that must not alter any decision (a
# restructuring of the executors or the policy table) and compare the two folders with
# `diff -r`. Timings are left out of the comparison: the JSON's wall-clock fields are
# removed, everything else must be byte-identical.
#
#     tests/bench/simulate_snapshot.sh BUILD_DIR OUT_DIR [WORK_DIR]
#
# The traces: the FLAME-MoE sample (prefill only, ids only, 64 experts top-6), and
# fmoe-tiny recording 40 prompts of datasets/samples/prompts_100.txt with gate
# probabilities, gate inputs and speculative rows (decode-heavy). The fmoe policies get a
# store built from the same trace; promoe and duoserve a predictor trained on it (WORK_DIR
# keeps these inputs between runs: reuse it so that both runs read the same files).
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,16p' "$0"; exit 2; }
repo=$(cd "$(dirname "$0")/../.." && pwd)
fmoe=$(cd "$1" && pwd)/cmd/fmoe
out=$2
work=${3:-$out.inputs}
[ -x "$fmoe" ] || { echo "simulate_snapshot: $fmoe not built" >&2; exit 1; }
mkdir -p "$out" "$work"

if [ ! -f "$work/flame.h5" ]; then
    "$fmoe" trace import --format dense-csv --layers 8 --experts 64 --top-k 6 \
        --tokens-per-request 64 --expert-bytes 6291456 \
        "$repo"/datasets/samples/flame-moe-290m/layer0{2..9}.csv \
        -o "$work/flame.h5" --quiet >/dev/null
    head -40 "$repo/datasets/samples/prompts_100.txt" >"$work/prompts.txt"
    "$fmoe" record --model "$repo/datasets/fmoe-tiny" --dataset "$work/prompts.txt" \
        --max-new-tokens 24 --hidden --speculative 2 --threads 2 --quiet -o "$work/tiny.h5"
    for t in flame tiny; do
        "$fmoe" build-store --trace "$work/$t.h5" -o "$work/$t-store.h5" --quiet >/dev/null
    done
    "$fmoe" train-predictor --kind promoe --trace "$work/tiny.h5" -o "$work/tiny-promoe.h5" \
        --quiet >/dev/null
    "$fmoe" train-predictor --kind duoserve --trace "$work/tiny.h5" -o "$work/tiny-duoserve.h5" \
        --quiet >/dev/null
    "$fmoe" train-predictor --kind duoserve --trace "$work/flame.h5" -o "$work/flame-duoserve.h5" \
        --quiet >/dev/null
fi

# the registry, as `simulate --help` lists it after its "policies:" line
policies=$("$fmoe" simulate --help | sed -n '/^policies:/,$s/^  \([a-z][a-z0-9-]*\)  .*/\1/p' | tr '\n' ' ')
[ -n "$policies" ] || { echo "simulate_snapshot: no policy list in simulate --help" >&2; exit 1; }
n=0
for t in flame tiny; do
    for p in $policies; do
        extra=()
        case $p in
        fmoe*) extra=(--store "$work/$t-store.h5") ;;
        promoe) [ $t = tiny ] || continue; extra=(--predictor "$work/tiny-promoe.h5") ;;
        duoserve) extra=(--predictor "$work/$t-duoserve.h5") ;;
        esac
        for c in 8 24; do
            for d in 0 2; do
                name=$t-$p-c$c-d$d
                # a policy that needs what the trace lacks is refused: the refusal is part
                # of the snapshot too
                if ! "$fmoe" simulate --trace "$work/$t.h5" --policy "$p" --cache-experts $c \
                    --prefetch-distance $d "${extra[@]}" --decision-log "$out/$name.jsonl" \
                    --json --quiet >"$out/$name.json.raw" 2>"$out/$name.err"; then
                    rm -f "$out/$name.json.raw"
                    continue
                fi
                rm -f "$out/$name.err"
                # wall-clock fields differ run to run; every other byte must not
                python3 -c 'import json,sys
def strip(o):
    if isinstance(o, dict):
        return {k: strip(v) for k, v in o.items() if "wall" not in k and "elapsed" not in k and "per_s" not in k}
    if isinstance(o, list):
        return [strip(v) for v in o]
    return o
json.dump(strip(json.load(open(sys.argv[1]))), open(sys.argv[2], "w"), indent=1, sort_keys=True)' \
                    "$out/$name.json.raw" "$out/$name.json"
                rm "$out/$name.json.raw"
                n=$((n + 1))
            done
        done
    done
done
echo "simulate_snapshot: $n runs in $out"
