"""The forward pass driver (tests/model/forward_driver.c) run on a model over a reference's
tokens: its logits and routes, for the tests that compare a checkpoint, a converted file
and transformers' reference (the driver fixture is conftest.py's)."""
import json
import subprocess

import numpy as np


def drive(driver, model, ref, tmp_path, tag):
    logits, routes = tmp_path / f"{tag}.f32", tmp_path / f"{tag}.json"
    p = subprocess.run([str(driver), str(model), "--tokens",
                        ",".join(str(int(t)) for t in ref["tokens"]), "--generate",
                        str(len(ref["generated"])), "--logits", str(logits), "--routes",
                        str(routes)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return np.fromfile(logits, dtype="<f4"), json.loads(routes.read_text())
