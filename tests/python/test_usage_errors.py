"""Usage errors are exit 2 and one line, in every command, consistently.

A usage error is anything wrong with the command line itself: an unknown option, a value that
does not parse or is out of range (including out of range for the file it names, such as a
prefetch distance beyond the trace's layers), an unknown name (policy, hardware preset), a
missing required option, a wrong combination, an extra argument. Each must exit 2 with
exactly one line on stderr and nothing on stdout. A failure on a valid command line (a file
that cannot be read) is exit 1. Every command is run, so a new command joins the sweep by
being listed here.
"""
import pathlib
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
ROUTES = REPO / "tests" / "fixtures" / "datasets" / "routing_small.jsonl"
GEOMETRY = ("--layers", "2", "--experts", "8", "--top-k", "2")  # L = 2: distances 0..1

COMMANDS = ["record", "build-store", "train-predictor", "simulate", "compare-logs", "serve",
            "calibrate", "generate", "tokenize", "trace", "trace import", "inspect", "demo",
            "version", "help"]

# A value that is not a number, for one numeric option of each command that has one.
BAD_NUMBER = {
    "record": ["--max-new-tokens", "abc"],
    "build-store": ["--capacity", "12x"],
    "train-predictor": ["--epochs", "abc"],
    "simulate": ["--cache-experts", "abc"],
    "serve": ["--port", "abc"],
    "calibrate": ["--threads", "abc"],
    "generate": ["--max-new-tokens", "1e99"],
    "trace import": ["--layers", "abc"],
}

# Nothing at all: each command that needs something says what, in one line.
NEEDS_ARGUMENTS = ["record", "build-store", "train-predictor", "simulate", "compare-logs",
                   "generate", "tokenize", "trace", "trace import", "inspect"]

# Arguments no command takes.
EXTRA_ARGUMENT = {
    "compare-logs": ["a.jsonl", "b.jsonl", "c.jsonl"],
    "inspect": ["--plugin-path", "x"],
    "demo": ["extra"],
    "version": ["extra"],
    "help": ["simulate", "extra"],
    "calibrate": ["extra"],
    "simulate": ["--trace", "t.h5", "--cache-experts", "4", "extra"],
}


def run(fmoe_bin, *args, cwd=None):
    return subprocess.run([str(fmoe_bin), *map(str, args)], capture_output=True, text=True,
                          timeout=120, cwd=cwd)


def usage_error(p, *fragments):
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert p.stdout == "", p.stdout
    assert len(lines) == 1, p.stderr
    for f in fragments:
        assert f in lines[0], (f, lines[0])


@pytest.fixture(scope="module")
def trace(fmoe_bin, tmp_path_factory):
    """A 2-layer trace (L = 2) and its expert-map store, built with prefetch distance 1."""
    d = tmp_path_factory.mktemp("usage")
    t = d / "t.h5"
    p = run(fmoe_bin, "trace", "import", *GEOMETRY, "--expert-bytes", "1000000", ROUTES, "-o",
            t, "--quiet")
    assert p.returncode == 0, p.stderr
    return t


@pytest.mark.parametrize("cmd", COMMANDS)
def test_unknown_option(fmoe_bin, tmp_path, cmd):
    usage_error(run(fmoe_bin, *cmd.split(), "--nonexistent-option", cwd=tmp_path),
                "--nonexistent-option")


@pytest.mark.parametrize("cmd", sorted(BAD_NUMBER))
def test_bad_number(fmoe_bin, tmp_path, cmd):
    usage_error(run(fmoe_bin, *cmd.split(), *BAD_NUMBER[cmd], cwd=tmp_path),
                BAD_NUMBER[cmd][0])


@pytest.mark.parametrize("cmd", NEEDS_ARGUMENTS)
def test_missing_required(fmoe_bin, tmp_path, cmd):
    usage_error(run(fmoe_bin, *cmd.split(), cwd=tmp_path))


@pytest.mark.parametrize("cmd", sorted(EXTRA_ARGUMENT))
def test_extra_argument(fmoe_bin, tmp_path, cmd):
    usage_error(run(fmoe_bin, *cmd.split(), *EXTRA_ARGUMENT[cmd], cwd=tmp_path))


def test_unknown_hardware_lists_presets(fmoe_bin, trace):
    usage_error(run(fmoe_bin, "simulate", "--trace", trace, "--cache-experts", 4, "--quiet",
                    "--hardware", "nosuch"),
                "unknown hardware 'nosuch'", "rtx3090-pcie4", "h100-sxm")


def test_unknown_hardware_before_reading_anything(fmoe_bin, tmp_path):
    """The name is checked with the other options, not after opening the trace."""
    usage_error(run(fmoe_bin, "simulate", "--trace", tmp_path / "absent.h5",
                    "--cache-experts", 4, "--hardware", "nosuch"), "nosuch")


@pytest.mark.parametrize("policy", ["fmoe", "oracle", "moe-infinity", "fmoe-paper,lru"])
def test_simulate_distance_beyond_layers(fmoe_bin, trace, policy):
    usage_error(run(fmoe_bin, "simulate", "--trace", trace, "--cache-experts", 4, "--quiet",
                    "--policy", policy, "--prefetch-distance", "1,99999"),
                "--prefetch-distance", "99999", "2 MoE layers")


@pytest.mark.parametrize("d", [2, 99999])
def test_build_store_distance_beyond_layers(fmoe_bin, trace, tmp_path, d):
    out = tmp_path / "s.h5"
    usage_error(run(fmoe_bin, "build-store", "--trace", trace, "-o", out,
                    "--prefetch-distance", d, "--quiet"), "--prefetch-distance", str(d))
    assert not out.exists() and not pathlib.Path(f"{out}.partial").exists()


def test_default_distance_beyond_layers_is_clamped(fmoe_bin, trace):
    """fmoe's own default (3) does not fit L = 2: that policy runs at d = 1 with a note, and
    the rest of the sweep runs as asked."""
    p = run(fmoe_bin, "simulate", "--trace", trace, "--cache-experts", "2,4", "--json",
            "--policy", "fmoe-paper,lru,moe-infinity", "--quiet")
    assert p.returncode == 0, p.stderr
    notes = [l for l in p.stderr.splitlines() if "default" in l]
    assert len(notes) == 1 and "fmoe-paper" in notes[0] and "1" in notes[0], p.stderr
    import json
    res = json.loads(p.stdout)["results"]
    assert len(res) == 6
    got = {(r["policy"], r["cache_experts"]): r["prefetch_distance"] for r in res}
    assert got[("fmoe-paper", 2)] == 1 and got[("fmoe-paper", 4)] == 1
    assert got[("moe-infinity", 2)] == 1 and got[("lru", 4)] == 0


def test_failure_on_valid_usage_is_exit_1(fmoe_bin, tmp_path):
    p = run(fmoe_bin, "simulate", "--trace", tmp_path / "absent.h5", "--cache-experts", 4,
            "--quiet")
    assert p.returncode == 1, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and p.stdout == ""


TINY = REPO / "datasets" / "fmoe-tiny"

# Wrong combinations and unknown names found by the sweep (each used to exit 1, or 0 with the
# option ignored).
COMBINATIONS = {
    "generate-chat-template": ["generate", "--prompt", "hi", "--chat", "--chat-template",
                               "nosuch"],
    "record-chat-template": ["record", "--dataset", "absent.txt", "-o", "r.h5", "--chat",
                             "--chat-template", "nosuch"],
    "tokenize-chat-template": ["tokenize", "--tokenizer", TINY, "--text", "a", "--chat",
                               "--chat-template", "nosuch"],
    "tokenize-skip-special-encoding": ["tokenize", "--tokenizer", TINY, "--text", "a",
                                       "--skip-special"],
    "tokenize-no-special-decoding": ["tokenize", "--tokenizer", TINY, "--decode", "1,2",
                                     "--no-special"],
    "inspect-plugin-path-json": ["inspect", "--plugin-path", "--json"],
    "trace-unknown-subcommand": ["trace", "nosuch"],
    "record-store-out-not-offloaded": ["record", "--dataset",
                                       REPO / "datasets" / "samples" / "prompts_100.txt",
                                       "-o", "r.h5", "--store-out", "s.h5"],
    "generate-store-out-not-offloaded": ["generate", "--prompt", "hi", "--store-out", "s.h5"],
}


@pytest.mark.parametrize("case", sorted(COMBINATIONS))
def test_wrong_combination(fmoe_bin, tmp_path, case):
    usage_error(run(fmoe_bin, *COMBINATIONS[case], cwd=tmp_path))


def test_chat_template_lists_the_names(fmoe_bin, tmp_path):
    usage_error(run(fmoe_bin, *COMBINATIONS["generate-chat-template"], cwd=tmp_path),
                "nosuch", "mixtral, chatml, qwen3, olmoe")
