"""`fmoe simulate --plot FILE.svg`: an SVG that a standard XML parser reads, one polyline
per policy and panel with one point per cache size, the legend naming the policies, and
the hit-rate line drawn where the JSON of the same run puts it (a higher hit rate higher
up, i.e. at a smaller SVG y)."""
import json
import xml.etree.ElementTree as ET

import numpy as np

SVG = "{http://www.w3.org/2000/svg}"


def synthetic_trace(fmoe, tmp_path):
    rng = np.random.default_rng(5)
    L, J, K = 3, 8, 2
    topics = rng.dirichlet(np.full(J, 0.3), size=(3, L))
    src = tmp_path / "t.jsonl"
    with open(src, "w") as f:
        for r in range(12):
            for tok in range(10):
                for layer in range(L):
                    p = 0.85 * topics[r % 3, layer] + 0.15 * rng.dirichlet(np.ones(J))
                    ex = np.argsort(-p, kind="stable")[:K].tolist()
                    f.write(json.dumps({"request": r, "token": tok,
                                        "phase": "prefill" if tok < 2 else "decode",
                                        "layer": layer, "experts": ex}) + "\n")
    out = tmp_path / "t.h5"
    fmoe("trace", "import", "--layers", L, "--experts", J, "--top-k", K, "--expert-bytes",
         1000000, src, "-o", out, "--quiet")
    return out


def test_plot_is_valid_svg_matching_the_results(fmoe, tmp_path):
    trace = synthetic_trace(fmoe, tmp_path)
    svg = tmp_path / "out.svg"
    caches = [4, 8, 16]
    p = fmoe("simulate", "--trace", trace, "--policy", "lru,lfu", "--cache-experts",
             ",".join(map(str, caches)), "--plot", svg, "--json", "--quiet")
    results = json.loads(p.stdout)["results"]
    assert not (tmp_path / "out.svg.partial").exists()
    root = ET.parse(svg).getroot()
    assert root.tag == SVG + "svg"
    lines = root.findall(f".//{SVG}polyline")
    assert len(lines) == 2 * 2  # two panels x two policies
    legend = " ".join(t.text or "" for t in root.findall(f".//{SVG}g[@class='legend']/{SVG}text"))
    assert "lru" in legend and "lfu" in legend
    for line in lines:
        assert len(line.get("points").split()) == len(caches)
    hit_lines = lines[:2]  # the first panel: hit rate
    for line in hit_lines:
        policy = line.get("data-label")
        pts = [tuple(map(float, q.split(","))) for q in line.get("points").split()]
        xs = [x for x, _ in pts]
        assert xs == sorted(xs)  # by cache size
        rates = [next(r["hit_rate"] for r in results
                      if r["policy"] == policy and r["cache_experts"] == c) for c in caches]
        ys = [y for _, y in pts]
        for i in range(len(caches)):
            for j in range(len(caches)):
                if rates[i] > rates[j] + 1e-12:
                    assert ys[i] < ys[j], (policy, rates, ys)


def test_plot_to_an_unwritable_place_is_one_line(fmoe, tmp_path):
    trace = synthetic_trace(fmoe, tmp_path)
    p = fmoe("simulate", "--trace", trace, "--policy", "lru", "--cache-experts", 4,
             "--plot", tmp_path / "no" / "such" / "dir.svg", "--quiet", check=False)
    assert p.returncode == 1
    assert len(p.stderr.strip().splitlines()) == 1 and "dir.svg" in p.stderr
