"""`fmoe quantize` for Phi-3.5-MoE (GGUF phimoe) and Llama 4's text model (llama4)
(runtime/model/quantize.c).

- The tiny checkpoints written as F32 GGUF run as the safetensors directory: phimoe to
  exactly its logits, routes and greedy tokens; llama4 to the same routes and tokens with
  logits within 1e-4, because the file carries the llama3 rope scaling as the rope_freqs
  tensor of f32 divisors (as llama.cpp's converter writes it, and fmoe's loader uses it),
  where the directory computes the frequencies in double (test_gguf_llama4.py's bound).
- Names, extents and values are the converter's (conversion/phi.py PhiMoeModel,
  conversion/llama.py Llama4Model), laid out here with gguf-py's own tensor name map and
  NumPy: experts stacked (phimoe) or transposed and split from the fused input-major
  gate_up_proj (llama4), LayerNorm and lm_head biases, longrope's factor lists as
  rope_factors_long/short, llama3 scaling as rope_freqs (test_gguf_llama4.rope_factors).
- Every key test_gguf_phimoe.py's and test_gguf_llama4.py's writers (the converters'
  set_gguf_parameters written again with gguf-py) put in a file is in ours with the same
  value; llama.cpp's keys alone (fmoe.hf_config renamed away) rebuild the geometry.
- rope_freqs is bit for bit the converter's float32 torch arithmetic (replayed in NumPy
  float32, which gives torch's bits on Llama 3.1's parameters), on the 64 frequencies of a
  128-wide head with Llama 3.1's scaling (six in the smooth band).
- A multimodal Llama 4 checkpoint (config under text_config, tensors under
  language_model., a vision tower beside) gives the same file's tensors as its text model.
"""
import json
import math
import shutil

import numpy as np
import pytest

import make_tiny_models as tiny
from conftest import run_fmoe
from forward_driver import drive
from test_gguf_llama4 import rope_factors, write_llama4
from test_gguf_phimoe import write_phimoe
from test_quantize import read_checkpoint

import gguf  # noqa: E402  (tests/python/requirements.txt)

MODELS = {"phimoe": "phimoe", "phimoe_longrope_long": "phimoe", "llama4": "llama4"}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return tiny.maker(tmp_path_factory.mktemp("tiny-quantize-phimoe-llama4"))


@pytest.fixture(scope="module")
def converted(models, fmoe_bin, tmp_path_factory):
    out = tmp_path_factory.mktemp("converted")
    made = {}

    def get(name):
        if name not in made:
            made[name] = out / f"{name}.gguf"
            run_fmoe(fmoe_bin, "quantize", "--type", "f32", models(name), "-o", made[name],
                     "--quiet")
        return made[name]
    return get


@pytest.mark.parametrize("name", sorted(MODELS))
def test_gguf_runs_as_the_checkpoint(name, models, converted, driver, tmp_path):
    d = models(name)
    ref = dict(np.load(d / "reference.npz"))
    l1, r1 = drive(driver, d, ref, tmp_path, "dir")
    l2, r2 = drive(driver, converted(name), ref, tmp_path, "gguf")
    if MODELS[name] == "phimoe":
        assert np.array_equal(l1, l2), f"{name}: max |diff| {np.abs(l1 - l2).max()}"
    else:  # rope_freqs: f32 divisors in the file, the llama3 scaling in double in the folder
        assert np.abs(l1 - l2).max() < 1e-4, f"{name}: max |diff| {np.abs(l1 - l2).max()}"
    assert r1 == r2
    assert r2["generated"] == ref["generated"].tolist()


def expected_layout(cfg, ck, arch):
    """{GGUF name: values} as the converter writes the checkpoint (numpy shape = reversed
    ggml extents), names from gguf-py's tensor map."""
    L = cfg["num_hidden_layers"]
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.PHIMOE if arch == "phimoe"
                                     else gguf.MODEL_ARCH.LLAMA4, L)
    out = {}
    for hf, x in ck.items():
        if ".experts." in hf:
            continue
        gg = names.get_name(hf, try_suffixes=(".weight", ".bias"))
        assert gg, hf
        out[gg] = x
    T = gguf.MODEL_TENSOR
    rp = cfg.get("rope_parameters") or {}
    if arch == "phimoe":  # PhiMoeModel: w1, w2, w3 of each expert stacked
        J = cfg["num_local_experts"]
        for i in range(L):
            for w in ("w1", "w2", "w3"):
                merged = f"model.layers.{i}.block_sparse_moe.experts.{w}.weight"
                out[names.get_name(merged, try_suffixes=(".weight",))] = np.stack(
                    [ck[f"model.layers.{i}.block_sparse_moe.experts.{e}.{w}.weight"]
                     for e in range(J)])
        if rp.get("long_factor"):
            out[gguf.TENSOR_NAMES[T.ROPE_FACTORS_LONG] + ".weight"] = np.float32(rp["long_factor"])
            out[gguf.TENSOR_NAMES[T.ROPE_FACTORS_SHORT] + ".weight"] = np.float32(rp["short_factor"])
    else:  # Llama4Model: gate_up_proj [J, h, 2I] transposed, split at I; down transposed
        for i in cfg["moe_layers"]:
            p = f"model.layers.{i}.feed_forward.experts."
            gu = np.swapaxes(ck[p + "gate_up_proj"], 1, 2)
            I = gu.shape[1] // 2
            out[gguf.TENSOR_NAMES[T.FFN_GATE_EXP].format(bid=i) + ".weight"] = gu[:, :I]
            out[gguf.TENSOR_NAMES[T.FFN_UP_EXP].format(bid=i) + ".weight"] = gu[:, I:]
            out[gguf.TENSOR_NAMES[T.FFN_DOWN_EXP].format(bid=i) + ".weight"] = np.swapaxes(
                ck[p + "down_proj"], 1, 2)
        out[gguf.TENSOR_NAMES[T.ROPE_FREQS] + ".weight"] = rope_factors(cfg)
    return out


def f32_tensors(path):
    r = gguf.GGUFReader(str(path))
    out = {}
    for t in r.tensors:
        assert t.tensor_type == gguf.GGMLQuantizationType.F32, t.name
        out[t.name] = np.asarray(t.data).reshape(tuple(reversed(t.shape.tolist())))
    return out


@pytest.mark.parametrize("name", sorted(MODELS))
def test_names_and_values_are_the_converters(name, models, converted):
    d = models(name)
    cfg = json.loads((d / "config.json").read_text())
    ck = {k: v[0] for k, v in read_checkpoint(d).items()}
    want = expected_layout(cfg, ck, MODELS[name])
    got = f32_tensors(converted(name))
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        assert got[k].shape == v.shape, (k, got[k].shape, v.shape)
        if k == "rope_freqs.weight":  # the test's divisors are computed in double
            assert np.allclose(got[k], v, rtol=1e-6, atol=0), (got[k], v)
        else:
            assert np.array_equal(got[k], v), k


def fields(path):
    r = gguf.GGUFReader(str(path))
    return {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_keys_are_the_converters(name, models, converted, tmp_path):
    d = models(name)
    theirs = tmp_path / "theirs.gguf"
    (write_phimoe if MODELS[name] == "phimoe" else write_llama4)(d, theirs)
    want, got = fields(theirs), fields(converted(name))
    for k, v in want.items():
        assert k in got, k
        if isinstance(v, float):
            assert got[k] == pytest.approx(v, rel=1e-6), (k, got[k], v)
        else:
            assert got[k] == v, (k, got[k], v)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_keys_alone_rebuild_the_geometry(name, models, converted, fmoe_bin, tmp_path):
    d = models(name)
    f = converted(name)
    r = gguf.GGUFReader(str(f))
    kv = r.fields["fmoe.hf_config"]
    assert bytes(kv.parts[kv.data[0]]) == (d / "config.json").read_bytes()
    m = json.loads(run_fmoe(fmoe_bin, "inspect", f, "--json").stdout)
    assert m["architecture"] == MODELS[name]
    raw = bytearray(f.read_bytes())
    at = raw.find(b"fmoe.hf_config")
    raw[at:at + 14] = b"fmoe.hf_confiX"
    bare = tmp_path / "bare.gguf"
    bare.write_bytes(bytes(raw))
    built = json.loads(run_fmoe(fmoe_bin, "inspect", bare, "--json").stdout)["model"]
    assert built["config"] == "built from GGUF metadata"
    for k in ("model_type", "layers", "moe_layers", "experts", "top_k", "shared_experts",
              "hidden_size", "moe_intermediate_size"):
        assert built[k] == m["model"][k], (k, built[k], m["model"][k])


def test_llama4_multimodal_checkpoint_writes_its_text_model(models, converted, fmoe_bin,
                                                            tmp_path):
    src = models("llama4")
    d = tmp_path / "mm"
    d.mkdir()
    text = json.loads((src / "config.json").read_text())
    cfg = {"architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4",
           "text_config": text, "vision_config": {"hidden_size": 8}}
    (d / "config.json").write_text(json.dumps(cfg))
    for f in src.iterdir():
        if f.suffix == ".json" and f.name != "config.json":
            shutil.copy(f, d / f.name)
    ck = read_checkpoint(src)
    tensors = {"language_model." + k: (x, "F32") for k, (x, *_) in ck.items()}
    tensors["vision_model.patch_embedding.weight"] = (np.ones((8, 8), np.float32), "F32")
    tiny.save_safetensors(d / "model.safetensors", tensors)
    out = tmp_path / "mm.gguf"
    run_fmoe(fmoe_bin, "quantize", "--type", "f32", d, "-o", out, "--quiet")
    got, want = f32_tensors(out), f32_tensors(converted("llama4"))
    assert sorted(got) == sorted(want)
    for k in want:
        assert np.array_equal(got[k], want[k]), k


def converter_rope_freqs(rp, dim):
    """LlamaModel.generate_extra_tensors in NumPy float32: its frequencies are a float32
    torch tensor, so each value derived from one is float32 and the Python numbers it meets
    are rounded to float32 first."""
    f32 = np.float32
    freqs = f32(1) / np.power(f32(rp["rope_theta"]), np.arange(0, dim, 2, dtype=f32) / f32(dim))
    factor, lo, hi = rp["factor"], rp["low_freq_factor"], rp["high_freq_factor"]
    old = rp["original_max_position_embeddings"]
    out = []
    for fr in freqs:
        wl = f32(2 * math.pi) / fr
        if wl < f32(old / hi):
            out.append(f32(1))
        elif wl > f32(old / lo):
            out.append(f32(factor))
        else:
            sm = (f32(old) / wl - f32(lo)) / f32(hi - lo)
            out.append(f32(1) / ((f32(1) - sm) / f32(factor) + sm))
    return np.array(out, f32)


def test_llama4_rope_freqs_bit_exact(models, fmoe_bin, tmp_path):
    from test_gguf_deepseek2 import with_config
    rp = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
          "rope_theta": 500000.0}
    d = with_config(models("llama4"), tmp_path / "l31", head_dim=128, rope_parameters=rp)
    out = tmp_path / "m.gguf"
    run_fmoe(fmoe_bin, "quantize", "--type", "f32", d, "-o", out, "--quiet")
    got = f32_tensors(out)["rope_freqs.weight"]
    want = converter_rope_freqs(rp, 128)
    assert ((want > 1) & (want < 8)).sum() >= 4  # the smooth band is exercised
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (got, want)
