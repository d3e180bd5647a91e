#!/bin/sh
# bench_cpu_forward.sh - prefill and decode tokens/s of fmoe's CPU forward pass on the
# bundled fmoe-tiny and on a ~1B-parameter random Mixtral-layout model, and, where a
# llama.cpp build is at hand, of llama.cpp on the same weights (bf16 GGUF) as a ratio.
#
#   tests/bench/bench_cpu_forward.sh [--threads N] [--prompt P] [--gen G] [--repeat R]
#                                    [--skip-1b] [--llama-cpp DIR]
#
# FMOE_BUILD_DIR   meson build with tests/model/forward_driver (default: build)
# PYTHON           a Python with numpy (and torch + transformers for the GGUF conversion);
#                  default: .venv/bin/python when present
# --llama-cpp DIR  a llama.cpp source tree (for convert_hf_to_gguf.py and gguf-py) whose
#                  build/bin holds llama-bench. Debian bookworm packages no llama.cpp; the
#                  source ships inside PyPI's llama-cpp-python sdist (vendor/llama.cpp):
#                    pip download --no-deps --no-binary :all: llama-cpp-python -d /tmp/l
#                    tar xzf /tmp/l/llama_cpp_python-*.tar.gz -C /tmp/l
#                    cmake -S .../vendor/llama.cpp -B .../vendor/llama.cpp/build \
#                      -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DGGML_NATIVE=ON
#                    cmake --build .../build --target llama-bench -j2
#
# What is measured: fmoe through tests/model/forward_driver --bench (prefill: one forward
# call over P prompt tokens, logits of the last one only, as llama-bench computes them;
# decode: G-1 single-token steps after it), llama.cpp through
# llama-bench (pp P: prefill of P tokens; tg G: G single-token steps from an empty
# context). Both use the same thread count, one discarded warm-up run (the weights are
# paged in from disk on first use), and the best of R runs, as the machine is shared:
# expect noise of 2x and more while other jobs run. Ratio = fmoe / llama.cpp (above 1:
# fmoe is faster).
set -eu

REPO=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${FMOE_BUILD_DIR:-$REPO/build}
PYTHON=${PYTHON:-}
[ -n "$PYTHON" ] || { [ -x "$REPO/.venv/bin/python" ] && PYTHON=$REPO/.venv/bin/python || PYTHON=python3; }
THREADS=$(nproc)
PROMPT=128
GEN=32
REPEAT=3
SKIP_1B=0
LLAMA=""
while [ $# -gt 0 ]; do
    case "$1" in
    --threads) THREADS=$2; shift 2 ;;
    --prompt) PROMPT=$2; shift 2 ;;
    --gen) GEN=$2; shift 2 ;;
    --repeat) REPEAT=$2; shift 2 ;;
    --skip-1b) SKIP_1B=1; shift ;;
    --llama-cpp) LLAMA=$2; shift 2 ;;
    -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
    *) echo "bench_cpu_forward.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
DRIVER=$BUILD/tests/model/forward_driver
[ -x "$DRIVER" ] || { echo "bench_cpu_forward.sh: $DRIVER not built (set FMOE_BUILD_DIR)" >&2; exit 1; }
WORK=${BENCH_WORK:-$(mktemp -d /tmp/fmoe-bench.XXXXXX)}
mkdir -p "$WORK"

TOKENS=$("$PYTHON" -c "print(','.join(str(1 + (i * 37) % 4000) for i in range($PROMPT)))")

# best_of CMD...: runs the fmoe driver REPEAT times, prints "prefill decode" (best of each).
fmoe_best() {
    dir=$1
    i=0
    best_p=0
    best_d=0
    # one discarded run: pages the weights in, so the first timed run is not a disk read
    "$DRIVER" "$dir" --tokens "$TOKENS" --generate 2 --threads "$THREADS" --bench > /dev/null
    while [ $i -lt "$REPEAT" ]; do
        out=$("$DRIVER" "$dir" --tokens "$TOKENS" --generate "$GEN" --threads "$THREADS" --bench)
        p=$(echo "$out" | "$PYTHON" -c "import json,sys; print(json.load(sys.stdin)['prefill_tok_s'])")
        d=$(echo "$out" | "$PYTHON" -c "import json,sys; print(json.load(sys.stdin)['decode_tok_s'])")
        best_p=$("$PYTHON" -c "print(max($best_p, $p))")
        best_d=$("$PYTHON" -c "print(max($best_d, $d))")
        i=$((i + 1))
    done
    echo "$best_p $best_d"
}

# llama_best GGUF: prints "prefill decode" tokens/s from llama-bench (best of REPEAT).
llama_best() {
    "$LLAMA/build/bin/llama-bench" -m "$1" -p 16 -n 2 -t "$THREADS" -r 1 > /dev/null 2>&1 # warm-up
    "$LLAMA/build/bin/llama-bench" -m "$1" -p "$PROMPT" -n "$GEN" -t "$THREADS" -r "$REPEAT" \
        -o json 2>/dev/null | "$PYTHON" -c "
import json, sys
rows = json.load(sys.stdin)
pp = max(max(r.get('samples_ts') or [r['avg_ts']]) for r in rows if r['n_prompt'] > 0)
tg = max(max(r.get('samples_ts') or [r['avg_ts']]) for r in rows if r['n_gen'] > 0)
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

report() { # name fmoe_p fmoe_d [llama_p llama_d]
    if [ $# -ge 5 ]; then
        "$PYTHON" -c "
n, fp, fd, lp, ld = '$1', $2, $3, $4, $5
print(f'{n:<22} fmoe   prefill {fp:9.1f} tok/s  decode {fd:8.1f} tok/s')
print(f'{n:<22} llama  prefill {lp:9.1f} tok/s  decode {ld:8.1f} tok/s')
print(f'{n:<22} ratio  prefill {fp / lp:9.2f}x       decode {fd / ld:8.2f}x   (fmoe / llama.cpp)')"
    else
        "$PYTHON" -c "print(f'{\"$1\":<22} fmoe   prefill {$2:9.1f} tok/s  decode {$3:8.1f} tok/s')"
    fi
}

echo "# bench_cpu_forward: threads $THREADS, prompt $PROMPT tokens, $GEN generated, best of $REPEAT"
echo "# $(uname -m), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"

run_model() { # name hf_dir
    name=$1
    dir=$2
    set -- $(fmoe_best "$dir")
    fp=$1
    fd=$2
    if [ -n "$LLAMA" ] && [ -x "$LLAMA/build/bin/llama-bench" ]; then
        gguf=$WORK/$name.bf16.gguf
        [ -f "$gguf" ] || to_gguf "$dir" "$gguf" > "$WORK/$name.convert.log" 2>&1 || {
            echo "$name: GGUF conversion failed, see $WORK/$name.convert.log" >&2
            report "$name" "$fp" "$fd"
            return 0
        }
        set -- $(llama_best "$gguf")
        report "$name" "$fp" "$fd" "$1" "$2"
    else
        report "$name" "$fp" "$fd"
    fi
}

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
