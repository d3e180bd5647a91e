"""Split GGUF models (lib/gguf.c, docs/quantization.md): shards PREFIX-00001-of-0000N.gguf
written by gguf-py's GGUFWriter(split_max_tensors=...) load as the one file they split.

- The same model as one file and as 3+ shards: gguf-py's reader confirms the shards' split.*
  keys; the forward pass gives identical logits, routes and greedy tokens; `fmoe record`
  the same geometry, fingerprint and routing; offloaded generation (host tier, file tier,
  file tier with O_DIRECT: the file tier reads each expert from the shard its tensor is in)
  the single file's tokens; `fmoe inspect` lists the shards.
- Bad shards, each one line and a non-zero exit: a shard deleted, a shard from a split of
  another count, another shard than the first given, shard 1 renamed, a tensor in two
  shards, a total that is not split.tensors.count, a shard of another model (its
  split.tensors.count or a key it shares with shard 1 of another value).
- No output over a shard: record -o, --decision-log, generate --dump-logits, serve
  --port-file and --trace-out naming shard 2 or 3 (or a hard link to it) are refused with
  exit 2 before any work, every shard unchanged byte for byte.
"""
import json
import os
import shutil
import subprocess

import numpy as np
import pytest

from conftest import run_fmoe
from test_gguf_model import (PROMPTS, TINY, drive, one_line, record,  # noqa: F401
                             rewrite_gguf, write_gguf)

import gguf  # noqa: E402  (tests/python/requirements.txt)

h5py = pytest.importorskip("h5py")


def resplit(src, dst, max_tensors, drop=(), extra=None, swap=None):
    """The GGUF file src rewritten by gguf-py as shards of at most max_tensors tensors:
    every key (split.* added by the writer) and every tensor's stored bytes and type (swap:
    two tensor names whose bytes are exchanged, for a model with other weights)."""
    r = gguf.GGUFReader(str(src))
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(str(dst), arch, split_max_tensors=max_tensors)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            w.add_key_value(name, f.contents(), f.types[0], f.types[-1])
        else:
            w.add_key_value(name, f.contents(), f.types[0])
    data = {t.name: t.data for t in r.tensors}
    if swap:
        data[swap[0]], data[swap[1]] = data[swap[1]], data[swap[0]]
    for t in r.tensors:
        if t.name in drop:
            continue
        # the reader's data is shaped as the writer takes it (bytes per row if quantized)
        w.add_tensor(t.name, np.asarray(data[t.name]), raw_dtype=t.tensor_type)
    for name, (a, dtype) in (extra or {}).items():
        w.add_tensor(name, a, raw_dtype=dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    shards = sorted(dst.parent.glob(dst.stem + "-*-of-*.gguf"))
    assert len(shards) >= 3, shards
    return shards


@pytest.fixture(scope="module")
def split(tmp_path_factory, fmoe_bin):
    if not hasattr(gguf.gguf_reader.ReaderField, "contents"):
        pytest.skip("gguf-py too old for ReaderField.contents")
    d = tmp_path_factory.mktemp("gguf-split")
    out = {"bf16": write_gguf(TINY, "qwen3_moe", d / "bf16.gguf"), "q4_k": d / "q4_k.gguf"}
    run_fmoe(fmoe_bin, "quantize", "--type", "q4_k", TINY, "-o", out["q4_k"], "--quiet")
    for tag in ("bf16", "q4_k"):
        (d / tag).mkdir()
        out[tag + "_shards"] = resplit(out[tag], d / tag / f"{tag}.gguf", 30)
    prompts = d / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS.read_text().splitlines()[:4]) + "\n")
    out["prompts"] = prompts
    return out


def test_gguf_py_writes_the_split_keys_we_read(split):
    shards = split["q4_k_shards"]
    n = len(shards)
    names, total = set(), None
    for i, s in enumerate(shards):
        assert s.name == f"q4_k-{i + 1:05d}-of-{n:05d}.gguf"
        f = gguf.GGUFReader(str(s)).fields
        assert f["split.no"].contents() == i and f["split.count"].contents() == n
        assert f["split.no"].types[0] == gguf.GGUFValueType.UINT16
        total = f["split.tensors.count"].contents()
        names |= {t.name for t in gguf.GGUFReader(str(s)).tensors}
        # shard 1 alone carries the model's keys
        assert ("fmoe.hf_config" in f) == (i == 0)
    assert total == len(names) == len(gguf.GGUFReader(str(split["q4_k"])).tensors)


def test_split_forward_is_the_single_files(split, driver, tmp_path):  # noqa: F811
    tokens = [int(x) for x in np.random.default_rng(1).integers(3, 4096, 16)]
    for tag in ("bf16", "q4_k"):
        l1, r1 = drive(driver, split[tag], tokens, 8, tmp_path, tag + "-one")
        l2, r2 = drive(driver, split[tag + "_shards"][0], tokens, 8, tmp_path, tag + "-split")
        assert np.array_equal(l1, l2), f"{tag}: max |diff| {np.abs(l1 - l2).max()}"
        assert r1 == r2


def test_split_records_the_single_files_trace(fmoe_bin, split, tmp_path):
    a = record(fmoe_bin, split["bf16"], split["prompts"], tmp_path / "one.h5")
    b = record(fmoe_bin, split["bf16_shards"][0], split["prompts"], tmp_path / "split.h5")
    for key in ("model_fingerprint", "num_layers", "num_experts", "top_k", "hidden_size",
                "expert_bytes", "dtype"):
        assert a.attrs[key] == b.attrs[key], key
    for ds in ("tokens/token_id", "tokens/experts", "tokens/probs"):
        assert np.array_equal(a[ds][()], b[ds][()]), ds


@pytest.mark.parametrize("tier", [["--tier", "host"], ["--tier", "file"],
                                  ["--tier", "file", "--direct-io"]])
def test_offloaded_split_generates_the_single_files_tokens(fmoe_bin, split, tier):
    def gen(model, *extra):
        p = run_fmoe(fmoe_bin, "generate", "--model", model, "--prompt",
                     "What is a context manager?", "--max-new-tokens", 12, "--temperature", 0,
                     "--json", *extra)
        return json.loads(p.stdout)["generated_ids"]
    resident = gen(split["q4_k"])
    assert gen(split["q4_k_shards"][0], "--policy", "lru", "--cache-experts", 6, *tier) == resident


def test_inspect_lists_the_shards(fmoe_bin, split):
    shards = split["q4_k_shards"]
    j = json.loads(run_fmoe(fmoe_bin, "inspect", shards[0], "--json").stdout)
    one = json.loads(run_fmoe(fmoe_bin, "inspect", split["q4_k"], "--json").stdout)
    assert [s["path"] for s in j["shards"]] == [str(s) for s in shards]
    assert [s["tensors"] for s in j["shards"]] == \
        [len(gguf.GGUFReader(str(s)).tensors) for s in shards]
    assert "shards" not in one
    for key in ("tensors", "tensor_bytes", "types", "model"):
        assert j[key] == one[key], key
    text = run_fmoe(fmoe_bin, "inspect", shards[0]).stdout
    assert f"shards       {len(shards)}:" in text


# ---- bad shards ------------------------------------------------------------------------

def copy_shards(split, tmp_path):
    shards = []
    for s in split["bf16_shards"]:
        shutil.copy(s, tmp_path / s.name)
        shards.append(tmp_path / s.name)
    return shards


def fails(fmoe_bin, model):
    p = run_fmoe(fmoe_bin, "generate", "--model", model, "--tokenizer", TINY, "--prompt", "hi",
                 check=False)
    return one_line(p, 1)


def test_missing_shard_is_named(fmoe_bin, split, tmp_path):
    shards = copy_shards(split, tmp_path)
    shards[1].unlink()
    line = fails(fmoe_bin, shards[0])
    assert "is missing" in line and shards[1].name in line


def test_shard_of_another_count(fmoe_bin, split, tmp_path):
    """Shard 2 of a 4-way split put in place of shard 2 of the 3-way one."""
    shards = copy_shards(split, tmp_path)
    (tmp_path / "other").mkdir()
    other = resplit(split["bf16"], tmp_path / "other" / "bf16.gguf", 20)
    n = len(shards)
    assert len(other) != n
    shutil.copy(other[1], shards[1])
    line = fails(fmoe_bin, shards[0])
    assert shards[1].name in line and f"shard 2 of {len(other)}, expected shard 2 of {n}" in line


def test_another_shard_than_the_first(fmoe_bin, split, tmp_path):
    shards = copy_shards(split, tmp_path)
    line = fails(fmoe_bin, shards[1])
    assert f"shard 2 of {len(shards)}" in line and str(shards[0]) in line


def test_renamed_first_shard(fmoe_bin, split, tmp_path):
    shards = copy_shards(split, tmp_path)
    renamed = tmp_path / "model.gguf"
    shards[0].rename(renamed)
    line = fails(fmoe_bin, renamed)
    assert "model.gguf" in line and f"-00001-of-{len(shards):05d}.gguf" in line


def test_shards_swapped(fmoe_bin, split, tmp_path):
    shards = copy_shards(split, tmp_path)
    shutil.copy(shards[2], shards[1])
    line = fails(fmoe_bin, shards[0])
    assert shards[1].name in line and "says it is shard 3" in line


def test_tensor_in_two_shards_and_wrong_total(fmoe_bin, split, tmp_path):
    """A copy of a shard-1 tensor under the same name in the last shard (gguf-py refuses
    duplicates, so the last shard's first tensor is renamed in place, same length); then
    shards whose split.tensors.count is off by one (a byte patched in place in each)."""
    shards = copy_shards(split, tmp_path)
    first = gguf.GGUFReader(str(shards[0])).tensors[-1].name
    last = gguf.GGUFReader(str(shards[-1])).tensors[0].name
    victim = next(t.name for t in gguf.GGUFReader(str(shards[-1])).tensors
                  if len(t.name) == len(first))
    assert victim != first, (first, last)
    data = shards[-1].read_bytes()
    assert data.count(victim.encode()) == 1
    shards[-1].write_bytes(data.replace(victim.encode(), first.encode()))
    line = fails(fmoe_bin, shards[0])
    assert f"tensor {first} is in two shards" in line

    shards = copy_shards(split, tmp_path)
    for s in shards:  # every shard, so that they agree with each other (a shard of its own)
        r = gguf.GGUFReader(str(s))
        f = r.fields["split.tensors.count"]
        total = int(f.contents())
        at = f.offset + sum(p.nbytes for p in f.parts[:-1])  # the value, after key and type
        data = bytearray(s.read_bytes())
        data[at] += 1
        del r, f  # the reader maps the file
        s.write_bytes(bytes(data))
    line = fails(fmoe_bin, shards[0])
    assert f"hold {total} tensors, split.tensors.count says {total + 1}" in line


def test_shard_of_another_model_is_refused(fmoe_bin, split, tmp_path):
    """Shard 2 of another model with the same config.json (fmoe.hf_config), split the same
    way into as many shards, with other weights in shard 2 (two tensors' bytes swapped) and
    one more tensor in its last shard. Before, it joined the split silently (the tensor
    count still added up) and the model answered differently; now the shard's
    split.tensors.count, which is not shard 1's, names it."""
    shards = copy_shards(split, tmp_path)
    a, b = "blk.3.attn_q.weight", "blk.3.attn_output.weight"
    in_two = {t.name for t in gguf.GGUFReader(str(shards[1])).tensors}
    assert a in in_two and b in in_two
    (tmp_path / "other").mkdir()
    extra = {"fmoe_extra.weight": (np.zeros(32, np.float32), gguf.GGMLQuantizationType.F32)}
    other = resplit(split["bf16"], tmp_path / "other" / "bf16.gguf", 30, extra=extra,
                    swap=(a, b))
    assert len(other) == len(shards)
    assert gguf.GGUFReader(str(other[0])).fields["fmoe.hf_config"].contents() == \
        gguf.GGUFReader(str(shards[0])).fields["fmoe.hf_config"].contents()
    total = int(gguf.GGUFReader(str(shards[0])).fields["split.tensors.count"].contents())

    def logits(model, name):
        out = tmp_path / name
        run_fmoe(fmoe_bin, "generate", "--model", model, "--tokenizer", TINY, "--prompt",
                 "What is a context manager?", "--max-new-tokens", 4, "--temperature", 0,
                 "--dump-logits", out)
        return np.load(out)
    # the other model is a whole model of its own, and answers otherwise
    assert not np.array_equal(logits(other[0], "other.npy"), logits(shards[0], "one.npy"))
    shutil.copy(other[1], shards[1])
    line = fails(fmoe_bin, shards[0])
    assert str(shards[1]) in line, line
    assert f"split.tensors.count is {total + 1}, but shard 1" in line, line
    assert f"says {total}: a shard of another model" in line, line


def test_shard_with_another_key_value_is_refused(fmoe_bin, split, tmp_path):
    """A later shard that carries a key of shard 1's with another value (here
    general.architecture, as a writer copying the model's keys into every shard would) is
    of another model."""
    shards = copy_shards(split, tmp_path)
    r = gguf.GGUFReader(str(shards[2]))
    rewrite_gguf(r, tmp_path / "x.gguf", "olmoe")  # not the model's qwen3moe
    del r
    shutil.copy(tmp_path / "x.gguf", shards[2])
    line = fails(fmoe_bin, shards[0])
    assert str(shards[2]) in line and "key general.architecture differs from shard 1's" in line


# ---- outputs over shards ------------------------------------------------------------------
# The model is read from every shard, so no output may name one: before, only shard 1 was
# an input, and these runs overwrote shard 2 or 3 (or the file behind a hard link to it)
# and exited 0 (`serve` kept running on the model it had just damaged).

def over_shard_cases(shards, tmp_path):
    link = tmp_path / "another-name.gguf"
    os.link(shards[2], link)
    new = tmp_path / "new.h5"
    m = ["--model", shards[0], "--tokenizer", TINY]
    prompt = ["--prompt", "hi", "--max-new-tokens", 2, "--temperature", 0]
    return [
        ("record -o shard 2", ["record", *m, "--dataset", "PROMPTS", "--max-new-tokens", 2,
                               "-o", shards[1], "--quiet"]),
        ("record -o a hard link to shard 3", ["record", *m, "--dataset", "PROMPTS",
                                              "--max-new-tokens", 2, "-o", link, "--quiet"]),
        ("record --decision-log shard 3", ["record", *m, "--dataset", "PROMPTS",
                                           "--max-new-tokens", 2, "-o", new, "--quiet",
                                           "--policy", "lru", "--cache-experts", 6,
                                           "--decision-log", shards[2]]),
        ("generate --dump-logits shard 2", ["generate", *m, *prompt, "--dump-logits",
                                            shards[1]]),
        ("serve --port-file shard 3", ["serve", *m, "--port", 0, "--port-file", shards[2]]),
        ("serve --trace-out shard 2", ["serve", *m, "--port", 0, "--trace-out", shards[1]]),
    ]


@pytest.mark.parametrize("case", range(6))
def test_no_output_over_another_shard(fmoe_bin, split, tmp_path, case):
    shards = copy_shards(split, tmp_path)
    what, args = over_shard_cases(shards, tmp_path)[case]
    args = [split["prompts"] if a == "PROMPTS" else a for a in args]
    before = [s.read_bytes() for s in shards]
    inodes = [os.stat(s).st_ino for s in shards]
    p = subprocess.Popen([str(fmoe_bin), *map(str, args)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        out, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:  # a server that started over its model
        p.kill()
        out, err = p.communicate()
    after = [s.read_bytes() for s in shards]
    assert [a == b for a, b in zip(after, before)] == [True] * len(shards), what
    assert [os.stat(s).st_ino for s in shards] == inodes, what
    assert p.returncode == 2, (what, p.returncode, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "output is an input" in lines[0], (what, err)
    assert not any(s.with_name(s.name + ".partial").exists() for s in shards), what
