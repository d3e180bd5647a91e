"""`fmoe generate` and `fmoe record` on the bundled model fmoe-tiny (datasets/fmoe-tiny).

- generate: the same seed gives the same tokens; greedy decoding equals transformers'
  greedy continuation of the same prompt ids on the same checkpoint (and fmoe's prompt ids
  equal HF `tokenizers`' on its tokenizer.json); streamed text, --json, --dump-logits and
  --chat agree with each other.
- record: 100 prompts (datasets/samples/prompts_100.txt, and 100 ShareGPT prompts when
  FMOE_REAL_DATA is set) give a trace that h5py reads with the shapes of
  docs/formats/trace.md (timings included), that `fmoe inspect`, `fmoe build-store` and `fmoe simulate`
  consume, whose experts, gate probabilities, semantic embeddings and gate inputs equal
  transformers' on the recorded token sequences, and whose arrival times come from an
  Azure CSV. A recorder killed with SIGKILL leaves a readable TRACE.h5.partial.
- bad input: a prompt longer than the context, a missing model directory, an unsupported
  family: one line on stderr, exit status 1.

Sizes are small (a few new tokens per request), so the file runs in well under a minute
on two cores (8 s plain, 17 s under ASan). The transformers references are fixtures
(tests/fixtures/transformers/, tests/python/hf_reference.py): the quick tier reads them
without torch; the full tier recomputes them with torch + transformers
(tests/python/requirements-torch.txt) and checks that the fixtures still agree.
"""
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
# FMOE_TEST_TINY: run the same checks on another checkpoint of the fmoe-tiny layout.
TINY = pathlib.Path(os.environ.get("FMOE_TEST_TINY", REPO / "datasets" / "fmoe-tiny"))
PROMPTS = REPO / "datasets" / "samples" / "prompts_100.txt"

h5py = pytest.importorskip("h5py")
import hdf5plugin  # noqa: F401,E402  (registers the zstd filter with h5py)


sys.path.insert(0, os.path.dirname(__file__))
import hf_reference  # noqa: E402

_hf = {}


def hf_model():
    """transformers' fmoe-tiny in float32, loaded on first use: only the full tier, which
    recomputes the fixtures, ever calls this."""
    if not _hf:
        import torch
        import transformers
        torch.set_num_threads(2)
        _hf["m"] = transformers.AutoModelForCausalLM.from_pretrained(
            str(TINY), dtype=torch.float32).eval()
        _hf["torch"] = torch
    return _hf["torch"], _hf["m"]


def tiny_reference(kind, ids, compute, atol):
    """A transformers reference for fmoe-tiny (the bundled checkpoint only: another
    FMOE_TEST_TINY has no fixtures, so it is always recomputed)."""
    if "FMOE_TEST_TINY" in os.environ:
        return {k: np.asarray(v) for k, v in compute().items()}
    return hf_reference.stored_or_fresh(f"fmoe-tiny-{kind}-{hf_reference.key(ids)}", compute, atol)


def generate_json(fmoe, *args):
    p = fmoe("generate", "--model", TINY, "--json", "--threads", "1", *args)
    return json.loads(p.stdout)


def one_line_error(p, *needles):
    assert p.returncode == 1, (p.returncode, p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


# ---------------------------------------------------------------------------------------
# generate
# ---------------------------------------------------------------------------------------

def test_bundled_model_is_small_and_complete():
    names = {p.name for p in TINY.iterdir()}
    for need in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "generation_config.json", "README.md"):
        assert need in names, need
    assert sum(p.stat().st_size for p in TINY.iterdir()) <= 20 * 1000 * 1000
    cfg = json.loads((TINY / "config.json").read_text())
    assert cfg["model_type"] == "qwen3_moe"
    assert "<|im_start|>" in json.loads((TINY / "tokenizer_config.json").read_text())["chat_template"]


def test_generate_default_model_is_fmoe_tiny(fmoe):
    p = fmoe("generate", "--prompt", "The list type", "--max-new-tokens", "4", "--json",
             "--threads", "1")
    assert "qwen3_moe" in json.loads(p.stdout)["describe"]


def test_generate_seeded_sampling_is_deterministic(fmoe):
    args = ("--prompt", "A generator is a function that", "--max-new-tokens", "24",
            "--temperature", "0.9", "--top-p", "0.95", "--ignore-eos")
    a = generate_json(fmoe, *args, "--seed", "7")
    b = generate_json(fmoe, *args, "--seed", "7")
    c = generate_json(fmoe, *args, "--seed", "8")
    assert a["generated_ids"] == b["generated_ids"] and a["text"] == b["text"]
    assert len(a["generated_ids"]) == 24
    assert a["generated_ids"] != c["generated_ids"]
    g1 = generate_json(fmoe, "--prompt", "The os module", "--max-new-tokens", "16")
    g2 = generate_json(fmoe, "--prompt", "The os module", "--max-new-tokens", "16", "--seed", "99")
    assert g1["generated_ids"] == g2["generated_ids"]  # greedy ignores the seed


def test_generate_prompt_ids_match_hf_tokenizers(fmoe):
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer.from_file(str(TINY / "tokenizer.json"))
    for text in ["How do I read a file line by line in Python?",
                 "  spaces,\ttabs\nand ünïcödé — 3.14159 emoji 🐍",
                 "def f(x):\n    return x ** 2  # square"]:
        out = generate_json(fmoe, "--prompt", text, "--max-new-tokens", "1")
        assert out["prompt_ids"] == tok.encode(text).ids, text


@pytest.mark.parametrize("prompt", ["The dictionary type maps keys to values, and",
                                    "Explain what a list comprehension is."])
def test_generate_greedy_equals_transformers(fmoe, prompt):
    out = generate_json(fmoe, "--prompt", prompt, "--max-new-tokens", "24", "--ignore-eos")
    ids = out["prompt_ids"]
    ours = out["generated_ids"]
    assert len(ours) == 24

    def compute():
        # transformers' greedy continuation, with the margin between its two best logits at
        # each step, so that a divergence can be told apart from a near-tie (bf16 weights,
        # f32 arithmetic in both).
        torch, m = hf_model()
        with torch.no_grad():
            ref = m.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False,
                             eos_token_id=None, pad_token_id=0, output_logits=True,
                             return_dict_in_generate=True)
        top2 = [torch.topk(lg[0].float(), 2).values for lg in ref.logits]
        return {"generated": np.asarray(ref.sequences[0, len(ids):].tolist(), dtype=np.int64),
                "margin": np.asarray([float(t[0] - t[1]) for t in top2], dtype=np.float32)}

    ref = tiny_reference("greedy", ids, compute, atol=1e-4)
    theirs = ref["generated"].tolist()
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if a != b:
            margin = float(ref["margin"][i])
            assert margin < 2e-3, f"token {i}: fmoe {a}, transformers {b} (margin {margin})"
            break  # a near-tie: the sequences may differ from here on
    else:
        assert ours == theirs


def test_generate_stream_json_and_logits_agree(fmoe, tmp_path):
    npy = tmp_path / "logits.npy"
    prompt = "What is a context manager?"
    j = generate_json(fmoe, "--prompt", prompt, "--max-new-tokens", "12", "--dump-logits", npy)
    p = fmoe("generate", "--model", TINY, "--prompt", prompt, "--max-new-tokens", "12",
             "--threads", "1")
    assert p.stdout == j["text"] + "\n"
    assert "tokens/s" in p.stderr and "prefill" in p.stderr and "decode" in p.stderr
    logits = np.load(npy)
    assert logits.dtype == np.float32
    assert logits.shape == (len(j["generated_ids"]), 4096)
    assert logits.argmax(-1).tolist() == j["generated_ids"]
    assert j["prefill_tok_s"] > 0


def test_generate_chat_template(fmoe):
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer.from_file(str(TINY / "tokenizer.json"))
    j = generate_json(fmoe, "--prompt", "What is a decorator?", "--chat", "--system", "Be brief.",
                      "--max-new-tokens", "8")
    want = ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is a decorator?"
            "<|im_end|>\n<|im_start|>assistant\n")
    assert j["prompt"] == want
    assert j["prompt_ids"] == tok.encode(want).ids
    assert j["prompt_ids"][0] == tok.token_to_id("<|im_start|>")


# ---------------------------------------------------------------------------------------
# record
# ---------------------------------------------------------------------------------------

def _azure_csv(path, n):
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for i in range(n):
        lines.append(f"2023-11-16 18:15:{10 + i // 4:02d}.{(i % 4) * 25:02d}00000,100,10")
    path.write_text("\n".join(lines) + "\n")
    return [(i // 4) + (i % 4) * 0.25 for i in range(n)]


@pytest.fixture(scope="module")
def trace100(fmoe_bin, tmp_path_factory):
    d = tmp_path_factory.mktemp("rec")
    out = d / "prompts100.h5"
    arrivals = _azure_csv(d / "azure.csv", 100)
    t = time.time()
    p = subprocess.run([str(fmoe_bin), "record", "--model", str(TINY), "--dataset", str(PROMPTS),
                        "--max-new-tokens", "4", "--speculative", "2", "--hidden",
                        "--arrivals", str(d / "azure.csv"), "--threads", "1", "-o", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    assert "100 requests" in p.stderr and "tokens/s" in p.stderr
    return out, arrivals, time.time() - t


def check_trace_shapes(f, S=0, hidden=False):
    L, J, K, h = (int(f.attrs[k]) for k in ("num_layers", "num_experts", "top_k", "hidden_size"))
    assert f.attrs["format"] == "fmoe-trace" and int(f.attrs["version"]) == 1
    # record's --backend auto: the CPU here, "cuda:<device>" on a machine with a CUDA device
    on = f.attrs["recorded_on"]
    assert on == "cpu" or on.startswith("cuda:"), on
    R = f["requests/id"].shape[0]
    off = f["requests/token_offset"][:]
    T = f["tokens/token_id"].shape[0]
    assert off.shape == (R + 1,) and off[0] == 0 and off[-1] == T
    pt, ot = f["requests/prompt_tokens"][:], f["requests/output_tokens"][:]
    assert (off[1:] - off[:-1] == pt + ot).all()
    assert f["tokens/experts"].shape == (T, L, K)
    assert f["tokens/probs"].shape == (T, L, J) and f["tokens/probs"].dtype == np.float16
    assert f["tokens/semantic"].shape == (T, h)
    if S:
        assert f["tokens/speculative"].shape == (T, L, S, J)
    if hidden:
        assert f["tokens/hidden"].shape == (T, L, h) and f["tokens/hidden"].dtype == np.float16
    chunk = int(f.attrs["prefill_chunk"])  # each chunk of a prompt is its own iteration
    assert chunk == 64
    iters = int((-(-pt // chunk) + ot).sum())
    assert f["timing/layer_s"].shape == (iters, int(f.attrs["timing_layers"]))
    assert f["timing/iteration_s"].shape == (iters,)
    lay, it = f["timing/layer_s"][:], f["timing/iteration_s"][:]
    assert (lay >= 0).all() and (it > 0).all()
    assert (lay.sum(1) <= it * 1.01 + 1e-4).all()  # the layers are part of the pass
    probs = f["tokens/probs"][:].astype(np.float32)
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-2)
    ph = f["tokens/phase"][:]
    for r in range(R):
        seg = ph[off[r]:off[r + 1]]
        assert (seg[:pt[r]] == 0).all() and (seg[pt[r]:] == 1).all()
    return R, T


def test_record_prompts100_reads_in_h5py(trace100):
    path, arrivals, _ = trace100
    cfg = json.loads((TINY / "config.json").read_text())
    with h5py.File(path) as f:
        R, T = check_trace_shapes(f, S=2, hidden=True)
        assert R == 100
        assert f.attrs["model_name"] == TINY.name
        assert len(f.attrs["model_fingerprint"]) == 64
        assert json.loads(f["model/config_json"][()].decode()) == cfg
        assert f["requests/id"][:].tolist() == list(range(100))
        np.testing.assert_allclose(f["requests/arrival_s"][:], arrivals, atol=1e-6)
        assert (f["requests/output_tokens"][:] <= 4).all()
        ex = f["tokens/experts"][:]
        assert ex.max() < cfg.get("num_experts", cfg.get("num_local_experts"))
        # the chosen experts are the top-K of the recorded distribution
        probs = f["tokens/probs"][:].astype(np.float32)
        top = np.take_along_axis(probs, ex.astype(np.int64), -1)
        assert (top.min(-1) >= np.sort(probs, -1)[..., -3] - 2e-3).all()


def _router_reference(ids):
    """transformers on one recorded token sequence: the gate probabilities of every MoE
    layer, the embedding layer's output and each MoE block's input."""
    torch, m = hf_model()
    with torch.no_grad():
        out = m(input_ids=torch.tensor(ids[None]), output_router_logits=True)
        probs = np.stack([torch.softmax(x.float(), -1).numpy() for x in out.router_logits], 1)
        emb = m.model.embed_tokens(torch.tensor(ids)).float().numpy()
    seen = {}
    hooks = [layer.mlp.register_forward_hook(
        lambda mod, args, res, l=l: seen.__setitem__(l, args[0][0].float().numpy()))
        for l, layer in enumerate(m.model.layers)]
    try:
        with torch.no_grad():
            m(input_ids=torch.tensor(ids[None]))
    finally:
        for hk in hooks:
            hk.remove()
    hidden = np.stack([seen[l] for l in range(len(m.model.layers))], 1)
    return {"probs": probs.astype(np.float32), "embed": emb.astype(np.float32),
            "hidden": hidden.astype(np.float32)}


def test_record_matches_transformers_router(trace100):
    path = trace100[0]
    with h5py.File(path) as f:
        off = f["requests/token_offset"][:]
        K = int(f.attrs["top_k"])
        for r in (0, 57):
            ids = f["tokens/token_id"][off[r]:off[r + 1]].astype(np.int64)
            ours = f["tokens/experts"][off[r]:off[r + 1]].astype(np.int64)
            probs = f["tokens/probs"][off[r]:off[r + 1]].astype(np.float32)
            sem = f["tokens/semantic"][off[r]:off[r + 1]]
            hid = f["tokens/hidden"][off[r]:off[r + 1]].astype(np.float32)
            ref = tiny_reference("router", ids, lambda: _router_reference(ids), atol=1e-5)
            ref_p = ref["probs"]
            np.testing.assert_allclose(probs, ref_p, atol=3e-3)
            ref_top = np.argsort(-ref_p, -1, kind="stable")[..., :K]
            srt = np.sort(ref_p, -1)[..., ::-1]
            decisive = (srt[..., K - 1] - srt[..., K]) > 1e-3
            assert decisive.mean() > 0.9
            assert (ours[decisive] == ref_top[decisive]).all(), f"request {r}"
            # semantic embedding = the embedding layer's output
            np.testing.assert_allclose(sem, ref["embed"], atol=1e-6)
            # hidden = the router's input: what each MoE block receives
            np.testing.assert_allclose(hid, ref["hidden"], atol=0.02, rtol=0.01)


def test_record_trace_feeds_inspect_build_store_and_simulate(fmoe, trace100, tmp_path):
    path = trace100[0]
    p = fmoe("inspect", path, "--json")
    j = json.loads(p.stdout)
    assert "fmoe-tiny" in json.dumps(j)
    p = fmoe("inspect", path)
    assert "coarse" in p.stdout and "100" in p.stdout
    p = fmoe("simulate", "--trace", path, "--policy", "lru,belady", "--cache-experts", "8")
    assert "lru" in p.stdout and "belady" in p.stdout
    store = tmp_path / "store.h5"
    fmoe("build-store", "--trace", path, "-o", store, "--capacity", "256")
    p = fmoe("simulate", "--trace", path, "--store", store, "--policy", "fmoe",
             "--cache-experts", "8")
    assert "fmoe" in p.stdout


def test_record_sharegpt_100(fmoe, real_data, tmp_path):
    src = real_data / "sharegpt-ml-energy" / "ShareGPT_V3_filtered_500.json"
    out = tmp_path / "sharegpt.h5"
    p = fmoe("record", "--model", TINY, "--dataset", src, "--dataset-format", "sharegpt",
             "--max-requests", "100", "--max-new-tokens", "2", "--threads", "1", "-o", out)
    with h5py.File(out) as f:
        R, _ = check_trace_shapes(f)
        assert R == 100
        assert f.attrs["dataset"] == src.name
    fmoe("inspect", out)
    fmoe("simulate", "--trace", out, "--policy", "lru,belady", "--cache-experts", "8")


def test_record_killed_leaves_a_recoverable_trace(fmoe_bin, fmoe, tmp_path):
    out = tmp_path / "killed.h5"
    partial = tmp_path / "killed.h5.partial"
    # 200 tokens per request: long enough that the kill lands mid-run.
    proc = subprocess.Popen([str(fmoe_bin), "record", "--model", str(TINY), "--dataset",
                             str(PROMPTS), "--max-new-tokens", "200", "--ignore-eos",
                             "--threads", "1", "-q", "-o", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def recorded():
        try:  # the writer holds the file: read without HDF5's file lock
            with h5py.File(partial, "r", locking=False) as f:
                return f["requests/id"].shape[0]
        except (OSError, KeyError):
            return 0

    deadline = time.time() + 120
    try:
        while time.time() < deadline:
            time.sleep(0.2)
            assert proc.poll() is None, "the recorder finished before it could be killed"
            if partial.exists() and recorded() >= 3:
                break
        else:
            pytest.fail("no 3 requests recorded within 120 s")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert not out.exists() and partial.exists()
    # What a SIGKILL promises is `fmoe trace recover` (docs/reliability.md): the .partial's
    # last chunk may be half written when the kill lands inside a write, so the trace is
    # read from what recover makes of the journal and the .partial, not from the .partial.
    p = fmoe("trace", "recover", partial)
    assert out.exists() and not partial.exists()
    with h5py.File(out) as f:
        R, T = check_trace_shapes(f)
        assert 3 <= R < 100
    p = fmoe("inspect", out)
    assert "requests" in p.stdout


# ---------------------------------------------------------------------------------------
# bad input
# ---------------------------------------------------------------------------------------

def test_prompt_longer_than_context(fmoe):
    long = "word " * 1500  # about 1500 tokens; the context is 1024
    p = fmoe("generate", "--model", TINY, "--prompt", long, check=False)
    one_line_error(p, "exceeds the context of 1024")


def test_missing_model_dir(fmoe, tmp_path):
    p = fmoe("generate", "--model", tmp_path / "nope", "--prompt", "hi", check=False)
    one_line_error(p, "nope")
    p = fmoe("record", "--model", tmp_path / "nope", "--dataset", PROMPTS, "-o",
             tmp_path / "t.h5", check=False)
    one_line_error(p, "nope")
    assert not (tmp_path / "t.h5").exists() and not (tmp_path / "t.h5.partial").exists()


def test_unsupported_family(fmoe, tmp_path):
    d = tmp_path / "llama"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100,
        "intermediate_size": 128}))
    p = fmoe("generate", "--model", d, "--prompt", "hi", check=False)
    one_line_error(p, "llama")


def test_bad_dataset_and_usage(fmoe, tmp_path):
    p = fmoe("record", "--model", TINY, "--dataset", tmp_path / "missing.txt", "-o",
             tmp_path / "x.h5", check=False)
    one_line_error(p, "missing.txt")
    p = fmoe("record", "--dataset", PROMPTS, check=False)
    assert p.returncode == 2 and "-o" in p.stderr
    p = fmoe("generate", "--model", TINY, check=False)
    assert p.returncode == 2 and "--prompt" in p.stderr
    p = fmoe("record", "--model", TINY, "--dataset", PROMPTS, "--speculative", "9", "-o",
             tmp_path / "x.h5", check=False)
    assert p.returncode == 2 and "speculative" in p.stderr


def _record_context(fmoe_bin, out, *extra, requests=6):
    p = subprocess.run([str(fmoe_bin), "record", "--model", str(TINY), "--dataset", str(PROMPTS),
                        "--max-requests", str(requests), "--max-new-tokens", "5", "--threads",
                        "1", "-o", str(out), *map(str, extra)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    import re
    m = re.search(r"context (\d+) positions", p.stderr)
    assert m, p.stderr
    return int(m.group(1)), p.stderr


def test_record_sizes_the_context_to_the_longest_request(fmoe_bin, tmp_path):
    """The KV cache holds the longest recorded request (prompt + --max-new-tokens), not the
    model's maximum (fmoe-tiny's config says 4096): the trace's own prompt lengths say
    what that is."""
    ctx, _ = _record_context(fmoe_bin, tmp_path / "auto.h5")
    with h5py.File(tmp_path / "auto.h5") as f:
        prompt = f["requests/prompt_tokens"][:]
        assert len(prompt) == 6
        assert (f["requests/output_tokens"][:] == 5).all()  # nothing cut short
    assert ctx == int(prompt.max()) + 5
    assert ctx < 4096


def test_record_max_context_skips_what_does_not_fit(fmoe_bin, tmp_path):
    """With --max-context N, the prompts walked in order: one with no room for a generated
    token is skipped and counted, the next one taken; generation stops at N. The expected
    walk comes from the prompt lengths of a run that skipped nothing."""
    _record_context(fmoe_bin, tmp_path / "all.h5", requests=30)
    with h5py.File(tmp_path / "all.h5") as f:
        lengths = f["requests/prompt_tokens"][:].tolist()
    cut = sorted(lengths[:6])[2] + 1  # about half of the first prompts fit
    want, skipped = [], 0
    for n in lengths:
        if len(want) == 6:
            break
        if n + 1 > cut:
            skipped += 1
        else:
            want.append(n)
    assert len(want) == 6 and skipped > 0
    ctx, err = _record_context(fmoe_bin, tmp_path / "cut.h5", "--max-context", cut)
    assert ctx == cut
    with h5py.File(tmp_path / "cut.h5") as f:
        kept = f["requests/prompt_tokens"][:].tolist()
        out = f["requests/output_tokens"][:].tolist()
    assert kept == want
    assert out == [min(5, cut - n) for n in kept]  # generation stops when the cache is full
    assert f"skipped {skipped} prompt" in err
    p = subprocess.run([str(fmoe_bin), "record", "--model", str(TINY), "--dataset", str(PROMPTS),
                        "--max-context", "5000", "-o", str(tmp_path / "no.h5")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "--max-context 5000" in p.stderr and len(p.stderr.splitlines()) == 1
    assert not (tmp_path / "no.h5").exists()
