#!/bin/sh
# run_bench_simulate.sh - simulator throughput per policy on a >= 10 M-access synthetic trace,
# and the ratio against the straightforward Python reference (tests/python/reference_cache.py)
# on a prefix of the very same trace, per access. Hit counts of the prefix must agree.
# Not part of the test suite (timings depend on the machine and its load).
#
#     tests/bench/run_bench_simulate.sh [BUILD_DIR] [REQUESTS] [PREFIX_REQUESTS] [CACHE]
#
# BUILD_DIR defaults to ./build (meson; a plain, optimised build: -Dbuildtype=release or the
# default debugoptimized, no sanitizers). 2000 requests = 13.3 M accesses.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
build=${1:-$repo/build}
requests=${2:-2000}
prefix=${3:-20}
cache=${4:-64}
bench=$build/tests/sim/bench_simulate
[ -x "$bench" ] || { echo "run_bench_simulate: $bench not built (ninja -C $build)" >&2; exit 1; }
python=${PYTHON:-$repo/.venv/bin/python}
[ -x "$python" ] || python=python3
# Policies the Python reference implements (no prefetch: hits depend on the sequence only).
ref_policies=lru,lfu,belady,least-stale,moe-infinity-code
all_policies=ondemand,$ref_policies,oracle,moe-infinity
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "machine: $(nproc) cpus, load average $(cut -d' ' -f1-3 /proc/loadavg)"
"$bench" --requests "$requests" --cache "$cache" --policies "$all_policies" \
    --prefix "$prefix" --dump "$tmp/prefix.bin" | tee "$tmp/c.txt"
"$python" "$repo/tests/python/reference_cache.py" "$tmp/prefix.bin" "$cache" "$ref_policies" \
    | tee "$tmp/py.txt"

echo
printf '%-18s %12s %12s %12s %10s %s\n' policy "C M acc/s" "C/core" "Py M acc/s" ratio \
    "prefix hits C = Py"
status=0
for p in $(echo "$all_policies" | tr ',' ' '); do
    c=$(grep "^policy $p " "$tmp/c.txt")
    cw=$(echo "$c" | awk '{for(i=1;i<NF;i++) if($i=="M_accesses_per_s_wall") print $(i+1)}')
    cc=$(echo "$c" | awk '{for(i=1;i<NF;i++) if($i=="M_accesses_per_s_cpu") print $(i+1)}')
    ch=$(echo "$c" | awk '{for(i=1;i<NF;i++) if($i=="prefix_hits") print $(i+1)}')
    py=$(grep "^policy $p " "$tmp/py.txt" || true)
    if [ -n "$py" ]; then
        pr=$(echo "$py" | awk '{for(i=1;i<NF;i++) if($i=="accesses_per_s") print $(i+1)/1e6}')
        ph=$(echo "$py" | awk '{for(i=1;i<NF;i++) if($i=="hits") print $(i+1)}')
        ratio=$(awk -v a="$cc" -v b="$pr" 'BEGIN{printf "%.0fx", a/b}')
        same=$([ "$ch" = "$ph" ] && echo "yes ($ch)" || echo "NO: C $ch, Python $ph")
        [ "$ch" = "$ph" ] || status=1
    else
        pr=-; ratio=-; same="(no Python reference)"
    fi
    printf '%-18s %12s %12s %12s %10s %s\n' "$p" "$cw" "$cc" "$pr" "$ratio" "$same"
done
echo "C: wall-clock and per-core (process CPU time) rates; ratio = C per core / Python, per access"
exit $status
