"""A NaN or infinity in a weight every token reads is refused when the model loads, in one
line naming the weight, row and column, exit 1, nothing written: `generate` and `record`
alike, from a safetensors checkpoint (a bf16 projection, a norm vector) and from a GGUF
file (a Q4_K block's f16 scale). Before, the run printed text changed by the NaN (or, with
8-bit activations, "" or "::::") with exit 0. The damage is written into copies of the
bundled model by hand, from the files' own headers (safetensors' JSON, gguf-py)."""
import json
import shutil
import struct

import pytest

from conftest import run_fmoe

REPO = __import__("pathlib").Path(__file__).resolve().parents[2]
TINY = REPO / "datasets" / "fmoe-tiny"


def poke_safetensors(model_dir, name, element, raw16):
    """Element `element` of bf16 tensor `name` set to the 16-bit pattern raw16."""
    p = model_dir / "model.safetensors"
    b = bytearray(p.read_bytes())
    n = struct.unpack("<Q", b[:8])[0]
    t = json.loads(b[8:8 + n])[name]
    assert t["dtype"] == "BF16"
    at = 8 + n + t["data_offsets"][0] + 2 * element
    b[at:at + 2] = struct.pack("<H", raw16)
    p.write_bytes(bytes(b))


def assert_refused(fmoe_bin, tmp_path, model, says):
    """generate (8-bit and f32 activations) and record of a damaged model: exit 1, one line
    on stderr holding `says`, nothing on stdout, no trace or .partial left."""
    for act in ("q8", "f32"):
        p = run_fmoe(fmoe_bin, "generate", "--model", model, "--prompt", "The dictionary type",
                     "--max-new-tokens", 4, "--temperature", 0, "--activations", act,
                     check=False)
        assert p.returncode == 1 and p.stdout == "", (p.stdout, p.stderr)
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and says in lines[0], p.stderr
    prompts = tmp_path / "p.txt"
    prompts.write_text("one\ntwo\n")
    out = tmp_path / "t.h5"
    p = run_fmoe(fmoe_bin, "record", "--model", model, "--dataset", prompts,
                 "--dataset-format", "text", "--max-new-tokens", 2, "-o", out, check=False)
    assert p.returncode == 1 and says in p.stderr, p.stderr
    assert not list(tmp_path.glob("t.h5*"))


@pytest.mark.parametrize("name, element, raw16, says", [
    ("model.layers.0.self_attn.q_proj.weight", 100, 0x7FC0, "layer 0 q projection holds a "
     "non-finite weight (nan at row 0, column 100)"),
    ("model.layers.3.self_attn.o_proj.weight", 256 * 2 + 7, 0xFF80, "layer 3 o projection "
     "holds a non-finite weight (-inf at row 2, column 7)"),
    ("model.norm.weight", 5, 0x7F80, "the final norm holds a non-finite weight (inf at row 0, "
     "column 5)"),
])
def test_a_checkpoint_with_a_non_finite_weight_is_refused(fmoe_bin, tmp_path, name, element,
                                                          raw16, says):
    model = tmp_path / "m"
    shutil.copytree(TINY, model)
    poke_safetensors(model, name, element, raw16)
    assert_refused(fmoe_bin, tmp_path, model, says)
    p = run_fmoe(fmoe_bin, "generate", "--model", model, "--prompt", "x", check=False)
    assert str(model) in p.stderr, p.stderr  # the line names the model


def test_a_gguf_block_with_a_non_finite_scale_is_refused(fmoe_bin, tmp_path):
    """Q4_K: a block's f16 d (the first two bytes of its 144) set to NaN in layer 1's q
    projection, in row 3's last block. The undamaged file runs."""
    from gguf import GGUFReader
    f = tmp_path / "tiny-q4k.gguf"
    run_fmoe(fmoe_bin, "quantize", "--type", "q4_k", TINY, "-o", f, "--quiet")
    ok = run_fmoe(fmoe_bin, "generate", "--model", f, "--prompt", "x", "--max-new-tokens", 2,
                  "--temperature", 0, check=False)
    assert ok.returncode == 0, ok.stderr
    t = next(t for t in GGUFReader(str(f)).tensors if t.name == "blk.1.attn_q.weight")
    assert t.tensor_type.name == "Q4_K"
    row_bytes = int(t.n_bytes) // int(t.shape[-1])
    blocks = row_bytes // 144
    at = int(t.data_offset) + 3 * row_bytes + (blocks - 1) * 144  # row 3, its last block
    b = bytearray(f.read_bytes())
    b[at:at + 2] = struct.pack("<H", 0x7E00)  # f16 NaN
    f.write_bytes(bytes(b))
    p = run_fmoe(fmoe_bin, "generate", "--model", f, "--prompt", "x", "--max-new-tokens", 2,
                 "--temperature", 0, check=False)
    assert p.returncode == 1 and p.stdout == ""
    assert f"layer 1 q projection holds a non-finite weight (nan at row 3, column " \
        f"{(blocks - 1) * 256})" in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_a_non_finite_expert_weight_stops_the_request(fmoe_bin, tmp_path):
    """Routed experts are not read at load; a NaN in every expert of layer 0 reaches the
    residual stream, which is checked where it enters the LM head (with 8-bit activations
    the head would quantise it into finite garbage: text with exit 0). generate stops in one
    line with nothing printed, with either activations; record writes nothing; serve
    answers the request with an error and stays up."""
    from serve_util import Server
    model = tmp_path / "m"
    shutil.copytree(TINY, model)
    for e in range(8):
        poke_safetensors(model, f"model.layers.0.mlp.experts.{e}.gate_proj.weight", 0, 0x7FC0)
    says = "the hidden state entering the LM head is not finite (nan at element 0 of row 0)"
    assert_refused(fmoe_bin, tmp_path, model, says)
    srv = Server(tmp_path, "--model", model)
    try:
        st, _, data = srv.post("/v1/completions", {"model": "m", "prompt": "hi",
                                                   "max_tokens": 4, "temperature": 0})
        text = data.decode() if isinstance(data, bytes) else data
        assert st == 500 and "not finite" in text, (st, text)
        assert srv.request("GET", "/health")[0] == 200
    finally:
        rc, err = srv.stop()
    assert rc in (0, 1), err
