"""Several seeds as one batched model (attnid.lm.batched): each seed's rows equal its rows trained alone
to float32 round-off, and its checkpoints and records are those of a run trained alone."""

import numpy as np
import pytest
import torch

from attnid.lm import records
from attnid.lm.batched import train_seeds
from attnid.lm.metrics import Key
from attnid.lm.profiles import make_config
from attnid.lm.train import Interrupted, seed_optimizer_state, stack_optimizer_states, train

SEEDS = (0, 1)  # a batch of two seeds: each equals its run alone (the interrupted batch below has three)
# metrics that are real numbers of the run; the others are round-off (the key-bias gradient and, under
# AdamW, the key bias it moves; every ρ of plain SGD) and only their size is reproducible
MEASURED = (Key.TRAIN_LOSS, Key.VAL_LOSS, Key.BETA_DRIFT, Key.BETA_REL, Key.TAU, Key.QK_SV, Key.GRAD_BQ, Key.NORM_BQ)


def _rel_diff(a: list[dict], b: list[dict], key: Key) -> float:
    """Largest difference relative to the metric's scale: its largest value, or for the β drift (a
    difference of two O(1) matrices divided by the first) the initial β, whose drift is relative to 1."""
    va = np.array([r[key] for r in a if key in r], dtype=float)
    vb = np.array([r[key] for r in b if key in r], dtype=float)
    assert va.shape == vb.shape and va.size
    scale = 1.0 if key == Key.BETA_DRIFT else np.abs(va).max()
    return float(np.abs(va - vb).max() / scale)


@pytest.fixture(scope="module", params=["adamw", "sgd", "adamw_rebalance"])
def pair(request, corpus, tmp_path_factory):
    """The same seeds of one case trained alone and as one batched model."""
    out = tmp_path_factory.mktemp("runs")
    cfgs = [make_config("smoke", request.param, seed=s) for s in SEEDS]
    alone = [train(c, out=out / "alone", data=corpus, progress=False) for c in cfgs]
    together = train_seeds(cfgs, out=out / "batched", data=corpus, progress=False)
    return request.param, out, alone, together


def test_batched_rows_equal_rows_trained_alone(pair):
    case, _, alone, together = pair
    for a, b in zip(alone, together):
        assert [r[Key.STEP] for r in a["rows"]] == [r[Key.STEP] for r in b["rows"]]
        for key in MEASURED + ((Key.RHO, Key.RHO_W, Key.RHO_DIFF) if case != "sgd" else ()):
            assert _rel_diff(a["rows"], b["rows"], key) < 1e-4, key
        assert np.allclose(a["heads"]["importance"], b["heads"]["importance"], atol=1e-5)
        if case == "sgd":  # plain SGD: ρ is round-off either way
            assert max(v for r in b["rows"] if Key.RHO in r for layer in r[Key.RHO] for v in layer) < 1e-12
    assert len({round(t["final_val_loss"], 4) for t in together}) == len(SEEDS)  # different runs


def test_batched_records_are_ordinary_records(pair):
    case, out, _, together = pair
    for s, summary in zip(SEEDS, together):
        rec = records.load_run("smoke", case, seed=s, base=out / "batched")  # checks files and rows
        assert rec.summary["batched_seeds"] == list(SEEDS)
        assert rec.summary["final_val_loss"] == pytest.approx(summary["final_val_loss"])
    again = train_seeds([make_config("smoke", case, seed=s) for s in SEEDS], out=out / "batched", progress=False)
    assert [a["wall_seconds"] for a in again] == [t["wall_seconds"] for t in together]  # reused, not retrained


def test_an_interrupted_batch_resumes_alone_or_batched(corpus, tmp_path):
    """The checkpoints a batch writes are each seed's own: a seed resumes from them alone, and the
    others as a batch, with the rows of an uninterrupted run (to round-off)."""
    cfgs = [make_config("smoke", "adamw", seed=s) for s in (0, 1, 2)]
    whole = [train(c, out=tmp_path / "whole", data=corpus, progress=False) for c in cfgs]
    with pytest.raises(Interrupted):
        train_seeds(cfgs, out=tmp_path / "cut", data=corpus, progress=False, stop_after=30)
    ck = torch.load(records.run_dir("smoke", "adamw", 1, tmp_path / "cut") / "checkpoint.pt", weights_only=False)
    assert ck["step"] == 20 and ck["model"]["wte.weight"].shape == (65, 64)  # one seed's slice
    alone = train(cfgs[1], out=tmp_path / "cut", data=corpus, progress=False)
    rest = train_seeds([cfgs[0], cfgs[2]], out=tmp_path / "cut", data=corpus, progress=False)
    for w, r in zip(whole, [rest[0], alone, rest[1]]):
        for key in (Key.TRAIN_LOSS, Key.VAL_LOSS, Key.TAU, Key.RHO):
            assert _rel_diff(w["rows"], r["rows"], key) < 1e-4, key
    # the provenance says how each part was trained
    assert alone["history"] == [[0, 20, [0, 1, 2]], [20, 50, None]] and alone["batched_seeds"] == [0, 1, 2]
    for r in rest:
        assert r["history"] == [[0, 20, [0, 1, 2]], [20, 50, [0, 2]]] and r["batched_seeds"] == [0, 1, 2]
    assert whole[0]["history"] == [[0, 50, None]] and "batched_seeds" not in whole[0]
    assert records.load_run("smoke", "adamw", 1, tmp_path / "cut").summary["history"] == alone["history"]


def test_optimizer_state_slices_stack_back():
    p = torch.zeros(3, 4, 5, requires_grad=True)
    opt = torch.optim.AdamW([p], lr=0.1)
    p.grad = torch.randn(3, 4, 5)
    opt.step()
    state = opt.state_dict()
    parts = [seed_optimizer_state(state, s) for s in range(3)]
    assert parts[1]["state"][0]["exp_avg"].shape == (4, 5)
    back = stack_optimizer_states(parts)
    assert torch.equal(back["state"][0]["exp_avg_sq"], state["state"][0]["exp_avg_sq"])


def test_configs_must_differ_only_in_the_seed():
    with pytest.raises(ValueError, match="differ in more than the seed"):
        train_seeds([make_config("smoke", "adamw", seed=0), make_config("smoke", "adamw", seed=1, lr=0.1)])
    with pytest.raises(ValueError, match="repeated seeds"):
        train_seeds([make_config("smoke", "adamw", seed=0)] * 2)
