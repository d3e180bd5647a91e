"""`--miss auto` in live offloaded runs (generate, record, serve): each miss computed on the
host or demand-loaded, whichever a hardware profile estimates ends first (Fiddler's rule,
as `fmoe simulate --miss auto`).

The profiles are `fmoe calibrate --quick`'s for fmoe-tiny with the link or the host
compute made extreme, so that the choice does not depend on this machine: a link of 1 s
per copy sends every miss to the host; a free link and a host taking a second per expert
sends none. Either way the greedy tokens equal the all-resident run's (the choice moves
where an expert is computed, never what it computes). A profile between the two makes the
choice follow the tokens routed to the expert: a decode miss (one token) goes to the host,
while prefill misses with many tokens are loaded.
"""
import json
import pathlib
import subprocess

import pytest

import serve_util

REPO = pathlib.Path(__file__).resolve().parents[2]
TINY = REPO / "datasets" / "fmoe-tiny"
PROMPT = "The dictionary type maps keys to values, and"
LONG_PROMPT = ("Python lists are ordered, mutable sequences. They hold items of any type, grow "
               "and shrink as needed, and support slicing, sorting and comprehensions. A "
               "dictionary maps keys to values; a set holds unique items. Tuples are")


def run(fmoe_bin, *args, check=True):
    p = subprocess.run([str(fmoe_bin), *map(str, args)], capture_output=True, text=True,
                       timeout=300)
    if check and p.returncode != 0:
        raise AssertionError(f"fmoe {' '.join(map(str, args))} exited {p.returncode}:\n"
                             f"{p.stdout}\n{p.stderr}")
    return p


@pytest.fixture(scope="module")
def profiles(tmp_path_factory, fmoe_bin):
    d = tmp_path_factory.mktemp("auto")
    cal = d / "cal.json"
    run(fmoe_bin, "calibrate", "--quick", "--model-config", TINY / "config.json",
        "--file-dir", d, "--quiet", "-o", cal)
    base = json.loads(cal.read_text())
    assert base["host"]["expert_s"]["base"] < 0.01  # a fast host: only the link is slow

    def write(name, link=None, host_expert=None, fast_expert=None):
        p = json.loads(json.dumps(base))
        if link:
            p["link"] = link
        if host_expert:
            p["host"]["expert_s"] = host_expert
        if fast_expert:
            p["compute"]["expert_s"] = fast_expert
        path = d / f"{name}.json"
        path.write_text(json.dumps(p))
        return path

    return {
        "dir": d,
        # a copy takes a second: the host always ends first
        "slow_link": write("slow_link", link={"alpha_s": 1.0, "beta_bytes_per_s": 1e3}),
        # a free link, a host taking a second per expert: never the host
        "slow_host": write("slow_host", link={"alpha_s": 0.0, "beta_bytes_per_s": 1e30},
                           host_expert={"base": 1.0, "per_token": 1.0}),
        # a copy 1 ms, the fast tier's compute free, the host 0.2 ms per token: one token
        # (decode) ends first on the host, 10 tokens or more end first loaded
        "per_token": write("per_token", link={"alpha_s": 1e-3, "beta_bytes_per_s": 1e30},
                           fast_expert={"base": 0.0, "per_token": 0.0},
                           host_expert={"base": 0.0, "per_token": 2e-4}),
    }


def generate(fmoe_bin, *extra, prompt=PROMPT, tokens=24):
    p = run(fmoe_bin, "generate", "--model", TINY, "--prompt", prompt, "--max-new-tokens",
            tokens, "--temperature", 0, "--json", *extra)
    return json.loads(p.stdout)


def read_log(path):
    lines = pathlib.Path(path).read_text().splitlines()
    assert json.loads(lines[0])["fmoe_decision_log"] == 1
    return [json.loads(x) for x in lines[1:]]


def host_and_misses(records):
    """(set of host-computed (iteration, layer, expert), list of missed ones)"""
    host = {(r["iteration"], r["layer"], r["expert"]) for r in records if r["event"] == "host"}
    misses = [(r["iteration"], r["layer"], r["expert"]) for r in records
              if r["event"] == "access" and r["result"] == "miss"]
    return host, misses


@pytest.mark.parametrize("policy,n", [("lru", 6), ("lru", 24), ("mixtral-offload", 16)])
def test_slow_link_sends_every_miss_to_the_host(profiles, fmoe_bin, policy, n):
    base = generate(fmoe_bin)
    log = profiles["dir"] / f"slow-{policy}-{n}.jsonl"
    got = generate(fmoe_bin, "--policy", policy, "--cache-experts", n, "--miss", "auto",
                   "--profile", profiles["slow_link"], "--decision-log", log)
    assert got["generated_ids"] == base["generated_ids"]
    off = got["offload"]
    assert off["misses"] > 0 and off["host_misses"] == off["misses"]
    host, misses = host_and_misses(read_log(log))
    assert len(misses) == off["misses"] and set(misses) == host


@pytest.mark.parametrize("policy,n", [("lru", 6), ("lru", 24), ("mixtral-offload", 16)])
def test_slow_host_sends_no_miss_to_the_host(profiles, fmoe_bin, policy, n):
    base = generate(fmoe_bin)
    log = profiles["dir"] / f"fast-{policy}-{n}.jsonl"
    got = generate(fmoe_bin, "--policy", policy, "--cache-experts", n, "--miss", "auto",
                   "--profile", profiles["slow_host"], "--decision-log", log)
    assert got["generated_ids"] == base["generated_ids"]
    off = got["offload"]
    assert off["misses"] > 0 and off["host_misses"] == 0 and off["bytes_loaded"] > 0
    host, misses = host_and_misses(read_log(log))
    assert misses and not host


def test_the_choice_follows_the_tokens(profiles, fmoe_bin):
    """Prefill (iteration 0, ~50 tokens, top-2 of 8: most experts get many) loads; every
    decode miss (one token) goes to the host. lru with 6 of 48 slots misses every access."""
    base = generate(fmoe_bin, prompt=LONG_PROMPT, tokens=8)
    log = profiles["dir"] / "per-token.jsonl"
    got = generate(fmoe_bin, "--cache-experts", 6, "--miss", "auto", "--profile",
                   profiles["per_token"], "--decision-log", log, prompt=LONG_PROMPT, tokens=8)
    assert got["generated_ids"] == base["generated_ids"]
    host, misses = host_and_misses(read_log(log))
    decode = [m for m in misses if m[0] > 0]
    prefill = [m for m in misses if m[0] == 0]
    assert decode and all(m in host for m in decode)
    assert prefill and any(m not in host for m in prefill)
    assert 0 < got["offload"]["host_misses"] < got["offload"]["misses"]


def test_record_writes_host_outcomes(profiles, fmoe_bin, tmp_path):
    h5py = pytest.importorskip("h5py")
    import hdf5plugin  # noqa: F401
    prompts = tmp_path / "p.txt"
    prompts.write_text(PROMPT + "\nA list holds\n")
    out = tmp_path / "t.h5"
    run(fmoe_bin, "record", "--model", TINY, "--dataset", prompts, "--max-new-tokens", 8,
        "--temperature", 0, "--cache-experts", 12, "--miss", "auto", "--profile",
        profiles["slow_link"], "-o", out, "--quiet")
    with h5py.File(out, "r") as f:
        got = f["/timing/access_outcome"][:].tolist()
    # every access is a hit (1, 2) or a host miss (3): no miss is loaded
    assert got and 3 in got and 0 not in got


def test_miss_auto_usage_errors(profiles, fmoe_bin, tmp_path):
    (tmp_path / "p.txt").write_text("x\n")
    for cmd in (["generate", "--prompt", "x"],
                ["record", "--dataset", tmp_path / "p.txt", "-o", tmp_path / "o.h5"],
                ["serve", "--port", "0", "--quiet"]):
        p = run(fmoe_bin, *cmd, "--model", TINY, "--cache-experts", 6, "--miss", "auto",
                check=False)
        assert p.returncode == 2, p.stderr
        assert p.stderr.count("\n") == 1 and "--miss auto needs --profile" in p.stderr
    p = run(fmoe_bin, "generate", "--model", TINY, "--prompt", "x", "--cache-experts", 6,
            "--profile", profiles["slow_link"], check=False)
    assert p.returncode == 2 and "--profile is read by --miss auto only" in p.stderr
    p = run(fmoe_bin, "generate", "--model", TINY, "--prompt", "x", "--miss", "auto",
            "--profile", profiles["slow_link"], check=False)
    assert p.returncode == 2 and "need an offloaded run" in p.stderr
    p = run(fmoe_bin, "generate", "--model", TINY, "--prompt", "x", "--miss", "sometimes",
            check=False)
    assert p.returncode == 2 and "auto" in p.stderr
    # a profile without host figures: one line, exit 1
    prof = json.loads(profiles["slow_link"].read_text())
    del prof["host"]
    nohost = tmp_path / "nohost.json"
    nohost.write_text(json.dumps(prof))
    p = run(fmoe_bin, "generate", "--model", TINY, "--prompt", "x", "--cache-experts", 6,
            "--miss", "auto", "--profile", nohost, check=False)
    assert p.returncode == 1 and p.stderr.count("\n") == 1
    assert "needs host compute figures" in p.stderr
    # the decision log may not overwrite the profile
    p = run(fmoe_bin, "generate", "--model", TINY, "--prompt", "x", "--cache-experts", 6,
            "--miss", "auto", "--profile", nohost, "--decision-log", nohost, check=False)
    assert p.returncode == 2 and "output is an input" in p.stderr


def test_serve_with_miss_auto(profiles, tmp_path):
    plain = serve_util.Server(tmp_path)
    try:
        want = plain.complete(PROMPT)["choices"][0]["text"]
    finally:
        assert plain.stop()[0] == 0
    for name, all_host in (("slow_link", True), ("slow_host", False)):
        log = tmp_path / f"serve-{name}.jsonl"
        s = serve_util.Server(tmp_path, "--cache-experts", 12, "--miss", "auto", "--profile",
                              profiles[name], "--decision-log", log)
        try:
            assert s.complete(PROMPT)["choices"][0]["text"] == want
        finally:
            rc, err = s.stop()
        assert rc == 0, err
        host, misses = host_and_misses(read_log(log))
        assert misses
        assert (set(misses) == host) if all_host else not host
