"""FP8 block-scaled weights (DeepSeek-V3/R1's and GLM-4.5-FP8's official safetensors:
F8_E4M3 linear weights, each with a float32 `weight_scale_inv` per 128x128 block, and
quantization_config {quant_method: fp8, weight_block_size}), dequantised on load
(runtime/model/fp8_block.c).

- e4m3_values, a NumPy transcription of the OCP E4M3 format, equals torch's
  float8_e4m3fn on all 256 codes (a stored fixture: the quick tier needs no torch).
- The tiny deepseek_v3 checkpoint written in FP8 (codes and scales by NumPy, with forced
  subnormals, negative zero and both signs; block sizes 128x128, where every tiny weight
  is one edge block, and 16x32, with whole and cut-short blocks) runs to exactly the
  logits, routes and tokens of the same weights dequantised by NumPy (fp8 · scale in
  float32, rounded to bf16) into a BF16 safetensors checkpoint.
- A missing scale, a scale of the wrong shape and a NaN code are refused in one line
  naming the tensor.
"""
import json
import subprocess

import numpy as np
import pytest

from forward_driver import drive

import hf_reference
import make_tiny_models as tiny
from test_quantize import read_checkpoint


def e4m3_values():
    """float32 value of each e4m3 code (OCP 8-bit FP spec, E4M3: bias 7, exponent 0
    subnormal m/8 · 2^-6, S.1111.111 NaN, no infinities)."""
    c = np.arange(256)
    sign = np.where(c >> 7, -1.0, 1.0)
    e, m = (c >> 3) & 15, c & 7
    v = np.where(e == 0, m / 8 * 2.0 ** -6, (1 + m / 8) * 2.0 ** (e - 7.0))
    v = np.where((e == 15) & (m == 7), np.nan, v)
    return (sign * v).astype(np.float32)


def test_e4m3_transcription_matches_torch_reference():
    def compute():
        import torch
        v = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float().numpy()
        return {"is_nan": np.isnan(v), "values": np.nan_to_num(v, nan=0.0),
                "signbit": np.signbit(v)}
    ref = hf_reference.stored_or_fresh("fp8-e4m3-codes", compute, atol=0.0)
    ours = e4m3_values()
    assert np.array_equal(np.isnan(ours), ref["is_nan"])
    assert np.array_equal(np.nan_to_num(ours, nan=0.0), ref["values"])
    assert np.array_equal(np.signbit(ours)[~ref["is_nan"]], ref["signbit"][~ref["is_nan"]])


def fp8_linear(name, shape):
    """What DeepSeek-V3's FP8 files store as F8_E4M3: every linear weight but the router,
    the embeddings and the output head."""
    return (len(shape) == 2 and name.endswith(".weight") and "embed_tokens" not in name
            and name != "lm_head.weight" and not name.endswith("mlp.gate.weight"))


def encode(x, bm, bn, rng):
    """x [rows][cols] -> (codes uint8, scale_inv float32 [ceil(rows/bm)][ceil(cols/bn)]):
    each block scaled so its largest value is 448, each value the nearest code."""
    vals = e4m3_values()
    pos = np.arange(127)  # the non-negative finite codes, increasing in value
    rows, cols = x.shape
    br, bc = -(-rows // bm), -(-cols // bn)
    scale = np.zeros((br, bc), np.float32)
    codes = np.zeros(x.shape, np.uint8)
    for i in range(br):
        for j in range(bc):
            b = x[i * bm:(i + 1) * bm, j * bn:(j + 1) * bn]
            s = np.float32(np.abs(b).max() / 448) or np.float32(1)
            scale[i, j] = s
            a = np.abs(b / s)
            k = np.clip(np.searchsorted(vals[pos], a), 1, 126)
            k = np.where(a - vals[k - 1] < vals[k] - a, k - 1, k)
            codes[i * bm:(i + 1) * bm, j * bn:(j + 1) * bn] = k | np.where(b < 0, 0x80, 0)
    # the corners of the format: subnormals of both signs, zeros of both signs
    flat = codes.reshape(-1)
    idx = rng.choice(flat.size, size=min(8, flat.size), replace=False)
    flat[idx] = np.array([0x01, 0x81, 0x07, 0x87, 0x00, 0x80, 0x04, 0x84], np.uint8)[:idx.size]
    return codes, scale


def decode(codes, scale, bm, bn):
    s = np.repeat(np.repeat(scale, bm, 0), bn, 1)[:codes.shape[0], :codes.shape[1]]
    return e4m3_values()[codes] * s  # float32 · float32, rounded once as C does


def write_pair(src, fp8_dir, bf16_dir, bm, bn, seed=0):
    """The tiny checkpoint SRC as FP8 (fp8_dir) and as its exact dequantisation to BF16
    (bf16_dir); other tensors as they are."""
    rng = np.random.default_rng(seed)
    cfg = json.loads((src / "config.json").read_text())
    fp8, ref = {}, {}
    for name, (x, dt) in read_checkpoint(src).items():
        if fp8_linear(name, x.shape):
            codes, scale = encode(x, bm, bn, rng)
            fp8[name] = (codes, "F8_E4M3")
            fp8[name + "_scale_inv"] = (scale, "F32")
            ref[name] = (tiny._bf16_bits(decode(codes, scale, bm, bn)), "BF16")
        else:
            fp8[name] = ref[name] = (x, "F32")
    for d, tensors, c in ((fp8_dir, fp8, dict(cfg, quantization_config={
            "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
            "weight_block_size": [bm, bn]})), (bf16_dir, ref, cfg)):
        d.mkdir()
        (d / "config.json").write_text(json.dumps(c))
        tiny.save_safetensors(d / "model.safetensors", tensors)
    return fp8


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return tiny.maker(tmp_path_factory.mktemp("tiny-fp8"))


@pytest.mark.parametrize("block", [(128, 128), (16, 32)], ids=["128x128", "16x32"])
def test_fp8_checkpoint_runs_as_its_dequantisation(block, models, driver, tmp_path):
    src = models("deepseek_v3")
    ref = dict(np.load(src / "reference.npz"))
    write_pair(src, tmp_path / "fp8", tmp_path / "bf16", *block)
    l1, r1 = drive(driver, tmp_path / "fp8", ref, tmp_path, "fp8")
    l2, r2 = drive(driver, tmp_path / "bf16", ref, tmp_path, "bf16")
    assert np.isfinite(l1).all()
    assert np.array_equal(l1, l2), f"max |diff| {np.abs(l1 - l2).max()}"
    assert r1 == r2


def _refused(driver, d, tmp_path):
    p = subprocess.run([str(driver), str(d), "--tokens", "1,2"], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 1, p.stderr
    assert p.stderr.count("\n") == 1, p.stderr
    return p.stderr


def test_fp8_bad_scales_refused(models, driver, tmp_path):
    src = models("deepseek_v3")
    fp8 = write_pair(src, tmp_path / "fp8", tmp_path / "bf16", 16, 32)
    w = "model.layers.1.mlp.experts.3.down_proj.weight"
    cfg = (tmp_path / "fp8" / "config.json").read_text()

    def variant(tag, tensors):
        d = tmp_path / tag
        d.mkdir()
        (d / "config.json").write_text(cfg)
        tiny.save_safetensors(d / "model.safetensors", tensors)
        return d

    missing = {k: v for k, v in fp8.items() if k != w + "_scale_inv"}
    err = _refused(driver, variant("missing", missing), tmp_path)
    assert f"{w}_scale_inv are missing" in err, err

    wrong = dict(fp8)
    s = fp8[w + "_scale_inv"][0]
    wrong[w + "_scale_inv"] = (np.ones((s.shape[0], s.shape[1] + 1), np.float32), "F32")
    err = _refused(driver, variant("shape", wrong), tmp_path)
    assert f"{w}_scale_inv has shape [{s.shape[0]},{s.shape[1] + 1}]" in err, err
    assert f"expected [{s.shape[0]},{s.shape[1]}]" in err, err

    nan = dict(fp8)
    codes = fp8[w][0].copy()
    codes[2, 5] = 0xFF
    nan[w] = (codes, "F8_E4M3")
    err = _refused(driver, variant("nan", nan), tmp_path)
    assert f"{w}, row 2, column 5 holds the FP8 NaN code 0xff" in err, err


def test_fp8_other_quant_method_refused(models, driver, tmp_path):
    src = models("deepseek_v3")
    write_pair(src, tmp_path / "fp8", tmp_path / "bf16", 128, 128)
    c = json.loads((tmp_path / "fp8" / "config.json").read_text())
    c["quantization_config"]["quant_method"] = "awq"
    (tmp_path / "fp8" / "config.json").write_text(json.dumps(c))
    err = _refused(driver, tmp_path / "fp8", tmp_path)
    assert 'quant_method "awq"' in err, err
