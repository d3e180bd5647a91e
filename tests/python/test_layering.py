"""The layering is held by the build (docs/design.md §1): each library compiles with its own
public include folder and those below it, so including a header of a layer above is a
compile error. Checked from the compile commands meson wrote, and by planting an upward
include and compiling it with a real source file's flags."""
import json
import pathlib
import shlex
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]

# Each library's public folder and the folders it may see (its own and those below it).
FOLDERS = {"lib": "lib/include", "trace": "trace/include", "datasets": "datasets/include",
           "sim": "sim/include", "runtime": "runtime/include"}
SEES = {"lib": {"lib"}, "trace": {"lib", "trace"}, "datasets": {"lib", "trace", "datasets"},
        "sim": {"lib", "trace", "sim"}, "runtime": {"lib", "trace", "runtime"}}


@pytest.fixture(scope="module")
def commands(build_dir):
    path = build_dir / "compile_commands.json"
    if not path.exists():
        pytest.skip(f"{path}: meson writes it at setup")
    return json.loads(path.read_text())


def _library(entry):
    """The library a compile command builds for (the build folder its object goes to:
    lib/error.c compiled into the CUDA module belongs to runtime/), or None (tests, cmd)."""
    out = entry.get("output")
    if out is None:
        args = shlex.split(entry["command"]) if "command" in entry else entry["arguments"]
        out = args[args.index("-o") + 1]
    top = pathlib.PurePath(out).parts[0]
    return top if top in SEES else None


def _include_folders(entry):
    """The public include folders (keys of FOLDERS) on a compile command's -I list."""
    args = shlex.split(entry["command"]) if "command" in entry else entry["arguments"]
    seen = set()
    for i, a in enumerate(args):
        d = a[2:] if a.startswith("-I") and len(a) > 2 else (args[i + 1] if a == "-I" else None)
        if d is None:
            continue
        p = (pathlib.Path(entry["directory"]) / d).resolve()
        for name, folder in FOLDERS.items():
            if p == (REPO / folder).resolve():
                seen.add(name)
    return seen


def test_every_library_sees_only_the_folders_below_it(commands):
    checked = 0
    for e in commands:
        lib = _library(e)
        if lib is None or e["file"].endswith(".cu"):
            continue
        folders = _include_folders(e)
        assert folders <= SEES[lib], f"{e['file']} ({lib}) compiles with {sorted(folders)}"
        # its own folder, or none at all (the HDF5 zstd plugin takes only HDF5's headers)
        assert not folders or lib in folders, f"{e['file']} ({lib}) lacks its own folder"
        checked += 1
    assert checked > 100  # the libraries' sources were found in the compile commands


def _compile_with_flags_of(commands, source_suffix, text, tmp_path):
    """Compiles `text` with the flags meson uses for the source ending in source_suffix."""
    e = next(c for c in commands if c["file"].endswith(source_suffix))
    args = shlex.split(e["command"]) if "command" in e else list(e["arguments"])
    keep = [args[0]]
    skip = False
    for a in args[1:]:
        if skip:
            skip = False
            continue
        if a in ("-o", "-MF", "-MQ", "-c"):
            skip = True
            continue
        if a in ("-MD",) or a.endswith(e["file"]):
            continue
        keep.append(a)
    planted = tmp_path / "planted.c"
    planted.write_text(text)
    return subprocess.run(keep + ["-fsyntax-only", str(planted)], cwd=e["directory"],
                          capture_output=True, text=True)


@pytest.mark.parametrize("source,header", [
    ("runtime/serve/serve_engine.c", "sim.h"),   # runtime and sim never include each other
    ("sim/executor.c", "model.h"),
    ("lib/policies/registry.c", "trace.h"),       # lib is below trace
    ("trace/trace_writer.c", "sim.h"),
    ("datasets/import_jsonl.c", "tokenizer.h"),
])
def test_a_planted_upward_include_does_not_compile(commands, tmp_path, source, header):
    if not any(c["file"].endswith(source) for c in commands):
        pytest.skip(f"{source} not in the compile commands")
    r = _compile_with_flags_of(commands, source, f'#include "fmoe/{header}"\n', tmp_path)
    assert r.returncode != 0 and f"fmoe/{header}" in r.stderr, r.stderr
    # and the same flags compile a header the layer may see: the failure is the layering's
    ok = _compile_with_flags_of(commands, source, '#include "fmoe/error.h"\n', tmp_path)
    assert ok.returncode == 0, ok.stderr
