"""`--policy-opt KEY=VALUE`: each policy's own settings from the command line (simulate and
the live commands), `simulate --list-policies`, and the shorthands --eamc-capacity,
--store-mode and --store-capacity, which must give exactly what the same settings given
with --policy-opt give. The trace is a synthetic JSONL routing log imported with
`fmoe trace import` (three topics, so that a history of requests predicts the next)."""
import json
import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
TINY = REPO / "datasets" / "fmoe-tiny"


@pytest.fixture(scope="module")
def trace(fmoe, tmp_path_factory):
    import numpy as np

    layers, experts, top_k = 6, 8, 2
    rng = np.random.default_rng(3)
    topics = rng.dirichlet(np.full(experts, 0.2), size=(3, layers))
    d = tmp_path_factory.mktemp("policy_opt")
    src = d / "syn.jsonl"
    with open(src, "w") as f:
        for r in range(24):
            for tok in range(8):
                for l in range(layers):
                    p = 0.9 * topics[r % 3, l] + 0.1 / experts
                    ex = np.argsort(-p, kind="stable")[:top_k]
                    f.write(json.dumps({"request": r, "token": tok,
                                        "phase": "prefill" if tok < 3 else "decode",
                                        "layer": l, "experts": ex.tolist(),
                                        "probs": p.round(6).tolist()}) + "\n")
    out = d / "syn.h5"
    fmoe("trace", "import", "--layers", layers, "--experts", experts, "--top-k", top_k,
         "--expert-bytes", 1000000, src, "-o", out, "--quiet")
    return out


def results(p):
    """Every decision-dependent figure of each result, keyed by policy."""
    assert p.returncode == 0, p.stderr
    return {r["policy"]: (r["hits"], r["prefetches"], r["accesses"], r["bytes_loaded"])
            for r in json.loads(p.stdout)["results"]}


def usage_error(p, *needles):
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert p.stderr.count("\n") == 1, p.stderr
    for n in needles:
        assert n in p.stderr, p.stderr


def test_list_policies_shows_each_policy_with_its_settings(fmoe):
    help_text = fmoe("simulate", "--help").stdout
    listed = re.findall(r"^  ([a-z][a-z0-9-]*)  ", help_text.split("\npolicies:\n")[1], re.M)
    out = fmoe("simulate", "--list-policies").stdout
    names = re.findall(r"^([a-z][a-z0-9-]*): ", out, re.M)
    assert names == listed and len(names) > 10
    blocks = dict(zip(names, re.split(r"^[a-z][a-z0-9-]*: .*$", out, flags=re.M)[1:]))
    assert "eamc_capacity: int, default 1000, in [1, 10000000]" in blocks["moe-infinity"]
    assert "§4.3" in blocks["moe-infinity"]  # the help cites the paper
    for fam in ("fmoe", "fmoe-paper", "fmoe-lru"):
        assert "store_mode: offline|online|offline-update, default offline" in blocks[fam]
        assert "store_capacity: int, default 0" in blocks[fam]
    assert "(no settings)" in blocks["lru"]


def test_shorthands_equal_policy_opt(fmoe, trace):
    common = ["simulate", "--trace", trace, "--policy", "fmoe,moe-infinity,lru",
              "--cache-experts", 12, "--prefetch-distance", 2, "--json", "--quiet"]
    short = results(fmoe(*common, "--store-mode", "online", "--store-capacity", 50,
                         "--eamc-capacity", 2, check=False))
    long = results(fmoe(*common, "--policy-opt", "store_mode=online", "--policy-opt",
                        "store_capacity=50", "--policy-opt", "eamc_capacity=2", check=False))
    assert short == long
    # the same value both ways is no conflict
    both = results(fmoe(*common, "--store-mode", "online", "--policy-opt",
                        "store_mode=online", "--store-capacity", 50, "--eamc-capacity", 2,
                        check=False))
    assert both == short
    # the settings reach the policy that declares them, and only it: a smaller history
    # changes moe-infinity's and fmoe's decisions, and never lru's
    small = results(fmoe(*common, "--policy-opt", "store_mode=online", "--policy-opt",
                         "store_capacity=1", "--policy-opt", "eamc_capacity=1", check=False))
    assert small["lru"] == short["lru"]
    assert small["moe-infinity"] != short["moe-infinity"]
    assert small["fmoe"] != short["fmoe"]


def test_simulate_policy_opt_usage_errors(fmoe, trace):
    base = ["simulate", "--trace", trace, "--cache-experts", 12, "--quiet"]
    usage_error(fmoe(*base, "--policy", "lru,moe-infinity", "--policy-opt", "colour=red",
                     check=False),
                "--policy-opt colour=red", "no policy of the run has a setting 'colour'",
                "moe-infinity eamc_capacity")
    # a key of a policy that is not in the run
    usage_error(fmoe(*base, "--policy", "lru", "--policy-opt", "eamc_capacity=5", check=False),
                "'eamc_capacity'", "they have none")
    usage_error(fmoe(*base, "--policy", "moe-infinity", "--policy-opt", "eamc_capacity=0",
                     check=False),
                "policy moe-infinity", "eamc_capacity=0", "[1, 10000000]")
    usage_error(fmoe(*base, "--policy", "fmoe", "--policy-opt", "store_mode=sometimes",
                     check=False),
                "store_mode=sometimes", "offline, online or offline-update")
    usage_error(fmoe(*base, "--policy", "moe-infinity", "--policy-opt", "eamc_capacity",
                     check=False),
                "not KEY=VALUE")
    usage_error(fmoe(*base, "--policy", "moe-infinity", "--eamc-capacity", 3, "--policy-opt",
                     "eamc_capacity=4", check=False),
                "--eamc-capacity 3 and --policy-opt eamc_capacity=4 disagree")
    # store_mode given either way takes part in the store checks alike
    for how in (["--store-mode", "offline"], ["--policy-opt", "store_mode=offline"]):
        usage_error(fmoe(*base, "--policy", "fmoe", *how, check=False),
                    "--store-mode offline needs --store")


def test_live_policy_opt_usage_errors(fmoe):
    live = ["generate", "--model", TINY, "--prompt", "x", "--max-new-tokens", 1]
    usage_error(fmoe(*live, "--policy-opt", "eamc_capacity=3", check=False),
                "need an offloaded run")
    usage_error(fmoe(*live, "--cache-experts", 6, "--policy", "lru", "--policy-opt",
                     "eamc_capacity=3", check=False),
                "no policy of the run has a setting 'eamc_capacity'")
    usage_error(fmoe(*live, "--cache-experts", 6, "--policy", "moe-infinity", "--policy-opt",
                     "eamc_capacity=abc", check=False),
                "eamc_capacity=abc", "[1, 10000000]")
    # the shorthand and the setting are refused alike
    for how in (["--store-mode", "online"], ["--policy-opt", "store_mode=online"]):
        usage_error(fmoe(*live, "--cache-experts", 6, "--policy", "fmoe", *how, check=False),
                    "--store-mode online is a simulate mode")
    # a valid setting runs
    p = fmoe(*live, "--cache-experts", 6, "--policy", "moe-infinity", "--policy-opt",
             "eamc_capacity=3", check=False)
    assert p.returncode == 0, p.stderr
