#!/usr/bin/env bash
# tests/gpu/bundle.sh - builds, on this machine, the release tree that a GPU machine runs,
# and packs what tests/gpu/device-check.sh needs there into .gpu-carry/ (README.md beside
# this file says why and how it travels).
#
#     bash tests/gpu/bundle.sh          # configure/build build-gpu/, then pack .gpu-carry/
#     bash tests/gpu/bundle.sh --all    # build every target of build-gpu/ first
#     bash tests/gpu/bundle.sh --build build-x --carry .gpu-carry-x   # other folders
#
# The GPU machine has the CUDA toolkit, Python and its packages, but none of the Debian
# libraries fmoe links (libhdf5, libcjson, libopenblas, libmicrohttpd, libpcre2, and what
# they pull in: curl, gnutls, krb5...). So:
#   1. build-gpu/ is a release build with -Dcuda=enabled (and -Dmpi=disabled: Open MPI and
#      its plugins would have to travel too, and the device check runs one process) whose
#      executables and shared objects carry a DT_RPATH of $ORIGIN/../bundle-lib and $ORIGIN/../../bundle-lib
#      (--disable-new-dtags: an RPATH, unlike a RUNPATH, also serves the libraries' own
#      dependencies), so they find the bundled libraries wherever the tree lands, without
#      LD_LIBRARY_PATH, which would also reach python3 and torch;
#   2. every library those files need (ldd, transitively) goes into build-gpu/bundle-lib/,
#      except glibc's own and the CUDA libraries (the machine's toolkit provides those), and
#      except libstdc++ and libgcc_s: the machine's are newer, and an older libstdc++
#      loaded first would break the CUDA libraries that need the newer one;
#   3. .gpu-carry/build-gpu/ gets stripped copies of the files the device run uses, at
#      their build-tree paths, and bundle-lib.tar.xz (OpenBLAS alone is 36 MB unpacked,
#      4 MB in xz), which device-check.sh unpacks where the RPATH points;
#   4. .gpu-carry/SOURCES.sha256 lists the sha256 of every build input of the tree
#      (sources, headers, meson files; tracked and untracked), and MANIFEST a digest of that
#      list: device-check.sh's env stage checks them against the tree it runs in, so a
#      carried build older than the sources it is tested with fails there, in one line.
# Prints the size of .gpu-carry and of the working tree that travels with it.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../.."
root=$PWD
build=build-gpu
carry=.gpu-carry
build_all=0
while [ $# -gt 0 ]; do
    case $1 in
    --all) build_all=1 ;;
    --build | --carry)
        [ $# -ge 2 ] && [ -n "$2" ] || { echo "bundle.sh: $1 needs a folder" >&2; exit 2; }
        case $2 in /* | *..*) echo "bundle.sh: $1 $2: a folder inside the repository, relative" >&2; exit 2 ;; esac
        if [ "$1" = --build ]; then build=${2%/}; else carry=${2%/}; fi
        shift ;;
    -h | --help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "bundle.sh: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done

say() { printf 'bundle.sh: %s\n' "$*"; }
die() { printf 'bundle.sh: %s\n' "$*" >&2; exit 1; }

# .gpu-carry and the rehearsal's gpu-out must not travel as untracked files.
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
touch "$exclude"
for p in "/$carry/" /gpu-out/; do
    grep -qxF "$p" "$exclude" || echo "$p" >>"$exclude"
done

# ---- 1. build ---------------------------------------------------------------------------
# '$ORIGIN' reaches the linker as written: meson quotes it for ninja, ninja for the shell.
rpath_args='-Wl,--disable-new-dtags,-rpath,$ORIGIN/../bundle-lib,-rpath,$ORIGIN/../../bundle-lib'
if [ ! -f "$build/build.ninja" ]; then
    meson setup "$build" -Dcuda=enabled -Dmpi=disabled -Dbuildtype=release "-Dc_link_args=$rpath_args"
else
    meson setup --reconfigure "$build" -Dcuda=enabled -Dmpi=disabled -Dbuildtype=release "-Dc_link_args=$rpath_args"
fi

# What the device run uses: the binary, the CUDA module, the HDF5 plugin, the GPU tests,
# and the helpers tests/python's fixtures name (for tests/gpu's pytest files). Targets
# this tree does not define (yet) are left out with a note.
wanted=(
    cmd/fmoe
    runtime/libfmoe-cuda.so
    trace/libh5zstd.so
    tests/gpu/test_backend_ops
    tests/gpu/test_cuda
    tests/model/test_cuda_ops
    tests/model/forward_driver
    tests/model/test_quant_matvec
    tests/trace/write_sample
    tests/expertmap/write_sample_store
    tests/lib/test_decision_log
    tests/lib/test_quant
    tests/lib/test_quant_act
    tests/lib/bench_quant
    tests/sim/fmoe_calibrate_cli
)
targets=()
for t in "${wanted[@]}"; do
    if grep -q "^build $t:" "$build/build.ninja"; then
        targets+=("$t")
    else
        say "no target $t in this tree: not carried"
    fi
done
# The CUDA module's objects are always compiled afresh: meson 1.0 (Debian 12's) passes nvcc
# no flag to write a dependency file, so ninja does not know which headers a .cu includes
# and keeps a .cu object built from older headers (a module that reports an older ABI, or
# a layout the loader refuses, only found once the bundle is on a device).
rm -f "$build"/runtime/libfmoe-cuda.so.p/*.o
if [ "$build_all" = 1 ]; then
    ninja -C "$build"
else
    ninja -C "$build" "${targets[@]}"
fi
[ -f "$build/runtime/libfmoe-cuda.so" ] || die "$build/runtime/libfmoe-cuda.so was not built (is nvcc found?)"

# ---- 2. the libraries -------------------------------------------------------------------
is_system_lib() { # glibc's own, the compiler runtime, the CUDA driver and toolkit
    case $1 in
    linux-vdso.so* | ld-linux*.so* | libc.so.* | libm.so.* | libmvec.so.* | libpthread.so.* | \
        libdl.so.* | librt.so.* | libresolv.so.* | libutil.so.* | libanl.so.* | \
        libnss_*.so.* | libthread_db.so.* | libBrokenLocale.so.* | libstdc++.so.* | \
        libgcc_s.so.* | libcuda.so* | libcudart.so* | libcublas*.so* | libnvidia-*.so* | \
        libnvrtc*.so* | libnvJitLink*.so*)
        return 0 ;;
    esac
    return 1
}

rm -rf "$build/bundle-lib"
mkdir -p "$build/bundle-lib"
missing=0
for t in "${targets[@]}"; do
    f="$build/$t"
    [ -f "$f" ] || continue
    while read -r line; do
        case $line in
        *"not found"*)
            name=${line%% *}
            is_system_lib "$name" || { say "$t: $line"; missing=1; } ;;
        *"=> /"*)
            name=${line%% *}
            path=${line#*=> }
            path=${path%% (*}
            if ! is_system_lib "$name" && [ ! -e "$build/bundle-lib/$name" ]; then
                cp -L "$path" "$build/bundle-lib/$name"
            fi ;;
        esac
    done < <(ldd "$f")
done
[ "$missing" = 0 ] || die "libraries not found here (see above)"
chmod u+w "$build"/bundle-lib/*
strip --strip-unneeded "$build"/bundle-lib/* 2>/dev/null || true

# ---- 3. the carried folder ----------------------------------------------------------------
rm -rf "$carry"
mkdir -p "$carry/build-gpu"
for t in "${targets[@]}"; do
    [ -f "$build/$t" ] || continue
    mkdir -p "$carry/build-gpu/$(dirname "$t")"
    cp "$build/$t" "$carry/build-gpu/$t"
    strip --strip-unneeded "$carry/build-gpu/$t"
done
# tests/python/conftest.py accepts FMOE_BUILD_DIR only where a build.ninja exists
printf '# stub: the meson build this folder was copied from is %s on the machine that built it\n' \
    "$root/$build" >"$carry/build-gpu/build.ninja"
XZ_OPT='-9 -T0' tar -cJf "$carry/build-gpu/bundle-lib.tar.xz" -C "$build" bundle-lib
# What meson compiles or reads: C and CUDA sources, headers, meson files (no generators
# run scripts; the Python tests and the data are read from the tree at run time, so editing
# them does not make the carried build stale).
git ls-files -z --cached --others --exclude-standard |
    grep -zE '(^|/)(meson\.build|meson_options\.txt)$|\.(c|h|cu|cuh|inc)$' |
    LC_ALL=C sort -z | xargs -0 sha256sum -- >"$carry/SOURCES.sha256"
{
    echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n)"
    echo "commit: $(git rev-parse HEAD) ($(git log -1 --format=%s | cut -c1-80))"
    echo "working tree: $(git status --short | wc -l) changed or untracked paths," \
        "diff sha256 $(git diff HEAD | sha256sum | cut -c1-16)"
    echo "sources: sha256 $(sha256sum <"$carry/SOURCES.sha256" | cut -c1-64) of SOURCES.sha256" \
        "($(wc -l <"$carry/SOURCES.sha256") build inputs)"
    echo "needs: $(objdump -T "$carry"/build-gpu/cmd/fmoe "$build"/bundle-lib/* 2>/dev/null |
        grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1) or newer"
    echo "rpath of cmd/fmoe: $(readelf -d "$carry/build-gpu/cmd/fmoe" | grep -E 'R(UN)?PATH' |
        sed 's/.*\[\(.*\)\]/\1/')"
    echo "bundled: $(cd "$build/bundle-lib" && ls | tr '\n' ' ')"
    echo "carried files:"
    (cd "$carry/build-gpu" && find . -type f -printf '  %P %s\n' | sort)
} >"$carry/MANIFEST"

# The stripped copies must still start.
"$carry/build-gpu/cmd/fmoe" --version >/dev/null || die "the stripped fmoe does not start"

# ---- sizes ----------------------------------------------------------------------------
carry_bytes=$(du -sb "$carry" | cut -f1)
tree_bytes=$( (git ls-files -z --cached --others --exclude-standard |
    xargs -0 stat -c %s -- 2>/dev/null || true) | awk '{s += $1} END {print s + 0}')
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
say "bundled libraries: $(ls "$build/bundle-lib" | wc -l), $(mib "$(du -sb "$build/bundle-lib" | cut -f1)") unpacked"
cat "$carry/MANIFEST" | sed -n '/^carried files/,$p'
say "carry: [\"$carry\"]  $(mib "$carry_bytes")"
say "tree that travels with it (tracked + untracked, not ignored): $(mib "$tree_bytes")"
say "total $(mib $((carry_bytes + tree_bytes))) of the 64 MiB limit"
if [ "$carry_bytes" -gt $((25 * 1048576)) ]; then
    say "WARNING: the carry is over 25 MiB"
fi
if [ $((carry_bytes + tree_bytes)) -gt $((64 * 1048576)) ]; then
    # not fatal here (the rehearsal runs all the same), but the device run is refused
    say "WARNING: over the 64 MiB a device run takes: it will be refused until the tree" \
        "or the carry is $(mib $((carry_bytes + tree_bytes - 64 * 1048576))) smaller"
fi
