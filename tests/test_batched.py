"""Several runs as one stacked model (attnid.lm.batched): seeds and cases of one model shape. Each run's rows equal
its rows trained alone to float32 round-off, and its checkpoints and records are those of a run trained alone."""

import numpy as np
import pytest
import torch

from attnid.lm import records
from attnid.lm.batched import check_stack, clip_per_run, stacked_runs, stacks, train_stack
from attnid.lm.gpt import GPT, GPTConfig
from attnid.lm.lifecycle import Checkpoint, Interrupted
from attnid.lm.metrics import Key
from attnid.lm.profiles import lr_at, make_config
from attnid.lm.train import train

CASES = ("sgd", "sgd_wd", "adamw", "adamw_rebalance")  # two optimizers, weight decay on and off, rebalancing
SEEDS = (0, 1)
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


@pytest.fixture(scope="module")
def pair(corpus, tmp_path_factory):
    """Four cases x two seeds trained alone, and the same eight runs as one stacked model."""
    out = tmp_path_factory.mktemp("runs")
    cfgs = [make_config("smoke", c, seed=s) for s in SEEDS for c in CASES]
    alone = [train(c, out=out / "alone", data=corpus, progress=False) for c in cfgs]
    together = train_stack(cfgs, out=out / "stacked", data=corpus, progress=False)
    return cfgs, out, alone, together


def test_stacked_rows_equal_rows_trained_alone(pair):
    cfgs, _, alone, together = pair
    for cfg, a, b in zip(cfgs, alone, together):
        assert (b["case"], b["seed"]) == (cfg.case, cfg.seed)
        assert [r[Key.STEP] for r in a["rows"]] == [r[Key.STEP] for r in b["rows"]]
        assert [list(r) for r in a["rows"]] == [list(r) for r in b["rows"]]  # the same keys in the same order
        assert [r[Key.LR] for r in b["rows"]] == pytest.approx(
            [lr_at(cfg, r[Key.STEP] - 1) for r in b["rows"]], rel=1e-6
        )
        for key in MEASURED + ((Key.RHO, Key.RHO_W, Key.RHO_DIFF) if cfg.case != "sgd" else ()):
            # float32 round-off of the stacked products, grown over 50 steps at SGD's learning rate of 0.5
            assert _rel_diff(a["rows"], b["rows"], key) < 2e-4, (cfg.case, cfg.seed, key)
        assert np.allclose(a["heads"]["importance"], b["heads"]["importance"], atol=1e-5)
        assert np.allclose(a["heads"]["effective_rank"], b["heads"]["effective_rank"], rtol=1e-5)
        assert [p["head"] for p in a["heads"]["pruning_curve"]] == [p["head"] for p in b["heads"]["pruning_curve"]]
        if cfg.case == "sgd":  # plain SGD: ρ is round-off either way
            assert max(v for r in b["rows"] if Key.RHO in r for layer in r[Key.RHO] for v in layer) < 1e-12
        if cfg.rebalance:
            assert [e["step"] for e in a["rebalances"]] == [e["step"] for e in b["rebalances"]]
    for case in CASES:  # each seed its own run (rebalancing leaves the function, and so the loss, as it is)
        assert len({round(t["final_val_loss"], 4) for t in together if t["case"] == case}) == len(SEEDS)


@pytest.fixture(scope="module")
def dropout_pair(corpus, tmp_path_factory):
    """Two cases x two seeds with dropout 0.2, trained alone and as one stack."""
    out = tmp_path_factory.mktemp("dropout")
    cfgs = [make_config("smoke", c, seed=s, dropout=0.2) for s in SEEDS for c in ("sgd", "adamw")]
    alone = [train(c, out=out / "alone", data=corpus, progress=False) for c in cfgs]
    together = train_stack(cfgs, out=out / "stacked", data=corpus, progress=False)
    return cfgs, alone, together


def test_stacked_rows_equal_rows_trained_alone_with_dropout(dropout_pair):
    """Each run of a stack draws its dropout masks from its own stream, where the run alone would: the rows equal
    (to the stacked products' round-off) those trained alone, and the same seed's cases draw the same noise."""
    cfgs, alone, together = dropout_pair
    for cfg, a, b in zip(cfgs, alone, together):
        assert (b["case"], b["seed"]) == (cfg.case, cfg.seed)
        for key in (Key.TRAIN_LOSS, Key.VAL_LOSS, Key.TAU, Key.GRAD_BQ, Key.NORM_BQ):
            assert _rel_diff(a["rows"], b["rows"], key) < 2e-4, (cfg.case, cfg.seed, key)
    for s in SEEDS:  # one seed's cases start from one init, one batch and one mask: the same first loss
        first = [t["rows"][0][Key.TRAIN_LOSS] for t in together if t["seed"] == s]
        assert len(first) == 2 and first[0] == pytest.approx(first[1], rel=1e-6)


def test_one_dropout_stream_for_a_stack_would_not_equal_the_runs_alone(dropout_pair, corpus, tmp_path, monkeypatch):
    """Planted: the stack's runs share torch's global RNG (as before each had its own): the training losses part
    from those trained alone by more than 1 %."""
    from attnid.lm import batched

    cfgs, alone, _ = dropout_pair
    real = batched.StackedGPT.__init__

    def shared(self, models, streams=None, device="cpu"):
        real(self, models, None, device)

    monkeypatch.setattr(batched.StackedGPT, "__init__", shared)
    mixed = train_stack(cfgs, out=tmp_path, data=corpus, progress=False)
    assert max(_rel_diff(a["rows"], b["rows"], Key.TRAIN_LOSS) for a, b in zip(alone, mixed)) > 1e-2


def test_stacked_records_are_ordinary_records(pair):
    cfgs, out, _, together = pair
    names = sorted(records.run_name(c.case, c.seed) for c in cfgs)
    for cfg, summary in zip(cfgs, together):
        rec = records.load_run("smoke", cfg.case, seed=cfg.seed, base=out / "stacked")  # checks files and rows
        assert rec.summary["stacked_with"] == names and rec.summary["history"] == [[0, 50, names]]
        assert rec.summary["final_val_loss"] == pytest.approx(summary["final_val_loss"])
    again = train_stack(cfgs, out=out / "stacked", progress=False)
    assert [a["wall_seconds"] for a in again] == [t["wall_seconds"] for t in together]  # reused, not retrained


@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_an_interrupted_stack_resumes_alone_or_stacked(corpus, tmp_path, dropout):
    """The checkpoints a stack writes are each run's own (its dropout stream among them): a run resumes from them
    alone, and the others as a stack, with the rows of an uninterrupted run (to round-off)."""
    cfgs = [
        make_config("smoke", "adamw", seed=0, dropout=dropout),
        make_config("smoke", "sgd_wd", seed=0, dropout=dropout),
        make_config("smoke", "adamw", seed=1, dropout=dropout),
    ]
    whole = [train(c, out=tmp_path / "whole", data=corpus, progress=False) for c in cfgs]
    with pytest.raises(Interrupted):
        train_stack(cfgs, out=tmp_path / "cut", data=corpus, progress=False, stop_after=30)
    ck = Checkpoint.load(records.run_dir("smoke", "sgd_wd", 0, tmp_path / "cut") / "checkpoint.pt")
    assert ck.step == 20 and ck.model["wte.weight"].shape == (65, 64)  # one run's slice
    adamw = Checkpoint.load(records.run_dir("smoke", "adamw", 1, tmp_path / "cut") / "checkpoint.pt")
    solo_format = torch.optim.AdamW([torch.zeros(1)]).state_dict()["param_groups"][0].keys()
    assert adamw.opt["state"][0]["exp_avg"].shape == (65, 64) and adamw.opt["param_groups"][0].keys() == solo_format
    alone = train(cfgs[1], out=tmp_path / "cut", data=corpus, progress=False)
    rest = train_stack([cfgs[0], cfgs[2]], out=tmp_path / "cut", data=corpus, progress=False)
    for w, r in zip(whole, [rest[0], alone, rest[1]]):
        for key in (Key.TRAIN_LOSS, Key.VAL_LOSS, Key.TAU, Key.RHO):
            # with dropout the stacked products' round-off grows faster over the steps (measured on 2 cores: ρ of the
            # SGD + weight decay run resumed alone 2.5e-4 with it, 6.5e-5 without); a wrong mask moves it by 1e-2
            assert _rel_diff(w["rows"], r["rows"], key) < (5e-4 if dropout else 1e-4), key
    # the provenance says how each part was trained
    three = ["adamw", "adamw-s1", "sgd_wd"]
    assert alone["history"] == [[0, 20, three], [20, 50, None]] and alone["stacked_with"] == three
    for r in rest:
        assert r["history"] == [[0, 20, three], [20, 50, ["adamw", "adamw-s1"]]] and r["stacked_with"] == three
    assert whole[0]["history"] == [[0, 50, None]] and "stacked_with" not in whole[0]


def test_a_stack_shares_everything_but_the_per_run_fields():
    with pytest.raises(ValueError, match="differ in n_head"):
        check_stack([make_config("smoke", "heads_H2"), make_config("smoke", "heads_H4")])
    with pytest.raises(ValueError, match="repeated runs"):
        check_stack([make_config("smoke", "adamw", seed=0)] * 2)
    check_stack([make_config("smoke", "sgd", lr=0.1), make_config("smoke", "adamw", seed=3)])  # these may differ
    suite = [make_config("smoke", c) for c in ("sgd", "heads_H2", "adamw", "heads_H4", "sgd_deep")]
    # heads_H4 is AdamW at the smoke model's own 4 heads: the same shape as sgd's and adamw's
    assert [[c.case for c in s] for s in stacks(suite)] == [["sgd", "adamw", "heads_H4"], ["heads_H2"], ["sgd_deep"]]


def test_runs_of_one_optimizer_class_are_stepped_together(corpus, tmp_path):
    cfgs = [make_config("smoke", c) for c in ("sgd", "adamw", "sgd_wd", "adamw_rebalance", "sgd_lr0.25")]
    group = stacked_runs([(c, tmp_path / c.case) for c in cfgs], corpus, "cpu", "fp32")
    assert [r.cfg.case for r in group.runs] == ["sgd", "adamw", "adamw_rebalance", "sgd_wd", "sgd_lr0.25"]
    assert [(st.start, st.stop) for st in group.steppers] == [(0, 1), (1, 3), (3, 4), (4, 5)]
    W = group.module.p["blocks.0.attn.c_attn.weight"]
    assert group.runs[2].model.blocks[0].attn.c_attn.weight.data_ptr() == W[2].data_ptr()  # a view of the stack
    assert group.steppers[1].params["blocks.0.attn.c_attn.weight"].data_ptr() == W[1].data_ptr()


def test_clipping_is_each_runs_own():
    torch.manual_seed(0)
    grads = [torch.randn(3, 4, 5), torch.randn(3, 7)]
    params = [torch.zeros_like(g, requires_grad=True) for g in grads]
    for p, g in zip(params, grads):
        p.grad = g.clone()
    clip_per_run(params, torch.tensor([1.0, 0.0, 100.0]))
    for r, norm in enumerate([1.0, 0.0, 100.0]):
        alone = [torch.zeros_like(g[r], requires_grad=True) for g in grads]
        for p, g in zip(alone, grads):
            p.grad = g[r].clone()
        if norm > 0:
            torch.nn.utils.clip_grad_norm_(alone, norm)
        for p, q in zip(params, alone):
            assert torch.allclose(p.grad[r], q.grad, rtol=1e-6)


def test_the_floor_of_a_step_counts_every_matrix_product():
    """``train_flops`` against torch's own count of the matrix products of one forward and backward (which does
    not count attention's products on the CPU): they differ by exactly the causal attention term."""
    from torch.utils.flop_counter import FlopCounterMode

    cfg = GPTConfig(block_size=32, n_layer=2, n_head=4, n_embd=64)
    x = torch.randint(65, (8, 32))
    with FlopCounterMode(display=False) as counter:
        GPT(cfg)(x, x)[1].backward()
    attention = 3 * 8 * 32 * cfg.n_layer * 2 * 2 * (32 / 2) * 64
    assert cfg.train_flops(8) == counter.get_total_flops() + attention
