#!/usr/bin/env bash
# pack-corpus.sh <target>... | --all: re-pack tests/fuzz/corpus/<target>/ (the loose inputs,
# as unpack-corpus.sh leaves them and libFuzzer's -merge=1 adds to them) into the committed
# archive tests/fuzz/corpus/<target>.tar.zst, then remove the folder. The archive holds the
# folder's regular, non-hidden files (what the replay reads) at its top level, sorted by
# name, with mtime 0, owner 0 and mode 0644, so the same inputs give the same bytes (with
# the same zstd). --keep leaves the folder in place.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
keep=0
targets=()
for a in "$@"; do
    case $a in
        --keep) keep=1 ;;
        --all) for d in "$here"/corpus/*/; do [ -d "$d" ] && targets+=("$(basename "$d")"); done ;;
        -*) echo "usage: $0 [--keep] <target>... | --all" >&2; exit 2 ;;
        *) targets+=("$a") ;;
    esac
done
if [ ${#targets[@]} -eq 0 ]; then
    echo "usage: $0 [--keep] <target>... | --all  (nothing unpacked under $here/corpus/)" >&2
    exit 2
fi
command -v zstd >/dev/null || { echo "$0: needs zstd (apt-get install zstd)" >&2; exit 1; }
for t in "${targets[@]}"; do
    dir=$here/corpus/$t
    out=$here/corpus/$t.tar.zst
    [ -d "$dir" ] || { echo "$0: $dir: no such folder (unpack-corpus.sh $t first)" >&2; exit 1; }
    n=$(find "$dir" -maxdepth 1 -type f ! -name '.*' | wc -l)
    [ "$n" -gt 0 ] || { echo "$0: $dir holds no inputs" >&2; exit 1; }
    (cd "$dir" && find . -maxdepth 1 -type f ! -name '.*' -printf '%P\n') |
        LC_ALL=C tar --format=gnu --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner \
            --mode=0644 -I 'zstd -19 -T0 -q' -cf "$out.tmp" -C "$dir" -T -
    mv "$out.tmp" "$out"
    echo "$t: $n inputs -> corpus/$t.tar.zst ($(stat -c %s "$out") bytes)"
    [ $keep = 1 ] || rm -rf -- "$dir"
done
