"""`fmoe quantize` (cmd/cmd_quantize.c, runtime/model/quantize.c) checked with the gguf
Python package: the file opens with gguf.GGUFReader, carries the architecture's metadata,
names and lays out every checkpoint tensor as llama.cpp's converter does (written out again
here, independently of the C code: the HF -> GGUF name map, the [J][rows][cols] stacking of
experts, the q/k row permutation of the "normal"-RoPE architectures), and every tensor
dequantises (by gguf-py) to within its type's error of the checkpoint's weights, or equals
them exactly where it keeps its dtype.

Inputs are the tiny checkpoints of make_tiny_models.py (rows of 32..96 values: the 32-value
types, the K-quants' fallbacks to them and the dtype fallback) and a DeepSeek-MoE
checkpoint with rows of 256 values written here, for the K-quants.
"""
import json
import pathlib
import struct

import numpy as np
import pytest

from conftest import run_fmoe
import make_tiny_models as tiny

import gguf  # noqa: E402  (tests/python/requirements.txt)
from gguf import GGMLQuantizationType as Q  # noqa: E402

FAMILIES = ["mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek"]
ARCH = {"mixtral": "llama", "qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe", "olmoe": "olmoe",
        "deepseek": "deepseek"}
# Relative RMS error bound per type (about 2^-bits of the range; test_quant.c's limits).
RMS = {"Q8_0": 0.01, "Q6_K": 0.03, "Q5_K": 0.06, "Q4_K": 0.12, "Q4_0": 0.15, "Q4_1": 0.12,
       "Q5_0": 0.08, "Q5_1": 0.06, "IQ4_NL": 0.12, "Q2_K": 0.45, "Q3_K": 0.2, "IQ4_XS": 0.12}
# llama-quantize's fallback for rows that are not whole blocks of a K-quant, when they are
# whole blocks of 32 (llama.cpp src/llama-quant.cpp); else the checkpoint's dtype
FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0", "Q3_K": "IQ4_NL", "IQ4_XS": "IQ4_NL"}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return tiny.maker(tmp_path_factory.mktemp("tiny-models"))


def read_checkpoint(d):
    """Every tensor of a safetensors checkpoint (one file or shards) as float32 numpy."""
    out = {}
    for f in sorted(pathlib.Path(d).glob("*.safetensors")):
        raw = f.read_bytes()
        n = struct.unpack("<Q", raw[:8])[0]
        header = json.loads(raw[8:8 + n])
        base = 8 + n
        for name, info in header.items():
            if name == "__metadata__":
                continue
            a, b = info["data_offsets"]
            buf = raw[base + a:base + b]
            if info["dtype"] == "F32":
                x = np.frombuffer(buf, np.float32)
            elif info["dtype"] == "F16":
                x = np.frombuffer(buf, np.float16).astype(np.float32)
            elif info["dtype"] == "BF16":
                x = (np.frombuffer(buf, np.uint16).astype(np.uint32) << 16).view(np.float32)
            else:
                raise AssertionError(info["dtype"])
            out[name] = (x.reshape(info["shape"]), info["dtype"])
    return out


def permute(w, n_head):
    """llama.cpp's convert_hf_to_gguf permute(): HF rotate-half rows -> adjacent pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def expected_tensors(family, cfg, ck):
    """GGUF name -> (array in numpy order, checkpoint dtype, kind) as llama.cpp's converter
    writes them; kind is 'norm', 'router', 'weight' or 'expert'."""
    mixtral = family == "mixtral"
    normal_rope = family in ("mixtral", "deepseek")
    n_head, n_kv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    J = cfg.get("num_local_experts") or cfg.get("num_experts") or cfg.get("n_routed_experts")
    used = set()
    where = {}  # HF name -> (GGUF name, expert slice or -1, permuted heads or 0)

    def get(name):
        used.add(name)
        return ck[name]

    out = {"token_embd.weight": (*get("model.embed_tokens.weight"), "weight"),
           "output_norm.weight": (*get("model.norm.weight"), "norm")}
    if "lm_head.weight" in ck:
        out["output.weight"] = (*get("lm_head.weight"), "weight")
    for i in range(cfg["num_hidden_layers"]):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        out[b + "attn_norm.weight"] = (*get(p + "input_layernorm.weight"), "norm")
        out[b + "ffn_norm.weight"] = (*get(p + "post_attention_layernorm.weight"), "norm")
        for hf, gg, heads in (("q_proj", "attn_q", n_head), ("k_proj", "attn_k", n_kv),
                              ("v_proj", "attn_v", 0), ("o_proj", "attn_output", 0)):
            for suffix, kind in (("weight", "weight"), ("bias", "norm")):
                name = p + f"self_attn.{hf}.{suffix}"
                if name in ck:
                    w, dt = get(name)
                    if normal_rope and heads:
                        w = permute(w, heads)
                    out[b + f"{gg}.{suffix}"] = (w, dt, kind)
                    where[name] = (b + f"{gg}.{suffix}", -1, heads if normal_rope else 0)
        for hf, gg in (("q_norm", "attn_q_norm"), ("k_norm", "attn_k_norm")):
            if p + f"self_attn.{hf}.weight" in ck:
                out[b + f"{gg}.weight"] = (*get(p + f"self_attn.{hf}.weight"), "norm")
        moe = "block_sparse_moe" if mixtral else "mlp"
        if p + f"{moe}.gate.weight" in ck:
            out[b + "ffn_gate_inp.weight"] = (*get(p + f"{moe}.gate.weight"), "router")
            names = (("w1", "gate"), ("w3", "up"), ("w2", "down")) if mixtral else \
                    (("gate_proj", "gate"), ("up_proj", "up"), ("down_proj", "down"))
            for hf, gg in names:
                ws = [get(p + f"{moe}.experts.{e}.{hf}.weight") for e in range(J)]
                for e in range(J):
                    where[p + f"{moe}.experts.{e}.{hf}.weight"] = (b + f"ffn_{gg}_exps.weight", e, 0)
                out[b + f"ffn_{gg}_exps.weight"] = (np.stack([w for w, _ in ws]), ws[0][1], "expert")
            for shared in ("shared_expert", "shared_experts"):
                if p + f"mlp.{shared}.gate_proj.weight" in ck:
                    for gg in ("gate", "up", "down"):
                        out[b + f"ffn_{gg}_shexp.weight"] = (
                            *get(p + f"mlp.{shared}.{gg}_proj.weight"), "weight")
            if p + "mlp.shared_expert_gate.weight" in ck:
                out[b + "ffn_gate_inp_shexp.weight"] = (*get(p + "mlp.shared_expert_gate.weight"), "router")
        else:
            for gg in ("gate", "up", "down"):
                out[b + f"ffn_{gg}.weight"] = (*get(p + f"mlp.{gg}_proj.weight"), "weight")
    assert used == set(ck), f"checkpoint tensors not written: {sorted(set(ck) - used)}"
    expected_tensors.where = where
    return out


def check_file(path, model_dir, family, qtype, experts_only=False):
    cfg = json.loads((pathlib.Path(model_dir) / "config.json").read_text())
    ck = read_checkpoint(model_dir)
    want = expected_tensors(family, cfg, ck)
    r = gguf.GGUFReader(str(path))

    def field(key):
        f = r.fields[key]
        if f.types[0] == gguf.GGUFValueType.STRING:
            return bytes(f.parts[f.data[0]]).decode()
        return f.parts[f.data[0]][0]

    arch = ARCH[family]
    assert field("general.architecture") == arch
    assert field(f"{arch}.block_count") == cfg["num_hidden_layers"]
    assert field(f"{arch}.embedding_length") == cfg["hidden_size"]
    assert field(f"{arch}.attention.head_count") == cfg["num_attention_heads"]
    J = cfg.get("num_local_experts") or cfg.get("num_experts") or cfg.get("n_routed_experts")
    assert field(f"{arch}.expert_count") == J
    assert field(f"{arch}.expert_used_count") == cfg["num_experts_per_tok"]
    assert json.loads(field("fmoe.hf_config")) == cfg

    got = {t.name: t for t in r.tensors}
    assert set(got) == set(want)
    counts = {}
    for name, (w, dtype, kind) in want.items():
        t = got[name]
        tname = t.tensor_type.name
        counts[tname] = counts.get(tname, 0) + 1
        assert [int(v) for v in t.shape] == list(w.shape[::-1]), name
        y = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32).reshape(w.shape)
        quantize = kind == "expert" or (kind == "weight" and not experts_only)
        if kind in ("norm", "router") or w.ndim == 1:
            assert tname == "F32", name
        elif not quantize:
            assert tname == dtype, name
        else:
            block = gguf.GGML_QUANT_SIZES[Q[qtype.upper()]][0]
            fb = FALLBACK.get(qtype.upper())
            want_type = qtype.upper() if w.shape[-1] % block == 0 else \
                fb if fb and w.shape[-1] % 32 == 0 else dtype
            assert tname == want_type, (name, tname, want_type)
        if tname in ("F32", "F16", "BF16"):
            assert np.array_equal(y, w), name
        else:
            rel = np.sqrt(((y - w) ** 2).sum() / (w ** 2).sum())
            assert rel < RMS[tname], (name, tname, rel)
    return counts


@pytest.mark.parametrize("name", FAMILIES + ["mixtral_bf16", "olmoe_f16"])
def test_q8_0_every_family(fmoe_bin, models, tmp_path, name):
    """Every family, and BF16 and F16 checkpoints (kept tensors keep that dtype)."""
    family = {"mixtral_bf16": "mixtral", "olmoe_f16": "olmoe"}.get(name, name)
    d = models(name)
    out = tmp_path / "m.gguf"
    p = run_fmoe(fmoe_bin, "quantize", "--type", "q8_0", d, "-o", out, "--quiet")
    assert f"{out}: {ARCH[family]}," in p.stdout
    counts = check_file(out, d, family, "q8_0")
    assert counts.get("Q8_0", 0) > 0
    assert not (tmp_path / "m.gguf.partial").exists()


def test_experts_only_keeps_the_rest(fmoe_bin, models, tmp_path):
    d = models("qwen2_moe")
    out = tmp_path / "m.gguf"
    run_fmoe(fmoe_bin, "quantize", "--type", "q8_0", "--experts-only", d, "-o", out, "--quiet")
    check_file(out, d, "qwen2_moe", "q8_0", experts_only=True)


@pytest.fixture(scope="module")
def deepseek256(tmp_path_factory):
    """A DeepSeek-MoE V1 checkpoint whose rows are 256 values (whole K-quant blocks)."""
    cfg = dict(tiny.DEEPSEEK_CONFIG, hidden_size=256, intermediate_size=256,
               moe_intermediate_size=256, num_hidden_layers=2, n_routed_experts=4,
               n_shared_experts=1, num_attention_heads=4, num_key_value_heads=4)
    d = tmp_path_factory.mktemp("deepseek256")
    (d / "config.json").write_text(json.dumps(cfg))
    t = tiny.deepseek_weights(cfg, seed=5)
    tiny.save_safetensors(str(d / "model.safetensors"), {k: (v, "F32") for k, v in t.items()})
    return d


@pytest.mark.parametrize("qtype", ["q4_k", "q5_k", "q6_k", "q3_k", "iq4_xs"])
def test_k_quants(fmoe_bin, deepseek256, tmp_path, qtype):
    out = tmp_path / "m.gguf"
    run_fmoe(fmoe_bin, "quantize", "--type", qtype, deepseek256, "-o", out, "--quiet")
    counts = check_file(out, deepseek256, "deepseek", qtype)
    assert counts[qtype.upper()] >= 10 and "Q8_0" not in counts


@pytest.mark.parametrize("qtype", ["q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl"])
@pytest.mark.parametrize("name", ["qwen2_moe", "deepseek"])
def test_32_value_types(fmoe_bin, models, tmp_path, qtype, name):
    out = tmp_path / "m.gguf"
    run_fmoe(fmoe_bin, "quantize", "--type", qtype, models(name), "-o", out, "--quiet")
    counts = check_file(out, models(name), name, qtype)
    assert counts.get(qtype.upper(), 0) >= 5


@pytest.mark.parametrize("qtype", ["q4_k", "q5_k", "q6_k"])
@pytest.mark.parametrize("name", ["mixtral", "qwen2_moe", "deepseek"])
def test_k_quant_fallbacks_on_narrow_rows(fmoe_bin, models, tmp_path, qtype, name):
    """Rows of 32..96 values: no whole K-quant blocks, so llama-quantize's fallback type
    (check_file says which tensor takes which) and never the checkpoint's dtype where a
    32-value block fits; the report names the fallback."""
    out = tmp_path / "m.gguf"
    p = run_fmoe(fmoe_bin, "quantize", "--type", qtype, models(name), "-o", out)
    counts = check_file(out, models(name), name, qtype)
    assert counts.get(FALLBACK[qtype.upper()], 0) >= 5
    fb = FALLBACK[qtype.upper()]
    assert f"  {fb:<10} {counts[fb]} tensors" in p.stdout and "fallback" in p.stdout, p.stdout


def test_bad_input_one_line_nothing_left(fmoe_bin, models, tmp_path):
    d = models("olmoe")
    out = tmp_path / "m.gguf"
    cases = [
        (["quantize", "--type", "q7_k", d, "-o", out], 2, "--type must be"),
        (["quantize", "--type", "q4_k_m", "--experts-type", "q4_k_m", d, "-o", out], 2,
         "--experts-type must be"),
        (["quantize", d, "-o", out], 2, "--type is required"),
        (["quantize", "--type", "q8_0", d], 2, "-o MODEL.gguf is required"),
        (["quantize", "--type", "q8_0", d, "-o", tmp_path], 2, "is a directory"),
        (["quantize", "--type", "q8_0", tmp_path / "none", "-o", out], 1, "config.json"),
    ]
    for args, code, needle in cases:
        p = run_fmoe(fmoe_bin, *args, check=False)
        assert p.returncode == code, (args, p.stderr)
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0], (args, p.stderr)
        assert lines[0].startswith("fmoe quantize: ")
        assert not out.exists() and not (tmp_path / "m.gguf.partial").exists()
    # a checkpoint missing a tensor its config needs
    broken = tmp_path / "broken"
    broken.mkdir()
    cfg = json.loads((d / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps(cfg))
    ck = read_checkpoint(d)
    del ck["model.layers.1.mlp.experts.3.up_proj.weight"]
    tiny.save_safetensors(str(broken / "model.safetensors"), {k: (v, dt) for k, (v, dt) in ck.items()})
    p = run_fmoe(fmoe_bin, "quantize", "--type", "q8_0", broken, "-o", out, check=False)
    assert p.returncode == 1
    assert p.stderr.strip() == f"fmoe quantize: {broken}: missing tensor model.layers.1.mlp.experts.3.up_proj.weight"
    assert not out.exists() and not (tmp_path / "m.gguf.partial").exists()
    # a NaN in a weight that is to be quantized
    ck = read_checkpoint(d)
    w = ck["model.layers.0.self_attn.o_proj.weight"][0].copy()
    w[5, 7] = np.nan
    ck["model.layers.0.self_attn.o_proj.weight"] = (w, "F32")
    tiny.save_safetensors(str(broken / "model.safetensors"), {k: (v, dt) for k, (v, dt) in ck.items()})
    p = run_fmoe(fmoe_bin, "quantize", "--type", "q8_0", broken, "-o", out, check=False)
    assert p.returncode == 1
    assert p.stderr.strip() == (f"fmoe quantize: {broken}/model.safetensors: tensor "
                                "model.layers.0.self_attn.o_proj.weight, row 5, column 7 is nan: "
                                "cannot quantize a non-finite value")
    assert not out.exists() and not (tmp_path / "m.gguf.partial").exists()
    # ... and in tensors kept unquantized (a norm vector, the router matrix), which it
    # used to pass through: the model then printed "" or "::::" with exit 0
    for name, r, c, v in [("model.norm.weight", None, 3, np.nan),
                          ("model.layers.1.mlp.gate.weight", 2, 4, np.inf)]:
        ck = read_checkpoint(d)
        w = ck[name][0].copy()
        if r is None:
            w[c] = v
        else:
            w[r, c] = v
        ck[name] = (w, "F32")
        tiny.save_safetensors(str(broken / "model.safetensors"),
                              {k: (x, dt) for k, (x, dt) in ck.items()})
        p = run_fmoe(fmoe_bin, "quantize", "--type", "q8_0", broken, "-o", out, check=False)
        assert p.returncode == 1, (name, p.stderr)
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and f"tensor {name}, row {r or 0}, column {c} is " in lines[0], lines
        assert "non-finite" in lines[0], lines
        assert not out.exists() and not (tmp_path / "m.gguf.partial").exists()


def inspect_json(fmoe_bin, path):
    return json.loads(run_fmoe(fmoe_bin, "inspect", path, "--json").stdout)


@pytest.mark.parametrize("family", FAMILIES)
def test_inspect_geometry_from_gguf(fmoe_bin, models, tmp_path, family):
    """fmoe inspect FILE.gguf: the geometry of the checkpoint, from fmoe.hf_config, and the
    same geometry from llama.cpp's metadata keys alone (the key renamed away, as in a file
    llama.cpp's converter made)."""
    d = models(family)
    cfg = json.loads((d / "config.json").read_text())
    out = tmp_path / "m.gguf"
    run_fmoe(fmoe_bin, "quantize", "--type", "q8_0", d, "-o", out, "--quiet")
    got = inspect_json(fmoe_bin, out)
    m = got["model"]
    assert got["architecture"] == ARCH[family] and m["config"] == "fmoe.hf_config"
    J = cfg.get("num_local_experts") or cfg.get("num_experts") or cfg.get("n_routed_experts")
    assert (m["layers"], m["experts"], m["top_k"], m["hidden_size"]) == \
        (cfg["num_hidden_layers"], J, cfg["num_experts_per_tok"], cfg["hidden_size"])
    assert set(m["expert_types"]) == {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"}
    if family == "deepseek":  # its config.json has no nested objects: Python's canonical form is cJSON's
        import hashlib
        canon = json.dumps(cfg, sort_keys=True, separators=(",", ":")).encode()
        assert m["fingerprint"] == hashlib.sha256(canon).hexdigest()
    raw = bytearray(out.read_bytes())
    at = raw.find(b"fmoe.hf_config")
    raw[at:at + 14] = b"fmoe.hf_confiX"
    bare = tmp_path / "bare.gguf"
    bare.write_bytes(bytes(raw))
    built = inspect_json(fmoe_bin, bare)["model"]
    assert built["config"] == "built from GGUF metadata"
    for k in ("model_type", "layers", "moe_layers", "experts", "top_k", "shared_experts",
              "hidden_size", "moe_intermediate_size"):
        assert built[k] == m[k], (k, built[k], m[k])
    assert built["fingerprint"] != m["fingerprint"]


def test_inspect_bad_gguf_one_line(fmoe_bin, models, tmp_path):
    out = tmp_path / "m.gguf"
    run_fmoe(fmoe_bin, "quantize", "--type", "q8_0", models("olmoe"), "-o", out, "--quiet")
    data = out.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) - 1000])
    p = run_fmoe(fmoe_bin, "inspect", cut, check=False)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 1 and len(lines) == 1, p.stderr
    assert lines[0].startswith(f"fmoe inspect: {cut}: tensor output.weight: ")
    assert "run past the end of the file" in lines[0]


@pytest.mark.parametrize("family", FAMILIES)
def test_name_map_matches_converter(build_dir, models, family):
    """fmoe_gguf_tensor_for (the map a GGUF loader will use) sends every checkpoint tensor
    where the converter's layout (written out here in Python) puts it."""
    import subprocess
    d = models(family)
    cfg = json.loads((d / "config.json").read_text())
    ck = read_checkpoint(d)
    want = expected_tensors(family, cfg, ck)
    where = dict(expected_tensors.where)  # experts and permuted q/k; the rest map 1:1
    names = sorted(ck) + ["model.layers.0.self_attn.rotary_emb.inv_freq", "model.layers.x.mlp.gate.weight"]
    n_head = cfg["num_attention_heads"]
    n_kv = cfg.get("num_key_value_heads", n_head)
    p = subprocess.run([str(build_dir / "tests" / "lib" / "quant_tool"), "map", ARCH[family],
                        str(n_head), str(n_kv), *names], capture_output=True, text=True, check=True)
    got = dict(zip(names, (tuple(line.split()) for line in p.stdout.splitlines())))
    written = set()
    for name in names[-2:]:
        assert got.pop(name) == ("-", "-1", "0"), name  # not a tensor of the layout
    for name in names[:-2]:
        g, e, h = got[name]
        assert g != "-", name
        assert g in want, (name, g)
        if name in where:
            assert (g, int(e), int(h)) == where[name], name
        else:
            assert int(e) == -1 and int(h) == 0, name
        written.add(g)
    assert written == set(want)
