"""tests/bench/bench_family_decode.py: its command line, and one round on the small
DeepSeek-V2-Lite shape with a stand-in for llama-completion that reports fixed timings in
llama.cpp's format (common_perf_print), so that the table's llama.cpp figures and the
ratio can be checked against numbers known here. The real llama.cpp comparison is the
lead's to run (docs/bench-models.md)."""
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

pytest.importorskip("gguf")

REPO = pathlib.Path(__file__).resolve().parents[2]
BENCH = REPO / "tests" / "bench" / "bench_family_decode.py"

# llama.cpp's lines: 250 ms for 241 prompt tokens, 400 ms for 3 decode runs
FAKE = """#!/bin/sh
case "$*" in *--version*) echo "version: 9999 (fake)" >&2; exit 0;; esac
echo "common_perf_print: prompt eval time =     250.00 ms /   241 tokens" >&2
echo "common_perf_print:        eval time =     400.00 ms /     3 runs   (x)" >&2
"""


def bench(*args):
    return subprocess.run([sys.executable, str(BENCH), *map(str, args)], capture_output=True,
                          text=True, timeout=600)


@pytest.mark.parametrize("args,what", [
    (["--shape", "deepseek-v2-lite"], "--llama-cpp"),
    (["--shape", "mixtral-8x7b", "--llama-cpp", "/tmp"], "invalid choice"),
    (["--shape", "gpt-oss-20b", "--llama-cpp", "/nonexistent"], "--llama-cpp"),
    (["--shape", "gpt-oss-20b", "--llama-cpp", "/tmp", "--threads", "0"], "--threads"),
])
def test_bad_arguments(args, what):
    p = bench(*args)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and what in p.stderr, p.stderr


def test_one_round_table(tmp_path):
    fmoe = pathlib.Path(REPO / "build" / "cmd" / "fmoe")
    build = os.environ.get("FMOE_BUILD_DIR")
    if build:
        fmoe = pathlib.Path(build).resolve() / "cmd" / "fmoe"
    if not fmoe.is_file():
        pytest.skip("no fmoe build")
    bins = tmp_path / "llama"
    bins.mkdir()
    fake = bins / "llama-completion"
    fake.write_text(FAKE)
    fake.chmod(0o755)
    runs = tmp_path / "runs.json"
    p = bench("--shape", "deepseek-v2-lite", "--small", "--llama-cpp", bins, "--threads", 1,
              "--tokens", 4, "--repeat", 1, "--work", tmp_path / "w", "--fmoe", fmoe,
              "--json", runs)
    assert p.returncode == 0, p.stderr
    rows = {m.group(1): m.groups()[1:] for m in re.finditer(
        r"^\| (fmoe|llama\.cpp|ratio fmoe / llama\.cpp) \|\s*(\d*)\s*\| ([\d.]+), ([\d.]+) \| "
        r"([\d.]+), ([\d.]+) \|$", p.stdout, re.M)}
    assert set(rows) == {"fmoe", "llama.cpp", "ratio fmoe / llama.cpp"}, p.stdout
    assert rows["llama.cpp"] == ("241", "964.0", "964.0", "7.5", "7.5")
    fm = json.loads(runs.read_text())["runs"]["fmoe"][0]
    assert fm["decode_tokens"] == 3
    assert float(rows["ratio fmoe / llama.cpp"][3]) == pytest.approx(
        fm["decode_tok_s"] / 7.5, abs=0.006)
    assert float(rows["ratio fmoe / llama.cpp"][1]) == pytest.approx(
        fm["prefill_tok_s"] / 964.0, abs=0.006)
    # the commands are printed, the model's included
    assert "make_shaped_gguf.py --shape deepseek-v2-lite" in p.stdout
    assert f"{fake} -m " in p.stdout
