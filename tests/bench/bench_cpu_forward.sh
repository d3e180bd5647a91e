#!/bin/sh
# bench_cpu_forward.sh - prefill and decode tokens/s of fmoe's CPU forward pass on the
# bundled fmoe-tiny and on a ~1B-parameter random Mixtral-layout model, and, where a
# llama.cpp build is at hand, of llama.cpp on the same GGUF files as a ratio: bf16, Q8_0
# and Q4_K_M (llama-quantize's mix of Q4_K and Q6_K).
#
#   tests/bench/bench_cpu_forward.sh [--threads N[,N...]] [--types LIST] [--prompt P]
#                                    [--gen G] [--repeat R] [--skip-1b] [--q8-activations]
#                                    [--llama-cpp DIR]
#
# FMOE_BUILD_DIR   meson build with tests/model/forward_driver and cmd/fmoe (default: build)
# PYTHON           a Python with numpy (and torch + transformers for the GGUF conversion);
#                  default: .venv/bin/python when present
# BENCH_WORK       keep the converted models there (reused by the next run); default: a
#                  temporary folder, removed at the end
# --threads        thread counts, each run for every model and type (default: nproc)
# --types LIST     comma-separated, of bf16, q8_0, q4_k_m (default: all three). bf16: fmoe
#                  runs the checkpoint folder, llama.cpp its bf16 GGUF (the same weights).
#                  q8_0 and q4_k_m: both run one GGUF file, made from the bf16 GGUF by
#                  llama-quantize (Q8_0 without llama.cpp: `fmoe quantize --type q8_0`;
#                  q4_k_m needs llama-quantize)
# --q8-activations also times fmoe with --activations q8 on the quantized types
#                  (8-bit activations and integer dots, llama.cpp's scheme; row "fmoe-a8")
# --llama-cpp DIR  a llama.cpp source tree (for convert_hf_to_gguf.py and gguf-py) whose
#                  build/bin holds llama-bench and llama-quantize. Debian bookworm packages
#                  no llama.cpp; the source ships inside PyPI's llama-cpp-python sdist
#                  (vendor/llama.cpp; its CHANGELOG names the llama.cpp commit):
#                    pip download --no-deps --no-binary :all: llama-cpp-python -d /tmp/l
#                    tar xzf /tmp/l/llama_cpp_python-*.tar.gz -C /tmp/l
#                    cmake -S .../vendor/llama.cpp -B .../vendor/llama.cpp/build \
#                      -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DGGML_NATIVE=ON
#                    cmake --build .../build --target llama-bench llama-quantize -j2
#
# What is measured: fmoe through tests/model/forward_driver --bench (prefill: one forward
# call over P prompt tokens, logits of the last one only, as llama-bench computes them;
# decode: G-1 single-token steps after it), llama.cpp through
# llama-bench (pp P: prefill of P tokens; tg G: G single-token steps from an empty
# context). Both use the same thread count and one discarded warm-up run (the weights are
# paged in from disk on first use); then R rounds, each one fmoe run followed by one
# llama-bench run, so that load from other jobs hits both sides alike, and the best of
# each. The machine may be shared: expect noise of 2x and more while other jobs run.
# Ratio = fmoe / llama.cpp (above 1: fmoe is faster).
set -eu

REPO=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${FMOE_BUILD_DIR:-$REPO/build}
PYTHON=${PYTHON:-}
[ -n "$PYTHON" ] || { [ -x "$REPO/.venv/bin/python" ] && PYTHON=$REPO/.venv/bin/python || PYTHON=python3; }
THREADS_LIST=$(nproc)
TYPES=bf16,q8_0,q4_k_m
PROMPT=128
GEN=32
REPEAT=3
SKIP_1B=0
ACT8=0
LLAMA=""
usage() { echo "bench_cpu_forward.sh: $1 (see --help)" >&2; exit 2; }
while [ $# -gt 0 ]; do
    case "$1" in
    --threads) [ $# -ge 2 ] || usage "--threads needs a value"; THREADS_LIST=$2; shift 2 ;;
    --types) [ $# -ge 2 ] || usage "--types needs a value"; TYPES=$2; shift 2 ;;
    --prompt) [ $# -ge 2 ] || usage "--prompt needs a value"; PROMPT=$2; shift 2 ;;
    --gen) [ $# -ge 2 ] || usage "--gen needs a value"; GEN=$2; shift 2 ;;
    --repeat) [ $# -ge 2 ] || usage "--repeat needs a value"; REPEAT=$2; shift 2 ;;
    --skip-1b) SKIP_1B=1; shift ;;
    --q8-activations) ACT8=1; shift ;;
    --llama-cpp) [ $# -ge 2 ] || usage "--llama-cpp needs a value"; LLAMA=$2; shift 2 ;;
    -h|--help) sed -n '2,42p' "$0"; exit 0 ;;
    *) usage "unknown option $1" ;;
    esac
done
for t in $(echo "$TYPES" | tr ',' ' '); do
    case "$t" in bf16|q8_0|q4_k_m) ;; *) usage "--types: unknown type $t (bf16, q8_0, q4_k_m)" ;; esac
done
for n in $(echo "$THREADS_LIST" | tr ',' ' '); do
    case "$n" in ''|*[!0-9]*|0) usage "--threads: $n is not a positive integer" ;; esac
done
DRIVER=$BUILD/tests/model/forward_driver
FMOE=$BUILD/cmd/fmoe
[ -x "$DRIVER" ] || { echo "bench_cpu_forward.sh: $DRIVER not built (set FMOE_BUILD_DIR)" >&2; exit 1; }
BENCH=""
QUANTIZE=""
if [ -n "$LLAMA" ]; then
    BENCH=$LLAMA/build/bin/llama-bench
    QUANTIZE=$LLAMA/build/bin/llama-quantize
    [ -x "$BENCH" ] || { echo "bench_cpu_forward.sh: $BENCH not built" >&2; exit 1; }
fi
WORK=${BENCH_WORK:-$(mktemp -d /tmp/fmoe-bench.XXXXXX)}
mkdir -p "$WORK"

TOKENS=$("$PYTHON" -c "print(','.join(str(1 + (i * 37) % 4000) for i in range($PROMPT)))")

# fmoe_once MODEL THREADS ACTIVATIONS: one timed run (--activations f32 or q8), prints
# "prefill decode" tokens/s.
fmoe_once() {
    "$DRIVER" "$1" --tokens "$TOKENS" --generate "$GEN" --threads "$2" --activations "$3" --bench |
        "$PYTHON" -c "import json,sys; d=json.load(sys.stdin); print(d['prefill_tok_s'], d['decode_tok_s'])"
}

# llama_once GGUF THREADS: one llama-bench round, prints "prefill decode" tokens/s.
llama_once() {
    "$BENCH" -m "$1" -p "$PROMPT" -n "$GEN" -t "$2" -r 1 -o json 2>/dev/null | "$PYTHON" -c "
import json, sys
rows = json.load(sys.stdin)
pp = max(r['avg_ts'] for r in rows if r['n_prompt'] > 0)
tg = max(r['avg_ts'] for r in rows if r['n_gen'] > 0)
print(pp, tg)"
}

# to_gguf HF_DIR OUT: bf16 GGUF through llama.cpp's converter. Its BPE pre-tokenizer check
# knows only published tokenizers; fmoe-tiny's is GPT-2's ByteLevel regex, so "gpt-2".
to_gguf() {
    "$PYTHON" - "$LLAMA" "$1" "$2" <<'EOF'
import sys
llama, src, out = sys.argv[1:4]
sys.path[:0] = [llama, llama + "/gguf-py"]
import convert_hf_to_gguf as c
try:  # newer trees keep the model classes in conversion/
    from conversion.base import TextModel
except ImportError:
    TextModel = c.TextModel
TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
sys.argv = ["convert_hf_to_gguf.py", src, "--outtype", "bf16", "--outfile", out]
c.main()
EOF
}

# model_file NAME HF_DIR TYPE: prints the file fmoe runs for TYPE (making it if needed),
# or nothing with a note on stderr when it cannot be made.
model_file() {
    name=$1
    dir=$2
    bf16=$WORK/$name.bf16.gguf
    if [ -n "$LLAMA" ] && [ ! -f "$bf16" ]; then
        to_gguf "$dir" "$bf16" > "$WORK/$name.convert.log" 2>&1 || {
            rm -f "$bf16"
            echo "$name: GGUF conversion failed, see $WORK/$name.convert.log" >&2
        }
    fi
    case "$3" in
    bf16) echo "$dir" ;;
    q8_0|q4_k_m)
        out=$WORK/$name.$3.gguf
        if [ ! -f "$out" ]; then
            up=$(echo "$3" | tr a-z A-Z)
            if [ -n "$QUANTIZE" ] && [ -x "$QUANTIZE" ] && [ -f "$bf16" ]; then
                "$QUANTIZE" "$bf16" "$out.partial" "$up" > "$WORK/$name.$3.log" 2>&1 &&
                    mv "$out.partial" "$out" ||
                    echo "$name: llama-quantize $up failed, see $WORK/$name.$3.log" >&2
            elif [ "$3" = q8_0 ]; then
                "$FMOE" quantize --type q8_0 "$dir" -o "$out" --quiet >&2 ||
                    echo "$name: fmoe quantize --type q8_0 failed" >&2
            else
                echo "$name: q4_k_m needs llama-quantize (--llama-cpp DIR)" >&2
            fi
        fi
        [ -f "$out" ] && echo "$out" || true
        ;;
    esac
}

# bench NAME TYPE MODEL GGUF THREADS: warm-up, REPEAT interleaved rounds, the report.
bench() {
    name=$1
    type=$2
    model=$3
    gguf=$4
    th=$5
    a8=0
    [ "$ACT8" = 1 ] && [ "$type" != bf16 ] && a8=1
    # discarded runs: page the weights in, so the first timed run is not a disk read
    "$DRIVER" "$model" --tokens "$TOKENS" --generate 2 --threads "$th" --bench > /dev/null
    [ -z "$gguf" ] || "$BENCH" -m "$gguf" -p 16 -n 2 -t "$th" -r 1 > /dev/null 2>&1
    fp=0 fd=0 ap=0 ad=0 lp=0 ld=0
    i=0
    while [ $i -lt "$REPEAT" ]; do
        set -- $(fmoe_once "$model" "$th" f32)
        fp=$("$PYTHON" -c "print(max($fp, $1))")
        fd=$("$PYTHON" -c "print(max($fd, $2))")
        if [ "$a8" = 1 ]; then
            set -- $(fmoe_once "$model" "$th" q8)
            ap=$("$PYTHON" -c "print(max($ap, $1))")
            ad=$("$PYTHON" -c "print(max($ad, $2))")
        fi
        if [ -n "$gguf" ]; then
            set -- $(llama_once "$gguf" "$th")
            lp=$("$PYTHON" -c "print(max($lp, $1))")
            ld=$("$PYTHON" -c "print(max($ld, $2))")
        fi
        i=$((i + 1))
    done
    "$PYTHON" - "$name $type t$th" "$fp" "$fd" "$a8" "$ap" "$ad" "$lp" "$ld" <<'EOF'
import sys
n = sys.argv[1]
fp, fd, a8, ap, ad, lp, ld = map(float, sys.argv[2:])
rows = [("fmoe", fp, fd)] + ([("fmoe-a8", ap, ad)] if a8 else [])
for who, p, d in rows:
    print(f"{n:<28} {who:<7} prefill {p:9.1f} tok/s  decode {d:8.1f} tok/s")
if lp > 0:
    print(f"{n:<28} {'llama':<7} prefill {lp:9.1f} tok/s  decode {ld:8.1f} tok/s")
    for who, p, d in rows:
        print(f"{n:<28} {'ratio':<7} prefill {p / lp:9.2f}x       decode {d / ld:8.2f}x   "
              f"({who} / llama.cpp)")
EOF
}

run_model() { # name hf_dir
    for type in $(echo "$TYPES" | tr ',' ' '); do
        model=$(model_file "$1" "$2" "$type")
        [ -n "$model" ] || continue
        gguf=""
        if [ -n "$LLAMA" ]; then
            case "$type" in
            bf16) [ -f "$WORK/$1.bf16.gguf" ] && gguf=$WORK/$1.bf16.gguf ;;
            *) gguf=$model ;;
            esac
        fi
        for th in $(echo "$THREADS_LIST" | tr ',' ' '); do
            bench "$1" "$type" "$model" "$gguf" "$th"
        done
    done
}

echo "# bench_cpu_forward: threads $THREADS_LIST, types $TYPES, prompt $PROMPT tokens, $GEN generated, best of $REPEAT interleaved rounds"
echo "# $(uname -m), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
if [ -n "$LLAMA" ]; then
    # llama-bench's record of its build: "version: 0.5.0-dev (build 1, commit 0c1e570)"
    # (built outside git, the commit comes from the sdist's own record or is "unknown")
    build=$("$BENCH" --version 2>&1 | head -1 || true)
    echo "# llama.cpp: $LLAMA, ${build:-version unknown}"
fi

run_model fmoe-tiny "$REPO/datasets/fmoe-tiny"

if [ "$SKIP_1B" = 0 ]; then
    BIG=$WORK/mixtral-1b
    if [ ! -f "$BIG/model.safetensors" ]; then
        # 10 layers of 8 experts (hidden 1024, FFN 3584): 0.97B parameters, 1.9 GB in bf16.
        "$PYTHON" "$REPO/tests/model/make_bench_model.py" "$BIG" --layers 10 >&2
        # A tokenizer for the converter (ids past its 4096 entries are padding tokens).
        cp "$REPO/datasets/fmoe-tiny/tokenizer.json" "$REPO/datasets/fmoe-tiny/tokenizer_config.json" "$BIG/"
    fi
    run_model mixtral-1b-random "$BIG"
fi
[ -n "$LLAMA" ] || echo "# llama.cpp: not compared (pass --llama-cpp DIR; Debian bookworm has no llama.cpp package)"
[ -n "${BENCH_WORK:-}" ] || rm -rf "$WORK"
