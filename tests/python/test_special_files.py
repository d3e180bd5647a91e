"""Special files as inputs: a FIFO or a device where fmoe reads a file.

A FIFO without a writer used to block the open (simulate --profile, tokenize --tokenizer,
any file of a model directory; serve blocked there and so ignored SIGTERM), and /dev/zero
was read until memory ran out (tokenize --tokenizer, compare-logs, tokenize --file -). Every
text and JSON input is now read by one helper (fmoe__read_file_bounded in lib/files.c):
regular files only, except where the input may be a pipe (tokenize --file -), and at most a
size per format. Each case must end within seconds with one line on stderr naming the file
and a non-zero exit; the timeout turns a regression into a failure instead of a hang, and a
memory limit one that reads without end.
"""
import os
import pathlib
import shutil
import signal
import subprocess
import time

import pytest

from memory_limit import limit_address_space

REPO = pathlib.Path(__file__).resolve().parents[2]
TINY = REPO / "datasets" / "fmoe-tiny"
ROUTES = REPO / "tests" / "fixtures" / "datasets" / "routing_small.jsonl"
GEOMETRY = ("--layers", "2", "--experts", "8", "--top-k", "2")
TIMEOUT = 10  # seconds: each case ends in well under one

_limit_memory = limit_address_space(2 << 30)


def run(fmoe_bin, *args, stdin=None):
    return subprocess.run([str(fmoe_bin), *map(str, args)], capture_output=True, text=True,
                          timeout=TIMEOUT, stdin=stdin, preexec_fn=_limit_memory)


def one_line(p, *fragments):
    """A failure (exit 1 or 2) with exactly one stderr line holding every fragment."""
    lines = p.stderr.strip().splitlines()
    assert p.returncode in (1, 2), (p.returncode, p.stderr)
    assert len(lines) == 1, p.stderr
    for f in fragments:
        assert f in lines[0], (f, lines[0])


@pytest.fixture
def fifo(tmp_path):
    f = tmp_path / "fifo"
    os.mkfifo(f)
    return f


@pytest.fixture
def trace(fmoe, tmp_path):
    src = tmp_path / "in.jsonl"
    shutil.copy(ROUTES, src)
    out = tmp_path / "t.h5"
    fmoe("trace", "import", *GEOMETRY, "--expert-bytes", "1000000", src, "-o", out, "--quiet")
    return out


def decision_log(fmoe, trace, path):
    fmoe("simulate", "--trace", trace, "--cache-experts", "4", "--decision-log", path)
    return path


# ---- named inputs: a FIFO, and /dev/zero ----------------------------------------------------

CASES = {
    "simulate --profile": lambda t, x: ["simulate", "--trace", t, "--cache-experts", "4",
                                        "--profile", x],
    "simulate --model-config": lambda t, x: ["simulate", "--trace", t, "--cache-experts", "4",
                                             "--model-config", x],
    "calibrate --model-config": lambda t, x: ["calibrate", "--quick", "--model-config", x,
                                              "-o", t.parent / "p.json"],
    "calibrate --link-file": lambda t, x: ["calibrate", "--quick", "--link", "file",
                                           "--link-file", x, "-o", t.parent / "p.json"],
    "generate --profile": lambda t, x: ["generate", "--model", TINY, "--prompt", "hi",
                                        "--cache-experts", "2", "--miss", "auto",
                                        "--profile", x],
    "tokenize --tokenizer": lambda t, x: ["tokenize", "--tokenizer", x, "--text", "hi"],
    "compare-logs first": lambda t, x: ["compare-logs", x, t.parent / "log.jsonl"],
    "compare-logs second": lambda t, x: ["compare-logs", t.parent / "log.jsonl", x],
    "record --arrivals": lambda t, x: ["record", "--model", TINY, "--dataset",
                                       REPO / "datasets" / "samples" / "prompts_100.txt",
                                       "--arrivals", x, "-o", t.parent / "r.h5"],
    "trace import --model-config": lambda t, x: ["trace", "import", "--model-config", x,
                                                 ROUTES, "-o", t.parent / "o.h5"],
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_special_file_input(fmoe, fmoe_bin, trace, fifo, case, kind):
    decision_log(fmoe, trace, trace.parent / "log.jsonl")
    special = fifo if kind == "fifo" else pathlib.Path("/dev/zero")
    p = run(fmoe_bin, *CASES[case](trace, special))
    one_line(p, str(special), "not a regular file")


# ---- the files of a model directory ---------------------------------------------------------

MODEL_FILES = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
               "generation_config.json"]


@pytest.fixture
def model(tmp_path):
    d = tmp_path / "model"
    shutil.copytree(TINY, d)
    return d


@pytest.mark.parametrize("name", MODEL_FILES)
def test_fifo_in_a_model_directory(fmoe_bin, model, name):
    f = model / name
    f.unlink()
    os.mkfifo(f)
    p = run(fmoe_bin, "generate", "--model", model, "--prompt", "hi", "--max-new-tokens", "1")
    one_line(p, str(f), "not a regular file")


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json"])
def test_serve_with_a_fifo_in_the_model_stops(fmoe_bin, model, tmp_path, name):
    """serve refuses the FIFO at load and exits, instead of blocking there (where it
    ignored SIGTERM)."""
    f = model / name
    f.unlink()
    os.mkfifo(f)
    p = subprocess.Popen([str(fmoe_bin), "serve", "--model", str(model), "--port", "0",
                          "--port-file", str(tmp_path / "port")], stderr=subprocess.PIPE,
                         text=True, preexec_fn=_limit_memory)
    try:
        rc = p.wait(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGTERM)
        time.sleep(1)
        p.kill()
        p.wait()
        pytest.fail(f"serve blocked on the FIFO {f}")
    err = p.stderr.read()
    assert rc == 1, err
    assert str(f) in err and "not a regular file" in err, err


# ---- pipes where a pipe is allowed: bounded ---------------------------------------------------

def test_tokenize_stdin_from_dev_zero_is_bounded(fmoe_bin):
    with open("/dev/zero", "rb") as zero:
        p = run(fmoe_bin, "tokenize", "--tokenizer", TINY, "--file", "-", stdin=zero)
    one_line(p, "standard input", "more than")


def test_tokenize_stdin_from_a_pipe_still_works(fmoe_bin):
    p = subprocess.run([str(fmoe_bin), "tokenize", "--tokenizer", str(TINY), "--file", "-"],
                       input="hello world", capture_output=True, text=True, timeout=TIMEOUT)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip()
