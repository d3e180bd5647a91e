"""The layering is held by the build (docs/design.md §1): each library compiles with its own
public include folder and those below it, so including a header of a layer above is a
compile error. Checked from the compile commands meson wrote, and by planting an upward
include and compiling it with a real source file's flags."""
import json
import os
import pathlib
import re
import shlex
import shutil
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


# Inside runtime/, the folders that share one library: which of them each may include from
# (by a relative "../x/y.h" include; docs/design.md §8.1). The backends implement the
# contract in backend/backend_impl.h and never see the model's internals (model_impl.h);
# the model reaches the backends only through that table, so no two folders include each
# other.
RUNTIME_MAY_INCLUDE = {
    "backend": {"backend"},
    "cpu": {"backend", "cpu"},
    "cuda": {"backend", "cuda"},
    "model": {"backend", "model"},
    "offload": {"backend", "model", "offload"},
}
_QUOTED_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def runtime_folder_violations(runtime):
    """Every quoted include in runtime/<folder>/ that reaches a folder it may not (or names
    model_impl.h from a backend), as 'file: "header" (folder -> other)'."""
    runtime = pathlib.Path(runtime)
    found = []
    for folder, allowed in sorted(RUNTIME_MAY_INCLUDE.items()):
        for src in sorted((runtime / folder).glob("*")):
            if src.suffix not in (".c", ".h", ".cu"):
                continue
            for header in _QUOTED_INCLUDE.findall(src.read_text(errors="replace")):
                target = os.path.normpath(src.parent / header)
                rel = pathlib.PurePath(os.path.relpath(target, runtime)).parts
                other = rel[0] if len(rel) > 1 and rel[0] != ".." else None
                if other is not None and other not in allowed:
                    found.append(f'{src.relative_to(runtime)}: "{header}" ({folder} -> {other})')
                elif folder != "model" and folder != "offload" and \
                        pathlib.PurePath(header).name == "model_impl.h":
                    found.append(f'{src.relative_to(runtime)}: "{header}" (a backend sees '
                                 "the model's internals)")
    return found


def test_runtime_folders_include_without_a_cycle():
    assert runtime_folder_violations(REPO / "runtime") == []


@pytest.mark.parametrize("folder,planted", [
    ("cpu", '#include "../model/model_impl.h"\n'),     # the cycle this rule removed
    ("cuda", '#include "../model/model_impl.h"\n'),
    ("model", '#include "../cpu/threadpool.h"\n'),     # where the pool used to be
    ("backend", '#include "../model/model_impl.h"\n'),
])
def test_a_planted_runtime_include_is_found(tmp_path, folder, planted):
    copy = tmp_path / "runtime"
    for name in RUNTIME_MAY_INCLUDE:
        shutil.copytree(REPO / "runtime" / name, copy / name)
    assert runtime_folder_violations(copy) == []
    (copy / folder / "planted.c").write_text(planted)
    found = runtime_folder_violations(copy)
    assert len(found) == 1 and found[0].startswith(f"{folder}/planted.c"), found


# What each library may export besides fmoe-prefixed names: nothing (the HDF5 filter
# plugin's entry points are HDF5's names, and it is a plugin, not a library one links).
LIBRARIES = ["lib/libfmoe-core.a", "trace/libfmoe-trace.a", "datasets/libfmoe-datasets.a",
             "sim/libfmoe-sim.a", "runtime/libfmoe-runtime.a"]


def exported(archive):
    p = subprocess.run(["nm", "-g", "--defined-only", str(archive)], capture_output=True,
                       text=True, check=True)
    return {ln.split()[2] for ln in p.stdout.splitlines() if len(ln.split()) == 3}


@pytest.mark.parametrize("lib", LIBRARIES)
def test_libraries_export_only_fmoe_names(build_dir, lib):
    """Every global symbol a library defines starts with fmoe (public fmoe_, internal
    fmoe__): a program linking fmoe and another library (jq's libjq exports jv_cmp, the
    name the Jinja interpreter's comparison once had) gets no duplicate symbols."""
    if not shutil.which("nm"):
        pytest.skip("nm (binutils) not installed")
    path = build_dir / lib
    if not path.exists():
        pytest.skip(f"{path}: not built")
    names = exported(path)
    assert names, f"{lib}: no symbols read"
    # names with two leading underscores are the toolchain's (ASan's __odr_asan.<name>)
    stray = sorted(n for n in names if not n.startswith(("fmoe", "__")))
    assert not stray, f"{lib} exports {len(stray)} names without the fmoe prefix: {stray[:10]}"
