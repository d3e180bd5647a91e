"""What the tests of the learned predictors in the simulator (test_promoe.py,
test_train_duoserve.py) share: a recording of fmoe-tiny with gate inputs (--hidden) over 30
bundled prompts, and predictors trained on it beside it.
"""
import pytest

from conftest import REPO

TINY = REPO / "datasets" / "fmoe-tiny"
PROMPTS = REPO / "datasets" / "samples" / "prompts_100.txt"


def trace_fixture(name):
    """A module-scoped fixture `trace`: tiny.h5 in a fresh folder `name`, 30 requests of 16
    new tokens recorded with --hidden (what both predictor kinds train on)."""
    @pytest.fixture(scope="module")
    def trace(tmp_path_factory, fmoe):
        t = tmp_path_factory.mktemp(name) / "tiny.h5"
        fmoe("record", "--model", TINY, "--dataset", PROMPTS, "--max-requests", 30,
             "--max-new-tokens", 16, "--hidden", "--threads", 1, "-q", "-o", t)
        return t
    return trace


def train(fmoe, trace, kind, name, *args):
    """Trains a `kind` predictor on `trace` into `name` beside it with
    `fmoe train-predictor *args`. Returns (path, the finished process)."""
    out = trace.parent / name
    p = fmoe("train-predictor", "--kind", kind, "--trace", trace, *args, "-q", "-o", out)
    return out, p
