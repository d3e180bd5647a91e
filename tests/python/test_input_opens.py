"""Every input is opened through lib/files.c: a source check.

fmoe__open_regular, fmoe__fopen_regular and fmoe__read_file_bounded (lib/files.h)
open without blocking and refuse a FIFO or a device; a plain open(2) or fopen(3) of an
input would bring back the hang on a FIFO and the endless read of /dev/zero that
tests/python/test_special_files.py runs. This test fails when library or command code opens
a file for reading any other way, so a new input cannot miss the helpers. Opens for writing
(O_WRONLY, O_CREAT, "w") are the output helpers' business and not looked at here.
"""
import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[2]
DIRS = ["lib", "runtime", "sim", "trace", "cmd", "datasets"]

# Reads that are not through the helpers, each with the reason it is safe.
ALLOWED = {
    # the file tier reopens the model's shards, which the load opened with
    # fmoe__open_regular (runtime/model/safetensors.c) and lib/gguf.c checked
    ("runtime/offload/expert_tier.c", "open(path, O_RDONLY | O_CLOEXEC"),
    # simulate --sweep-out --resume reads its own output, which the parse checked to be
    # absent or a regular file (cmd/outputs.h)
    ("cmd/sweep_lines.c", 'fopen(path, exists ? "r+" : "w")'),
}

CALL = re.compile(r"(?<![\w.>])(fopen|open)\s*\(")
WRITES = re.compile(r'O_WRONLY|O_CREAT|"w|"a')


def test_inputs_are_opened_through_the_file_helpers():
    found = []
    for d in DIRS:
        for path in sorted((REPO / d).rglob("*.c")):
            rel = str(path.relative_to(REPO))
            if rel == "lib/files.c":
                continue
            for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                code = line.split("//")[0]
                if code.lstrip().startswith(("*", "/*")) or not CALL.search(code):
                    continue
                if WRITES.search(code) or "/dev/null" in code:
                    continue
                if any(rel == f and frag in code for f, frag in ALLOWED):
                    continue
                found.append(f"{rel}:{n}: {line.strip()}")
    assert not found, ("inputs opened without lib/files.c's helpers (fmoe__open_regular, "
                       "fmoe__read_file_bounded):\n" + "\n".join(found))


def test_the_check_sees_a_plain_open():
    """The pattern is not blind: it matches the calls it is meant to refuse."""
    assert CALL.search('FILE *f = fopen(path, "rb");')
    assert CALL.search("int fd = open(path, O_RDONLY);")
    assert not CALL.search("fmoe__open_regular(path)")
    assert not CALL.search("fmoe_gguf_open(path, &g)")
