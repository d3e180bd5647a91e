#!/usr/bin/env bash
# tests/gpu/device-check.sh - the one command a GPU machine runs (README.md beside this
# file): checks the build that tests/gpu/bundle.sh packed into .gpu-carry/ in stages, each
# under its own timeout and all under one deadline, and writes what comes back to $OUT.
#
#     bash tests/gpu/device-check.sh        # from anywhere; works in the repository root
#
# Environment: OUT (default ./gpu-out), FMOE_GPU_BUILD_DIR (default .gpu-carry/build-gpu),
# FMOE_GPU_DEADLINE (seconds for all stages, default 330: the default run fits in 6 minutes
# of an H100, so a second run fits the same 15-minute loan), FMOE_GPU_ONLY (space-separated
# stage names to run, the rest left out of the summary), FMOE_GPU_SANITIZE=1 (the second
# invocation: the compute-sanitizer stages only, which repeat earlier coverage slowly).
#
# Every stage runs whatever happened before it (no stopping at the first failure) and logs
# to $OUT/stage-<name>.log, which is appended to $OUT/logs.txt as soon as the stage ends.
# After each stage $OUT/summary.txt (the table printed at the end: stage, status, seconds,
# key figure) and $OUT/figures.json are rewritten, so a run cut short still returns what
# it did. What comes back: summary.txt, logs.txt, figures.json, ops.json, bench.json,
# trace-cuda.h5 (if under 4 MiB): at most 6 files, 2 below the limit of 8.
#
# Statuses: pass; FAIL; TIMEOUT (its stage timeout); skip (the step says it cannot run
# here, e.g. no GPU: exit 77); missing (what it runs is not in this tree yet); not-run
# (the deadline left no time for it); rehearsed (no GPU here: the stage ran with the CPU
# backend standing in for the device, and passed).
#
# Exit status. With a CUDA device: 0, every stage passed; 1, something failed: FAIL,
# TIMEOUT, and skip or missing as well (a check that could not run shows nothing), but for
# cpu_avx512's skip (the host CPU has no AVX-512: host_may_skip); 3, everything that ran
# passed but the deadline left some stage not-run (named in the last line: rerun them with
# FMOE_GPU_ONLY). Stages left out by FMOE_GPU_ONLY or FMOE_GPU_SANITIZE are not listed.
# Without a device (the rehearsal) FAIL or TIMEOUT give 1; else 77, after every step that
# needs none has run (the stand-in runs included), with the line "no CUDA device: the rest
# needs a GPU".
set -u
set -o pipefail

here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../.."
root=$PWD
OUT=${OUT:-$root/gpu-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
B=${FMOE_GPU_BUILD_DIR:-$root/.gpu-carry/build-gpu}
B=$(cd "$B" 2>/dev/null && pwd || echo "$B")
deadline=${FMOE_GPU_DEADLINE:-330}
case $deadline in '' | *[!0-9]*) echo "device-check: FMOE_GPU_DEADLINE=$deadline: whole seconds" >&2; exit 2 ;; esac
only=${FMOE_GPU_ONLY:-}
sanitize=${FMOE_GPU_SANITIZE:-0}
work=$(mktemp -d "${TMPDIR:-/tmp}/fmoe-gpu.XXXXXX")
t_start=$SECONDS
rm -f "$OUT"/stage-*.log "$OUT/logs.txt" "$OUT/summary.txt" "$OUT/figures.json" \
    "$OUT/ops.json" "$OUT/bench.json" "$OUT/trace-cuda.h5"

# ---- the carried build ------------------------------------------------------------------
# bundle.sh packed the Debian libraries as bundle-lib.tar.xz; the binaries' RPATH
# ($ORIGIN/../bundle-lib, $ORIGIN/../../bundle-lib) finds them once unpacked here.
unpacked=0
if [ -f "$B/bundle-lib.tar.xz" ] && [ ! -d "$B/bundle-lib" ]; then
    if command -v xz >/dev/null 2>&1; then
        tar -xJf "$B/bundle-lib.tar.xz" -C "$B" && unpacked=1
    else
        python3 -c 'import sys, tarfile
t = tarfile.open(sys.argv[1])
t.extractall(sys.argv[2], **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))' \
            "$B/bundle-lib.tar.xz" "$B" && unpacked=1
    fi
fi
cleanup() {
    [ "$unpacked" = 1 ] && rm -rf "$B/bundle-lib" # the rehearsal must leave .gpu-carry as packed
    rm -rf "$work"
}
trap cleanup EXIT

# The CUDA module's own libraries (libcudart, libcublas, libcublasLt) come from the machine:
# where the loader does not find them, the first folder holding each is put on
# LD_LIBRARY_PATH: Python's nvidia packages first (the very files torch loads, so
# python3 and fmoe agree), then the toolkit's.
cuda_lib_dirs() {
    python3 - 2>/dev/null <<'EOF'
import os
try:
    import nvidia
    for p in nvidia.__path__:
        for d, _, files in os.walk(p):
            if any(f.startswith(("libcublas.so", "libcudart.so", "libcublasLt.so")) for f in files):
                print(d)
except Exception:
    pass
EOF
    ls -d /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-*/lib64 \
        /usr/local/cuda-*/lib /usr/local/cuda-*/targets/x86_64-linux/lib /usr/local/lib 2>/dev/null
}
cuda_note="the loader finds them"
# (no `grep -q` after a pipe in this script: under pipefail the writer's SIGPIPE when grep
# stops early would read as no match)
if [ -f "$B/runtime/libfmoe-cuda.so" ] && ldd "$B/runtime/libfmoe-cuda.so" | grep "not found" >/dev/null; then
    added=""
    dirs=$(cuda_lib_dirs)
    for lib in $(ldd "$B/runtime/libfmoe-cuda.so" | awk '/not found/ {print $1}'); do
        for d in $dirs; do
            if [ -e "$d/$lib" ]; then
                case ":$added:" in *":$d:"*) ;; *) added=${added:+$added:}$d ;; esac
                break
            fi
        done
    done
    if [ -n "$added" ]; then
        export LD_LIBRARY_PATH=$added${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
        cuda_note="from $added"
    else
        cuda_note="NOT FOUND (looked in: $(echo $dirs))"
    fi
fi

# The Python a stage runs: the repository's .venv where it exists and imports what the
# stage needs (this machine's python3 may lack pytest), else python3 (the GPU machine's,
# with torch, transformers, h5py and pytest; .venv does not travel).
# pick_python MODULE...
pick_python() {
    local py mods
    mods=$(printf 'import %s;' "$@")
    for py in "$root/.venv/bin/python" python3; do
        if command -v "$py" >/dev/null 2>&1 && "$py" -c "$mods" >/dev/null 2>&1; then
            echo "$py"
            return 0
        fi
    done
    echo python3
}

export root B OUT work cuda_note
export FMOE=$B/cmd/fmoe
export FMOE_BUILD_DIR=$B FMOE_BUILD_ROOT=$B FMOE_PLUGIN_DIR=$B/trace HDF5_PLUGIN_PATH=$B/trace
export FMOE_CUDA_MODULE=$B/runtime/libfmoe-cuda.so
export FMOE_BUNDLED_MODEL=$root/datasets/fmoe-tiny FMOE_SAMPLES_DIR=$root/datasets/samples
export FMOE_FIXTURES=$root/tests/fixtures FMOE_SOURCE_ROOT=$root
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1

have_gpu=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep '^GPU ' >/dev/null; then
    have_gpu=1
fi
san=$(command -v compute-sanitizer 2>/dev/null ||
    ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda-*/bin/compute-sanitizer \
        /usr/local/cuda*/compute-sanitizer/compute-sanitizer 2>/dev/null | head -1)
has_backend=0
"$FMOE" generate --help 2>/dev/null | grep -- '--backend' >/dev/null && has_backend=1
record_backend=0
"$FMOE" record --help 2>/dev/null | grep -- '--backend' >/dev/null && record_backend=1
export have_gpu san has_backend record_backend

prompt="The capital of France is"
tiny=$root/datasets/fmoe-tiny
export prompt tiny

# ---- stages -----------------------------------------------------------------------------
# Each is a function run as `timeout T bash -c stage_<name>` (a group kill takes every
# process it started), writing its key figure to $FIG. Return 0 pass, 77 skip, 78 missing,
# 76 rehearsed (no GPU: the CPU backend stood in for the device and the stage passed),
# anything else a failure.
#
# The rehearsal: without a device, the stages whose device half has a CPU stand-in run it
# (generate: the comparison of two CPU runs; e2e: test_gpu_e2e.py with
# FMOE_GPU_TEST_BACKEND=cpu; backend_py: test_backend.py's CPU cases; record: --backend
# cpu; bench: bench_gpu.py --device-backend cpu at a small size), so that everything but
# the device itself (flags, files, parsing, the scripts) is exercised before a device run.
REHEARSED=76

fig() { printf '%s' "$*" >"$FIG"; }
# The backend the device half runs: cuda, or cpu standing in for it in the rehearsal.
dev_backend() { [ "$have_gpu" = 1 ] && echo cuda || echo cpu; }
# A passing device half: 0 with a GPU, REHEARSED without.
passed() { [ "$have_gpu" = 1 ] && return 0; return $REHEARSED; }
needs_gpu() {
    if [ "$have_gpu" != 1 ]; then
        fig "needs a GPU"
        return 0
    fi
    return 1
}

stage_env() {
    local bad=0
    echo "== host"
    uname -a
    grep -E '^(PRETTY_NAME|VERSION)=' /etc/os-release 2>/dev/null
    ldd --version 2>&1 | head -1
    echo "cores: $(nproc)"
    free -g 2>/dev/null | head -2
    echo "== carried build"
    sed -n '1,/^carried files/p' "$B/../MANIFEST" 2>/dev/null | sed '$d'
    # The build must be the sources': SOURCES.sha256 (bundle.sh) holds every build input's
    # hash as bundled; each must match the file in this tree.
    local stale=""
    if [ ! -f "$B/../SOURCES.sha256" ]; then
        stale="carried build unverifiable: no $B/../SOURCES.sha256 (an older bundle.sh packed it): rerun tests/gpu/bundle.sh"
    else
        local bad_src
        bad_src=$(cd "$root" && sha256sum -c "$B/../SOURCES.sha256" 2>/dev/null | grep -v ': OK$' |
            sed 's/: [^:]*$//')
        if [ -n "$bad_src" ]; then
            stale="carried build is stale: $(echo "$bad_src" | wc -l) of $(wc -l <"$B/../SOURCES.sha256") build inputs differ from this tree ($(echo "$bad_src" | head -3 | tr '\n' ' ')...): rerun tests/gpu/bundle.sh"
        else
            echo "sources: all $(wc -l <"$B/../SOURCES.sha256") build inputs match SOURCES.sha256"
        fi
    fi
    if [ -n "$stale" ]; then
        echo "$stale"
        bad=1
    fi
    echo "== GPU"
    local gpu="no GPU"
    if command -v nvidia-smi >/dev/null 2>&1; then
        nvidia-smi -L
        nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap,clocks.max.sm \
            --format=csv 2>&1
        [ "$have_gpu" = 1 ] && gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
    else
        echo "nvidia-smi: not found"
    fi
    echo "== nvcc"
    (command -v nvcc >/dev/null && nvcc --version || /usr/local/cuda/bin/nvcc --version) 2>&1 | tail -2
    echo "== compute-sanitizer: ${san:-not found}"
    [ -n "$san" ] && "$san" --version 2>&1 | tail -1
    echo "== python"
    local py
    for py in python3 "$root/.venv/bin/python"; do
        command -v "$py" >/dev/null 2>&1 || continue
        echo "$py: $(command -v "$py")"
        "$py" - <<'EOF' 2>&1 | tee -a "$work/python.txt"
import importlib, sys
parts = ["python " + sys.version.split()[0]]
for name in ("torch", "transformers", "h5py", "numpy", "pytest"):
    try:
        m = importlib.import_module(name)
        parts.append(f"{name} {getattr(m, '__version__', '?')}")
        if name == "torch":
            parts.append(f"(cuda {m.version.cuda}, available {m.cuda.is_available()})")
    except Exception as e:
        parts.append(f"{name} MISSING ({type(e).__name__})")
print(" ".join(parts))
EOF
    done
    echo "e2e and backend_py run $(pick_python pytest numpy); bench $(pick_python numpy h5py)"
    echo "== libraries (CUDA's: $cuda_note)"
    echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
    local f nf nb
    for f in cmd/fmoe runtime/libfmoe-cuda.so trace/libh5zstd.so tests/gpu/test_backend_ops; do
        [ -e "$B/$f" ] || { echo "$f: MISSING from the carried build"; bad=1; continue; }
        nf=$(ldd "$B/$f" | grep -c "not found")
        nb=$(ldd "$B/$f" | grep -c "bundle-lib/")
        echo "$f: $nb libraries from bundle-lib, $nf not found"
        if [ "$nf" != 0 ]; then
            ldd "$B/$f" | grep "not found"
            bad=1
        fi
    done
    echo "== fmoe --version"
    "$FMOE" --version 2>&1 | tee "$work/version.txt" || bad=1
    local cuda_line
    cuda_line=$(grep '^cuda:' "$work/version.txt")
    if [ "$have_gpu" = 1 ] && ! echo "$cuda_line" | grep -qE '[1-9][0-9]* devices?'; then
        echo "fmoe does not see the GPU that nvidia-smi lists"
        bad=1
    fi
    # A module the loader refuses (another ABI, another struct layout) fails here, GPU or
    # not: the rehearsal then finds a stale or foreign module before a device run does.
    if echo "$cuda_line" | grep -qE 'module of ABI|not an fmoe CUDA module|built from other fmoe headers'; then
        echo "the carried CUDA module is not this build's: $cuda_line"
        stale=${stale:-"the carried CUDA module is refused by the carried fmoe: rerun tests/gpu/bundle.sh"}
        bad=1
    fi
    echo "generate --backend: $has_backend, record --backend: $record_backend"
    if [ -n "$stale" ]; then
        fig "$stale"
    else
        fig "$gpu; $cuda_line; $(grep -o 'torch [^ ]*' "$work/python.txt" | head -1)"
    fi
    return $bad
}

stage_ops_self() {
    "$B/tests/gpu/test_backend_ops" --self >"$work/self.txt" 2>&1
    local rc=$?
    cat "$work/self.txt"
    fig "$(grep '^backend_ops: cpu vs' "$work/self.txt" | sed 's/^backend_ops: //')"
    return $rc
}

# A test binary of the build, its output kept; its figure is its last line.
# run_test_binary PATH NAME
run_test_binary() {
    [ -x "$B/$1" ] || { fig "$1 not built"; return 78; }
    "$B/$1" 2>&1 | tee "$work/$2.txt"
    local rc=${PIPESTATUS[0]}
    fig "$(tail -1 "$work/$2.txt")"
    return $rc
}

stage_selftest() { run_test_binary tests/gpu/test_cuda selftest; }

# The host CPU's AVX-512 block-format dots (lib/quant_act_avx512.c for 8-bit inputs,
# lib/quant_avx512.c for f32 ones), which the build machine cannot run: test_quant_act,
# test_quant and test_quant_matvec (the products over the thread pool) at every kernel
# level the CPU has (tests/lib/quant_levels.h), then bench_quant's avx2 and avx512 rows
# on a small matrix (logged, not judged). Pass: all three pass and the AVX-512 cases ran
# ("avx512: N cases run"); skip (77) where the CPU lacks AVX-512, which on a device run is
# a fact about the host, not a failed check (host_may_skip). Needs no GPU: the rehearsal
# runs it.
stage_cpu_avx512() {
    local t tests=(lib/test_quant_act lib/test_quant model/test_quant_matvec)
    for t in "${tests[@]}" lib/bench_quant; do
        [ -x "$B/tests/$t" ] || { fig "tests/$t not built"; return 78; }
    done
    echo "cpu: $(grep -m1 '^model name' /proc/cpuinfo | sed 's/.*: //')"
    echo "avx512 flags: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep '^avx512' | tr '\n' ' ')"
    local bad=0 counts=""
    for t in "${tests[@]}"; do
        echo "== $t"
        "$B/tests/$t" >"$work/${t#*/}.txt" 2>&1 || bad=1
        cat "$work/${t#*/}.txt"
        counts="$counts$(tail -1 "$work/${t#*/}.txt") (${t#*/}); "
    done
    if [ $bad != 0 ]; then
        fig "FAILED: $(grep -hE '^(plain|avx2|avx512): [0-9]+ passed, [1-9]' "$work"/test_quant*.txt | tr '\n' ' ')"
        return 1
    fi
    local ran
    ran=$(tail -1 "$work/test_quant_act.txt")
    case $ran in
    "avx512: "*" cases run") ;;
    *) fig "$ran"; return 77 ;;
    esac
    echo "== bench_quant 512 4096 3"
    "$B/tests/lib/bench_quant" 512 4096 3 | tee "$work/bench_quant.txt"
    fig "${counts}Q4_K ms (GB/s):$(grep '^| Q4_K | avx' "$work/bench_quant.txt" | awk -F'|' '{gsub(/ /, "", $3); printf " %s f32%s 8-bit%s;", $3, $4, $5}')"
}

stage_ops() {
    "$B/tests/gpu/test_backend_ops" --json "$OUT/ops.json" >"$work/ops.txt" 2>&1
    local rc=$?
    cat "$work/ops.txt"
    if [ $rc = 77 ]; then
        rm -f "$OUT/ops.json"
        fig "$(grep 'skipped' "$work/ops.txt" | head -1 | cut -c1-120)"
    else
        fig "$(grep '^backend_ops: cpu vs' "$work/ops.txt" | sed 's/^backend_ops: //')"
        grep -E ' FAIL$|^FAIL ' "$work/ops.txt" | head -20 >&2
    fi
    return $rc
}

stage_cuda_ops() { run_test_binary tests/model/test_cuda_ops cuda_ops; }

# The logits of greedy generations on the CPU and on CUDA, resident and offloaded, compared
# step by step (stdlib Python: .npy read by hand).
compare_generations() {
    python3 - "$@" <<'EOF'
import array, ast, json, os, struct, sys  # the stdlib only: any python3 will do

def npy(path):
    data = open(path, "rb").read()
    assert data[:6] == b"\x93NUMPY", path
    n, off = (struct.unpack("<H", data[8:10])[0], 10) if data[6] == 1 else (struct.unpack("<I", data[8:12])[0], 12)
    hdr = ast.literal_eval(data[off:off + n].decode("latin1"))
    assert hdr["descr"] == "<f4" and not hdr["fortran_order"], hdr
    a = array.array("f")
    a.frombytes(data[off + n:])
    rows, cols = hdr["shape"]
    return [a[r * cols:(r + 1) * cols] for r in range(rows)]

def load(stem):
    return json.load(open(stem + ".json")), npy(stem + ".npy")

ok = True
figs = []
ref_j, ref_l = load(sys.argv[1])
for stem, label in zip(sys.argv[2::2], sys.argv[3::2]):
    j, l = load(stem)
    a, b = ref_j["generated_ids"], j["generated_ids"]
    same = 0
    while same < min(len(a), len(b)) and a[same] == b[same]:
        same += 1
    steps = min(len(ref_l), len(l), same + 1)
    worst_rel, worst_abs = 0.0, 0.0
    for s in range(steps):
        d = max(abs(x - y) for x, y in zip(ref_l[s], l[s]))
        scale = max(abs(x) for x in ref_l[s]) or 1.0
        worst_abs, worst_rel = max(worst_abs, d), max(worst_rel, d / scale)
        print(f"{label}: step {s}: max|dlogit| {d:.3g} (max|logit| {scale:.3g})")
    verdict = "ids identical"
    good = worst_rel <= 5e-2  # fmoe-tiny is bf16: x rounded to bf16 moves logits ~1%
    if same < min(len(a), len(b)):
        top = sorted(ref_l[same], reverse=True)[:2]
        gap = top[0] - top[1]
        near_tie = gap <= 2 * worst_abs
        verdict = f"ids differ from step {same} (reference top-2 gap {gap:.3g}: {'a near tie' if near_tie else 'NOT a near tie'})"
        good = good and near_tie
    elif len(a) != len(b):
        verdict = f"lengths differ: {len(a)} vs {len(b)}"
        good = False
    ok = ok and good
    print(f"{label}: {verdict}; max|dlogit| {worst_abs:.3g}, relative {worst_rel:.3g}; "
          f"prefill {j.get('prefill_tok_s')} tok/s, decode {j.get('decode_tok_s')} tok/s "
          f"(reference {ref_j.get('prefill_tok_s')}, {ref_j.get('decode_tok_s')}) {'PASS' if good else 'FAIL'}")
    figs.append(f"{label} {same}/{len(a)} ids, max|dl| {worst_abs:.2g}, decode {j.get('decode_tok_s')} tok/s")
with open(os.environ["FIG"], "w") as f:
    f.write("; ".join(figs) + f"; cpu decode {ref_j.get('decode_tok_s')} tok/s")
sys.exit(0 if ok else 1)
EOF
}

stage_generate() {
    local base=(generate --model "$tiny" --prompt "$prompt" --max-new-tokens 32 --temperature 0
        --ignore-eos --json)
    local cpu=()
    [ "$has_backend" = 1 ] && cpu=(--backend cpu)
    echo "== cpu"
    "$FMOE" "${base[@]}" "${cpu[@]}" --dump-logits "$work/cpu.npy" >"$work/cpu.json" || return 1
    cat "$work/cpu.json"
    echo
    [ "$has_backend" = 1 ] || { fig "fmoe generate has no --backend"; return 78; }
    local bad=0 dev
    dev=$(dev_backend)
    [ "$dev" = cpu ] && echo "(no GPU: --backend cpu stands in for cuda below)"
    echo "== cuda"
    "$FMOE" "${base[@]}" --backend "$dev" --dump-logits "$work/cuda.npy" >"$work/cuda.json" || bad=1
    cat "$work/cuda.json"
    echo
    echo "== cuda, offloaded: --policy lru --cache-experts 16"
    "$FMOE" "${base[@]}" --backend "$dev" --policy lru --cache-experts 16 \
        --dump-logits "$work/cuda-off.npy" >"$work/cuda-off.json" || bad=1
    cat "$work/cuda-off.json"
    echo
    [ $bad = 0 ] || { fig "a $dev generate failed"; return 1; }
    echo "== logits against the CPU's"
    compare_generations "$work/cpu" "$work/cuda" "$dev" "$work/cuda-off" "$dev-offload" || return 1
    passed
}

# pytest over PATHS with the Python that has it; every test runs (no -x: one failure
# must not hide the rest of a device run), each command inside under the tests' own
# time limits (conftest.COMMAND_TIMEOUT_S), and a per-test limit where pytest-timeout is
# installed. run_pytest NAME PATH...
run_pytest() {
    local name=$1 py
    shift
    py=$(pick_python pytest numpy)
    "$py" -c 'import pytest, numpy' 2>/dev/null || { fig "no pytest and numpy in $py"; return 77; }
    local extra=()
    "$py" -c 'import pytest_timeout' 2>/dev/null && extra=(--timeout 300)
    echo "$py -m pytest -q -p no:cacheprovider ${extra[*]} $*"
    "$py" -m pytest -q -p no:cacheprovider "${extra[@]}" "$@" 2>&1 | tee "$work/$name.txt"
    local rc=${PIPESTATUS[0]}
    fig "$(grep -E '(passed|failed|skipped|error|no tests ran)' "$work/$name.txt" | tail -1 | tr -d '=' | sed 's/^ *//')"
    [ $rc = 5 ] && return 78 # no tests collected
    [ $rc = 0 ] || return $rc
    passed
}

stage_e2e() {
    ls "$root"/tests/gpu/test_*.py >/dev/null 2>&1 || { fig "tests/gpu/test_*.py not in this tree"; return 78; }
    [ "$have_gpu" = 1 ] || export FMOE_GPU_TEST_BACKEND=cpu
    run_pytest e2e "$root/tests/gpu"
}

# tests/python/test_backend.py: --backend on every command; its cuda cases run where fmoe
# sees a device (they skip without one), its cpu cases everywhere.
stage_backend_py() {
    [ -f "$root/tests/python/test_backend.py" ] || { fig "tests/python/test_backend.py not in this tree"; return 78; }
    run_pytest backend_py "$root/tests/python/test_backend.py"
}

stage_record() {
    [ "$record_backend" = 1 ] || { fig "fmoe record has no --backend"; return 78; }
    # written in $work (a cut-short run leaves no .partial and journal in $OUT)
    "$FMOE" record --backend "$(dev_backend)" --model "$tiny" --dataset "$root/datasets/samples/prompts_100.txt" \
        --max-requests 4 --max-new-tokens 16 --policy lru --cache-experts 16 \
        -o "$work/trace-cuda.h5" -q || { fig "fmoe record failed"; return 1; }
    "$FMOE" inspect "$work/trace-cuda.h5" 2>&1 | head -60 | tee "$work/inspect.txt"
    local size keep="kept"
    size=$(stat -c %s "$work/trace-cuda.h5")
    if [ "$size" -le $((4 << 20)) ]; then
        cp "$work/trace-cuda.h5" "$OUT/trace-cuda.h5"
    else
        keep="not kept (over 4 MiB)"
    fi
    fig "4 requests, $size bytes, $keep; $(grep -io 'recorded.on[^,;]*' "$work/inspect.txt" | head -1)"
    passed
}

# compute-sanitizer TOOL over a command; status from its own report: errors (leaks aside,
# which are reported but do not fail) or a failing program.
sanitize() {
    local tool=$1
    shift
    [ -n "$san" ] || { fig "no compute-sanitizer"; return 78; }
    local extra=()
    [ "$tool" = memcheck ] && extra=(--leak-check full)
    echo "$san --tool $tool ${extra[*]} --print-limit 50 $*"
    "$san" --tool "$tool" "${extra[@]}" --print-limit 50 "$@" >"$work/san.txt" 2>&1
    local rc=$?
    cat "$work/san.txt"
    local total leaks
    total=$(grep -oE 'ERROR SUMMARY: [0-9]+' "$work/san.txt" | tail -1 | grep -oE '[0-9]+$')
    # racecheck ends with "RACECHECK SUMMARY: N hazards displayed (E errors, W warnings)"
    [ -z "$total" ] && total=$(grep -oE 'RACECHECK SUMMARY: .*\(([0-9]+) errors' "$work/san.txt" |
        tail -1 | grep -oE '[0-9]+ errors' | grep -oE '[0-9]+')
    leaks=$(grep -cE 'Leaked [0-9]+ bytes' "$work/san.txt")
    if [ -z "$total" ]; then
        fig "no ERROR SUMMARY (exit $rc)"
        return 1
    fi
    local errors=$((total - leaks))
    fig "$errors errors, $leaks leaks (exit $rc)"
    [ $rc = 77 ] && return 77 # the program skipped
    [ "$errors" = 0 ] && [ $rc = 0 ]
}

stage_memcheck() {
    needs_gpu && return 77
    [ "$has_backend" = 1 ] || { fig "fmoe generate has no --backend"; return 78; }
    sanitize memcheck "$FMOE" generate --backend cuda --model "$tiny" --prompt "$prompt" \
        --max-new-tokens 8 --temperature 0 --ignore-eos
}

stage_memcheck_offload() {
    needs_gpu && return 77
    [ "$has_backend" = 1 ] || { fig "fmoe generate has no --backend"; return 78; }
    sanitize memcheck "$FMOE" generate --backend cuda --model "$tiny" --prompt "$prompt" \
        --max-new-tokens 8 --temperature 0 --ignore-eos --policy lru --cache-experts 16
}

stage_memcheck_ops() { # every op at every shape of test_backend_ops, under memcheck
    needs_gpu && return 77
    sanitize memcheck "$B/tests/gpu/test_backend_ops"
}

stage_racecheck() {
    needs_gpu && return 77
    [ "$has_backend" = 1 ] || { fig "fmoe generate has no --backend"; return 78; }
    sanitize racecheck "$FMOE" generate --backend cuda --model "$tiny" --prompt "$prompt" \
        --max-new-tokens 4 --temperature 0 --ignore-eos
}

stage_synccheck() {
    needs_gpu && return 77
    [ "$has_backend" = 1 ] || { fig "fmoe generate has no --backend"; return 78; }
    sanitize synccheck "$FMOE" generate --backend cuda --model "$tiny" --prompt "$prompt" \
        --max-new-tokens 4 --temperature 0 --ignore-eos
}

stage_initcheck() {
    needs_gpu && return 77
    [ "$has_backend" = 1 ] || { fig "fmoe generate has no --backend"; return 78; }
    sanitize initcheck "$FMOE" generate --backend cuda --model "$tiny" --prompt "$prompt" \
        --max-new-tokens 4 --temperature 0 --ignore-eos --policy lru --cache-experts 16
}

stage_bench() {
    [ -f "$root/tests/bench/bench_gpu.py" ] || { fig "tests/bench/bench_gpu.py not in this tree"; return 78; }
    local py size=()
    py=$(pick_python numpy h5py)
    if ! "$py" -c 'import numpy, h5py' >/dev/null 2>&1; then
        fig "no Python here imports numpy and h5py (.venv/bin/python, python3)"
        return 77
    fi
    # the rehearsal: the CPU stands in, at a small size (its figures mean nothing), in the
    # run's own work folder
    [ "$have_gpu" = 1 ] || size=(--device-backend cpu --prompts 2 --gen 4 --offload-prompts 1
        --offload-gen 2 --fractions 0.25 --offload-model "$tiny" --budget-s 30 --work "$work/bench")
    echo "$py tests/bench/bench_gpu.py --json $OUT/bench.json ${size[*]}"
    "$py" "$root/tests/bench/bench_gpu.py" --json "$OUT/bench.json" "${size[@]}" 2>&1 | tee "$work/bench.txt"
    local rc=${PIPESTATUS[0]}
    fig "$(grep -E '^(targets|FAILED|bench_gpu)' "$work/bench.txt" | tail -1 | cut -c1-160)"
    [ $rc = 0 ] || return $rc
    passed
}

export REHEARSED
export -f fig needs_gpu dev_backend passed pick_python run_pytest compare_generations sanitize \
    run_test_binary
export -f stage_env stage_ops_self stage_selftest stage_cpu_avx512 stage_ops stage_cuda_ops stage_generate \
    stage_e2e stage_backend_py stage_record stage_memcheck stage_memcheck_offload stage_memcheck_ops \
    stage_racecheck stage_synccheck stage_initcheck stage_bench

# name, timeout (s). In order of what a short run must not lose (README.md has each
# stage's expected time on an H100): the environment and the op-by-op comparison first,
# then generation and the families end to end, then record and the offloaded run, the
# benchmark, the host CPU's AVX-512 kernels. The compute-sanitizer stages repeat that
# coverage slowly: a second invocation runs them (FMOE_GPU_SANITIZE=1).
stages=(
    "env 60"
    "ops_self 90"
    "selftest 30"
    "ops 150"
    "cuda_ops 120"
    "generate 90"
    "e2e 180"
    "backend_py 60"
    "record 60"
    "bench 120"
    "cpu_avx512 60"
)
sanitizer_stages=(
    "memcheck 90"
    "memcheck_offload 90"
    "memcheck_ops 90"
    "racecheck 90"
    "synccheck 60"
    "initcheck 60"
)
if [ "$sanitize" = 1 ]; then
    stages=("${sanitizer_stages[@]}")
elif [ -n "$only" ]; then # FMOE_GPU_ONLY may name any stage
    stages+=("${sanitizer_stages[@]}")
fi

# Stages that check the host CPU, not the device: their skip says the CPU lacks what they
# check (cpu_avx512: AVX-512), which no device run can change, so it is no failure there.
host_may_skip() { [ "$1" = cpu_avx512 ]; }

names=() statuses=() secs=() figs=()
json_str() { printf '%s' "$1" | tr -d '\000-\037' | sed 's/\\/\\\\/g; s/"/\\"/g'; }

write_summary() {
    {
        printf '%-17s %-9s %5s  %s\n' stage status secs "key figure"
        local i
        for i in "${!names[@]}"; do
            printf '%-17s %-9s %5s  %s\n' "${names[$i]}" "${statuses[$i]}" "${secs[$i]}" "${figs[$i]}"
        done
        printf 'total %ss of a %ss deadline; gpu %s; OUT %s\n' $((SECONDS - t_start)) "$deadline" \
            "$([ "$have_gpu" = 1 ] && echo yes || echo no)" "$OUT"
    } >"$OUT/summary.txt"
    {
        printf '{"gpu": %s, "deadline_s": %s, "total_s": %s, "stages": [' \
            "$([ "$have_gpu" = 1 ] && echo true || echo false)" "$deadline" $((SECONDS - t_start))
        local i sep=""
        for i in "${!names[@]}"; do
            printf '%s\n  {"stage": "%s", "status": "%s", "seconds": %s, "figure": "%s"}' "$sep" \
                "${names[$i]}" "${statuses[$i]}" "${secs[$i]}" "$(json_str "${figs[$i]}")"
            sep=","
        done
        printf '\n]}\n'
    } >"$OUT/figures.json"
}

append_log() { # stage name, status, seconds: the stage's log into logs.txt (long ones cut)
    local log="$OUT/stage-$1.log"
    {
        printf '\n===== stage %s: %s (%s s) =====\n' "$1" "$2" "$3"
        if [ -f "$log" ]; then
            local size
            size=$(stat -c %s "$log")
            if [ "$size" -gt $((3 << 20)) ]; then
                head -c $((512 << 10)) "$log"
                printf '\n[... %s bytes cut ...]\n' $((size - (3 << 20)))
                tail -c $((2560 << 10)) "$log"
            else
                cat "$log"
            fi
        fi
    } >>"$OUT/logs.txt"
    rm -f "$log"
}

failed=0 not_run=()
echo "device-check: build $B, OUT $OUT, deadline ${deadline}s, gpu $([ "$have_gpu" = 1 ] && echo yes || echo no)"
for entry in "${stages[@]}"; do
    read -r name limit <<<"$entry"
    if [ -n "$only" ] && ! [[ " $only " == *" $name "* ]]; then
        continue
    fi
    left=$((deadline - (SECONDS - t_start)))
    export FIG=$work/fig-$name
    : >"$FIG"
    t0=$SECONDS
    if [ "$left" -lt 10 ]; then
        status=not-run
        printf 'no time left of the %ss deadline' "$deadline" >"$FIG"
    else
        [ "$limit" -gt "$left" ] && limit=$left
        timeout -k 5 "$limit" bash -c "stage_$name" >"$OUT/stage-$name.log" 2>&1
        rc=$?
        case $rc in
        0) status=pass ;;
        77) status=skip ;;
        78) status=missing ;;
        "$REHEARSED") if [ "$have_gpu" = 1 ]; then status=FAIL; else status=rehearsed; fi ;;
        124 | 137) status=TIMEOUT; printf 'stopped after %ss: %s' "$limit" "$(cat "$FIG")" >"$FIG" ;;
        *) status=FAIL ;;
        esac
    fi
    dt=$((SECONDS - t0))
    names+=("$name") statuses+=("$status") secs+=("$dt") figs+=("$(head -c 300 "$FIG")")
    printf '[%4ss] %-17s %-9s %4ss  %s\n' $((SECONDS - t_start)) "$name" "$status" "$dt" "$(head -c 200 "$FIG")"
    if [ "$status" = FAIL ] || [ "$status" = TIMEOUT ]; then
        failed=$((failed + 1))
        tail -n 12 "$OUT/stage-$name.log" 2>/dev/null | sed 's/^/    | /'
    elif [ "$status" = not-run ]; then
        not_run+=("$name") # the deadline's, not the code's: exit 3 where all else passed
    elif [ "$have_gpu" = 1 ] && [ "$status" != pass ] && ! { [ "$status" = skip ] && host_may_skip "$name"; }; then
        failed=$((failed + 1)) # on a GPU a check that did not run is a failure (header)
    fi
    append_log "$name" "$status" "$dt"
    write_summary
done

echo
cat "$OUT/summary.txt"
if [ "$failed" -gt 0 ]; then
    if [ "$have_gpu" = 1 ]; then
        echo "device-check: $failed stage(s) did not pass on the GPU (FAIL, TIMEOUT, skip or missing; logs: $OUT/logs.txt)"
    else
        echo "device-check: $failed stage(s) failed or timed out (logs: $OUT/logs.txt)"
    fi
    exit 1
fi
if [ "$have_gpu" != 1 ]; then
    echo "no CUDA device: the rest needs a GPU"
    exit 77
fi
if [ "${#not_run[@]}" -gt 0 ]; then
    echo "device-check: every stage that ran passed; not run for lack of time: ${not_run[*]} (FMOE_GPU_ONLY=\"${not_run[*]}\" runs them)"
    exit 3
fi
exit 0
