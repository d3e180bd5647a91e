#!/usr/bin/env bash
# unpack-corpus.sh <target>... | --all: unpack the committed archive
# tests/fuzz/corpus/<target>.tar.zst into tests/fuzz/corpus/<target>/ (ignored by git), the
# folder libFuzzer runs on and merges into; pack-corpus.sh <target> packs it back. Refuses
# a folder that is already there, so inputs merged but not yet packed are never overwritten.
# The replay (meson test --suite fuzz) does not need this: it unpacks into the build folder.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
targets=()
for a in "$@"; do
    case $a in
        --all) for f in "$here"/corpus/*.tar.zst; do [ -f "$f" ] && targets+=("$(basename "$f" .tar.zst)"); done ;;
        -*) echo "usage: $0 <target>... | --all" >&2; exit 2 ;;
        *) targets+=("$a") ;;
    esac
done
[ ${#targets[@]} -gt 0 ] || { echo "usage: $0 <target>... | --all" >&2; exit 2; }
command -v zstd >/dev/null || { echo "$0: needs zstd (apt-get install zstd)" >&2; exit 1; }
for t in "${targets[@]}"; do
    dir=$here/corpus/$t
    in=$here/corpus/$t.tar.zst
    [ -f "$in" ] || { echo "$0: $in: no such archive" >&2; exit 1; }
    if [ -e "$dir" ]; then
        echo "$0: $dir is already there (pack-corpus.sh $t packs it back; or remove it)" >&2
        exit 1
    fi
    mkdir "$dir"
    tar -I zstd -xf "$in" -C "$dir"
    echo "$t: corpus/$t.tar.zst -> corpus/$t/ ($(find "$dir" -maxdepth 1 -type f | wc -l) inputs)"
done
