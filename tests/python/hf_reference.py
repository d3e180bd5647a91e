"""References computed by HF transformers, stored as fixtures so that the quick test tier
needs no torch.

Every cross-check against transformers asks this module for its reference by name:

    ref = hf_reference.stored_or_fresh("fmoe-tiny-greedy-" + key(ids), compute, atol=1e-4)

where `compute()` runs transformers and returns a dict of numpy arrays. What happens depends
on the tier (FMOE_TEST_TIER):

- quick (the default; `bash tests/run.sh`): the stored reference is read from
  tests/fixtures/transformers/NAME.npz; torch is never imported. A missing fixture fails
  the test and names the command that makes it.
- full (`bash tests/run-all.sh`, and CI): the reference is computed again by transformers
  and must agree with the stored one (integer arrays exactly, float arrays within the
  caller's atol), so a fixture cannot go stale without the full tier saying so; the test
  then uses the fresh values.
- FMOE_REGENERATE_REFERENCES=1 with the full tier (`bash tests/python/derive_references.sh`):
  the fresh reference replaces the stored one.

The versions that made the stored fixtures are pinned in tests/python/requirements-torch.txt
(torch 2.15.0, transformers 5.23.0).
"""
import hashlib
import json
import os
import pathlib

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "transformers"
DERIVE = "bash tests/python/derive_references.sh"


def tier():
    t = os.environ.get("FMOE_TEST_TIER", "quick")
    if t not in ("quick", "full"):
        raise ValueError(f"FMOE_TEST_TIER must be quick or full, got {t!r}")
    return t


def regenerating():
    return tier() == "full" and os.environ.get("FMOE_REGENERATE_REFERENCES") == "1"


def key(ids):
    """A short name for a token sequence, so a fixture is tied to the exact input."""
    a = np.asarray(ids, dtype=np.int64)
    return hashlib.sha256(a.tobytes()).hexdigest()[:16]


def _compare(name, stored, fresh, atol):
    assert sorted(stored) == sorted(fresh), \
        f"{name}: stored fields {sorted(stored)} != fresh {sorted(fresh)} (run {DERIVE})"
    for k, v in fresh.items():
        s = stored[k]
        assert s.shape == v.shape, f"{name}/{k}: stored shape {s.shape} != fresh {v.shape}"
        if np.issubdtype(v.dtype, np.floating):
            diff = float(np.abs(s.astype(np.float64) - v.astype(np.float64)).max()) if v.size else 0.0
            assert diff <= atol, f"{name}/{k}: stored and fresh differ by {diff} > {atol} (run {DERIVE})"
        else:
            assert np.array_equal(s, v), f"{name}/{k}: stored and fresh differ (run {DERIVE})"


def stored_or_fresh(name, compute, atol):
    """The reference NAME (a dict of arrays): stored in the quick tier, recomputed and
    checked against the stored one in the full tier."""
    path = FIXTURES / f"{name}.npz"
    if tier() == "quick":
        if not path.exists():
            pytest.fail(f"{path} is missing: make it with {DERIVE}")
        with np.load(path) as z:
            return {k: z[k] for k in z.files}
    fresh = {k: np.asarray(v) for k, v in compute().items()}
    if regenerating():
        FIXTURES.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(path, **fresh)
        return fresh
    if not path.exists():
        pytest.fail(f"{path} is missing: make it with {DERIVE}")
    with np.load(path) as z:
        stored = {k: z[k] for k in z.files}
    _compare(name, stored, fresh, atol)
    return fresh


def stored_or_fresh_json(name, compute):
    """Like stored_or_fresh for a JSON document, compared exactly."""
    path = FIXTURES / f"{name}.json"
    if tier() == "quick":
        if not path.exists():
            pytest.fail(f"{path} is missing: make it with {DERIVE}")
        return json.loads(path.read_text())
    fresh = json.loads(json.dumps(compute()))
    if regenerating():
        FIXTURES.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(fresh, indent=1, sort_keys=True) + "\n")
        return fresh
    if not path.exists():
        pytest.fail(f"{path} is missing: make it with {DERIVE}")
    stored = json.loads(path.read_text())
    assert stored == fresh, f"{path}: transformers now writes another checkpoint layout (run {DERIVE})"
    return fresh
