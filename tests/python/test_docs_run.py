"""The docs' runnable examples run as written.

A command block in README.md or docs/ that the line `<!-- runnable -->` directly precedes
(an HTML comment: GitHub shows nothing) is run here by bash with `set -eo pipefail`, in a
folder where `datasets/`, `tests/` (and `.venv/`) are the repository's, with one
substitution: `fmoe` and `build/cmd/fmoe` at the start of a command become the binary
under test. An example that
drifts from the code (an option renamed, a default changed, an output that no longer
exists) then fails here instead of on a reader. A block fails if any command exits
non-zero; it may check its own outputs (`grep -q`, `test -s`).

The blocks of one page run in one folder, in page order, so a block may use the files an
earlier block of its page made (a trace recorded once serves the page's later examples, as
it would a reader following the page). A block selected alone (`-k`) first runs the page's
earlier blocks. `mpirun [flags] fmoe` and `VAR=value fmoe` are substituted too; a block
that runs `mpirun` is skipped where the binary was built without MPI or mpirun is missing.

A block written as a transcript (commands after `$ `, each followed by the output it
prints) runs command by command, and each command's stdout must be the lines shown under
it, exactly; a command shown without output is only required to succeed.
"""
import os
import pathlib
import re
import shutil
import subprocess

import pytest

from conftest import REPO

MARK = "<!-- runnable -->"


def doc_files():
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def runnable_blocks():
    """(file, line, text) of every indented or fenced block right after MARK."""
    out = []
    for f in doc_files():
        lines = f.read_text().split("\n")
        for i, line in enumerate(lines):
            if line.strip() != MARK:
                continue
            j = i + 1
            while j < len(lines) and not lines[j].strip():
                j += 1
            if j < len(lines) and lines[j].startswith("```"):
                k = j + 1
                while k < len(lines) and not lines[k].startswith("```"):
                    k += 1
                body = lines[j + 1:k]
            else:
                k = j
                while k < len(lines) and (lines[k].startswith("    ") or not lines[k].strip()):
                    k += 1
                body = [ln[4:] for ln in lines[j:k]]
            out.append((f.relative_to(REPO), j + 1, "\n".join(body).strip() + "\n"))
    return out


BLOCKS = runnable_blocks()


def _substitute(text, fmoe_bin):
    # only where a command starts: the line's start, or after |, &&, ||, ;, $(, a backslash
    # continuation's indentation, or mpirun and its flags
    return re.sub(r"(^|[|;&(]\s*|\$\(\s*|\bmpirun(?:\s+(?:-\S+|\d+))*\s+)"
                  r"((?:[A-Za-z_]\w*=\S*\s+)*)(?:build/cmd/)?fmoe(?=\s)",
                  lambda m: m.group(1) + m.group(2) + str(fmoe_bin), text, flags=re.M)


def _has_mpi(fmoe_bin):
    if shutil.which("mpirun") is None:
        return False
    r = subprocess.run([str(fmoe_bin), "version"], capture_output=True, text=True)
    return "mpi: not compiled" not in r.stdout


def test_the_docs_have_runnable_examples():
    # the examples marked so far (grow this as blocks are marked; never shrink it)
    assert len(BLOCKS) >= 28, [f"{f}:{n}" for f, n, _ in BLOCKS]


def transcript(text):
    """[(command, expected stdout lines)] of a `$ ` transcript, or None for a script."""
    lines = text.rstrip("\n").split("\n")
    if not lines[0].startswith("$ "):
        return None
    steps = []
    i = 0
    while i < len(lines):
        cmd = lines[i][2:]
        while cmd.endswith("\\") and i + 1 < len(lines):
            i += 1
            cmd = cmd[:-1] + "\n" + lines[i]
        i += 1
        shown = []
        while i < len(lines) and not lines[i].startswith("$ "):
            shown.append(lines[i].rstrip())
            i += 1
        steps.append((cmd, shown))
    return steps


def _bash(script, cwd):
    env = dict(os.environ, PATH=f"{REPO / '.venv' / 'bin'}:{os.environ['PATH']}")
    if "mpirun" in script and "ASAN_OPTIONS" in env:
        # the ASan build under mpirun: Open MPI's own leaks suppressed, as test_mpi.py does
        # (tests/python/lsan-openmpi.supp; the ranks inherit mpirun's environment)
        env["ASAN_OPTIONS"] += ":fast_unwind_on_malloc=0"
        supp = f"suppressions={pathlib.Path(__file__).parent / 'lsan-openmpi.supp'}"
        env["LSAN_OPTIONS"] = ":".join(x for x in (env.get("LSAN_OPTIONS"), supp) if x)
    return subprocess.run(["bash", "-c", "set -eo pipefail\n" + script], cwd=cwd,
                          capture_output=True, text=True, timeout=300, env=env)


def _run_block(fmoe_bin, folder, path, line, text):
    steps = transcript(text) or [(text, [])]
    for cmd, shown in steps:
        script = _substitute(cmd, fmoe_bin)
        r = _bash(script, folder)
        assert r.returncode == 0, (f"{path}:{line} exited {r.returncode}\n--- script\n"
                                   f"{script}\n--- stderr\n{r.stderr[-3000:]}")
        if shown:
            got = [ln.rstrip() for ln in r.stdout.rstrip("\n").split("\n")]
            assert got == shown, f"{path}:{line}: `{cmd}` printed\n{r.stdout}"


_pages = {}  # page -> [folder, index of the next block to run there]


@pytest.mark.parametrize("path,line,text", BLOCKS, ids=[f"{f}:{n}" for f, n, _ in BLOCKS])
def test_runnable_example(fmoe_bin, tmp_path_factory, path, line, text):
    if re.search(r"^\s*mpirun\s", text, flags=re.M) and not _has_mpi(fmoe_bin):
        pytest.skip("needs an MPI build and mpirun")
    page = [b for b in BLOCKS if b[0] == path]
    me = page.index((path, line, text))
    state = _pages.get(path)
    if state is None or state[1] > me:  # a fresh folder; also when a block runs again
        folder = tmp_path_factory.mktemp(path.stem)
        (folder / "datasets").symlink_to(REPO / "datasets")
        (folder / "tests").symlink_to(REPO / "tests")  # the tests' model generator
        if (REPO / ".venv").exists():  # `.venv/bin/python` as the docs write it
            (folder / ".venv").symlink_to((REPO / ".venv").resolve())
        state = _pages[path] = [folder, 0]
    while state[1] < me:  # the page's earlier blocks, when this one was selected alone
        _run_block(fmoe_bin, state[0], *page[state[1]])
        state[1] += 1
    state[1] = me + 1  # a failure here still lets the page's later blocks try
    _run_block(fmoe_bin, state[0], path, line, text)


def test_a_transcript_is_split_into_commands_and_outputs():
    assert transcript("$ fmoe a \\\n    --b\n1\n2\n$ fmoe c\n") == [
        ("fmoe a \n    --b", ["1", "2"]), ("fmoe c", [])]
    assert transcript("fmoe a\n") is None


def test_substitution_touches_only_commands(tmp_path):
    b = pathlib.Path("/x/fmoe")
    got = _substitute("fmoe record -o a.h5 && fmoe simulate --trace a.h5 | grep fmoe\n"
                      "build/cmd/fmoe serve --model fmoe-tiny\n"
                      "mpirun --oversubscribe -n 2 fmoe simulate --note fmoe\n"
                      "X=1 Y=2 fmoe trace recover a; P=$(fmoe inspect --plugin-path) h5dump\n", b)
    assert got == ("/x/fmoe record -o a.h5 && /x/fmoe simulate --trace a.h5 | grep fmoe\n"
                   "/x/fmoe serve --model fmoe-tiny\n"
                   "mpirun --oversubscribe -n 2 /x/fmoe simulate --note fmoe\n"
                   "X=1 Y=2 /x/fmoe trace recover a; P=$(/x/fmoe inspect --plugin-path) h5dump\n")
