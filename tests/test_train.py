"""Training loop of chapter 6 (smoke size)."""

import pytest
import torch

from attnid.lm import data as data_mod
from attnid.lm.lifecycle import Interrupted
from attnid.lm.model_files import load_model, load_snapshots
from attnid.lm.profiles import CASES, PROFILES, make_config
from attnid.lm.records import load_run
from attnid.lm.train import rebalance_model, train

# one case per way of training: SGD, weight decay, AdamW, rebalancing, a deeper model, a head width apart from E/H
# (the other cases change a learning rate or a head count: test_the_other_cases_run_and_learn)
DISTINCT = ("sgd", "sgd_wd", "adamw", "adamw_rebalance", "sgd_deep", "heads_H4_D8")
SHORT = dict(max_iters=20, eval_interval=10, eval_iters=2, head_batches=1, save_model=False)  # a third of a smoke run


def _learns(case: str, out, corpus, **overrides) -> dict:
    s = train(make_config("smoke", case, **overrides), out=out, data=corpus, progress=False)
    assert (out / "smoke" / case / "summary.json").exists()
    assert s["final_val_loss"] < 4.17, case  # below ln(65) ≈ 4.17, the uniform guess
    return s


@pytest.fixture(scope="module")
def smoke_runs(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    return out, {c: _learns(c, out, corpus) for c in DISTINCT}


def test_each_way_of_training_runs_and_learns(smoke_runs):
    _, runs = smoke_runs
    assert set(runs) == set(DISTINCT) <= set(CASES)


@pytest.mark.slow
def test_the_other_cases_run_and_learn(corpus, tmp_path):
    """Twenty steps each (5 CPU-s for the twelve, not 14): every case's own setting trains, and learns."""
    for case in set(CASES) - set(DISTINCT):
        _learns(case, tmp_path, corpus, **SHORT)


def _max(rows, key):
    return max(v for r in rows if key in r for layer in r[key] for v in layer)


def test_sgd_step_is_orthogonal_to_the_symmetry(smoke_runs):
    """ρ of the float64 optimizer update of plain SGD is float64 round-off of the float32 gradient;
    the float32 weight difference shows a rounding floor seven decades higher."""
    _, runs = smoke_runs
    rows = runs["sgd"]["rows"]
    assert _max(rows, "rho") < 1e-12
    assert _max(rows, "rho_diff") > 1e4 * _max(rows, "rho")
    adamw = runs["adamw"]["rows"]
    assert _max(adamw, "rho") > 0.02  # AdamW's steps do enter the symmetry


def test_key_bias_gradients_at_round_off(smoke_runs):
    _, runs = smoke_runs
    rows = [r for r in runs["adamw"]["rows"] if r.get("grad_bk")]
    gk = max(v for r in rows for layer in r["grad_bk"] for v in layer)
    gq = min(v for r in rows[1:] for layer in r["grad_bq"] for v in layer)
    assert gk < 1e-8 and gq > 1000 * gk


def test_rebalancing_leaves_loss_unchanged(smoke_runs, corpus):
    _, runs = smoke_runs
    events = runs["adamw_rebalance"]["rebalances"]
    assert len(events) >= 2
    assert all(abs(e["loss_after"] - e["loss_before"]) <= 1e-6 for e in events)
    # and it zeroes the augmented beta of every head
    from attnid.lm.optimizers import build
    from attnid.lm.probe import IdentificationProbe

    model, opt = build(make_config("smoke", "adamw"), corpus.vocab_size, "cpu")
    with torch.no_grad():
        for layer in model.attention_layers():
            layer.c_attn.bias.normal_()
    assert IdentificationProbe.for_model(model, opt).beta0.abs().max() > 0.1
    rebalance_model(model)
    assert IdentificationProbe.for_model(model, opt).beta0.abs().max() < 1e-5


def test_interrupted_run_resumes_to_identical_metrics(corpus, tmp_path):
    cfg = make_config("smoke", "adamw_rebalance")
    full = train(cfg, out=tmp_path / "a", data=corpus, progress=False)
    with pytest.raises(Interrupted):
        train(cfg, out=tmp_path / "b", data=corpus, progress=False, stop_after=33)  # checkpoint at 20
    ck = tmp_path / "b" / "smoke" / "adamw_rebalance" / "checkpoint.pt"
    assert ck.exists() and not (ck.parent / "summary.json").exists()
    resumed = train(cfg, out=tmp_path / "b", data=corpus, progress=False)
    assert resumed["rows"] == full["rows"]
    assert resumed["rebalances"] == full["rebalances"]
    # a finished run is reused, not recomputed
    again = train(cfg, out=tmp_path / "b", data=corpus, progress=False)
    assert again["wall_seconds"] == resumed["wall_seconds"]
    assert load_run("smoke", "adamw_rebalance", base=tmp_path / "b").rows == full["rows"]


def test_paper_profile_code_path_in_smoke_size(corpus, tmp_path):
    p = PROFILES["paper"]
    cfg = make_config(
        "paper",
        "adamw",
        max_iters=3,
        batch_size=2,
        block_size=16,
        n_embd=48,
        n_head=6,
        n_layer=2,
        eval_iters=1,
        eval_interval=2,
    )
    assert cfg.dropout == p["dropout"] == 0.2 and cfg.bias
    s = train(cfg, out=tmp_path, data=corpus, progress=False)
    assert len(s["rows"][0]["rho"][0]) == 6


@pytest.mark.parametrize(
    "kwargs, word",
    [
        (dict(profile="huge", case="sgd"), "profile"),
        (dict(profile="cpu", case="lion"), "case"),
        (dict(profile="cpu", case="sgd", lr=0.0), "lr"),
        (dict(profile="cpu", case="sgd", lr=-1.0), "lr"),
        (dict(profile="cpu", case="sgd", n_head=5), "n_head"),
        (dict(profile="cpu", case="sgd", optimizer="lion"), "optimizer"),
    ],
)
def test_bad_parameters_fail_before_training(kwargs, word):
    with pytest.raises(ValueError, match=word):
        make_config(**kwargs)


def test_corrupted_or_missing_corpus_is_rejected(tmp_path, monkeypatch):
    bad = tmp_path / "input.txt"
    bad.write_text("To be, or not to be\n" * 10)
    monkeypatch.setenv("ATTNID_DATA", str(bad))
    with pytest.raises(data_mod.DataError, match="sha256"):
        data_mod.load()
    monkeypatch.setenv("ATTNID_DATA", str(tmp_path / "nope.txt"))
    with pytest.raises(data_mod.DataError, match="ATTNID_DATA"):
        data_mod.load()


def test_batches_are_seeded(corpus):
    a = corpus.batch("train", 4, 8, torch.Generator().manual_seed(3))
    b = corpus.batch("train", 4, 8, torch.Generator().manual_seed(3))
    assert torch.equal(a[0], b[0]) and torch.equal(a[0][:, 1:], a[1][:, :-1])
    assert len(corpus.train) + len(corpus.val) == 1_115_394 and corpus.vocab_size == 65


def test_profile_and_device_checks():
    from attnid.lm.profiles import check_profile, resolve_device

    assert check_profile("smoke") == "smoke" and resolve_device("cpu") == "cpu"
    with pytest.raises(ValueError, match="profile"):
        check_profile("large")
    with pytest.raises(ValueError, match="device"):
        resolve_device("tpu")


def test_optimizer_update_is_the_applied_step(corpus):
    """The float64 update read from the optimizer state equals the float32 weight change to rounding."""
    from attnid.lm.optimizers import build
    from attnid.lm.probe import optimizer_update

    for case in ("sgd_wd", "adamw"):
        cfg = make_config("smoke", case)
        model, opt = build(cfg, corpus.vocab_size, "cpu")
        gen = torch.Generator().manual_seed(0)
        for _ in range(3):
            x, y = corpus.batch("train", 8, 16, gen)
            opt.zero_grad()
            model(x, y)[1].backward()
            w = model.attention_layers()[0].c_attn.weight
            old = w.detach().double().clone()
            opt.step()
            upd = optimizer_update(opt, w, old)
            actual = w.detach().double() - old
            assert (upd - actual).abs().max() <= 4 * torch.finfo(torch.float32).eps * old.abs().max()
            assert upd.abs().max() > 1e-6


def test_bf16_keeps_sgd_at_round_off(corpus):
    """bf16 autocast raises the floor of ρ and of the key-bias gradients, but keeps them at round-off."""
    rows = {
        c: train(make_config("smoke", c, precision="bf16", **SHORT), data=corpus, save=False, progress=False)["rows"]
        for c in ("sgd", "adamw")
    }
    assert _max(rows["sgd"], "rho") < 1e-4 < _max(rows["adamw"], "rho")
    gq = sorted(v for r in rows["sgd"] if "grad_bq" in r for layer in r["grad_bq"] for v in layer)
    assert _max(rows["sgd"], "grad_bk") < 1e-2 * gq[len(gq) // 2]


def test_heads_analysis_is_in_the_record(smoke_runs):
    out, _runs = smoke_runs
    rec = load_run("smoke", "adamw", base=out)
    h = rec.heads
    assert len(h["importance"]) == 2 and len(h["importance"][0]) == 4
    assert h["pruning_curve"][0]["loss"] == h["baseline"] and len(h["pruning_curve"]) == 9
    assert all(1.0 <= r <= 17 for layer in h["effective_rank"] for r in layer)  # D + 1 with the bias column


def test_the_smoke_profile_keeps_the_model_and_its_snapshots(smoke_runs):
    """model.pt (on by default at smoke and cpu): the final weights, and the attention layers' and their norms'
    weights at step 0 and at every evaluation (chapter 10)."""
    out, _runs = smoke_runs
    d = out / "smoke" / "adamw"
    model = load_model(d)
    _cfg, snaps, _digest = load_snapshots(d)
    assert sorted(snaps) == [0, 1, 25, 50]
    kept = {k for k in model.state_dict() if ".attn." in k or ".ln_1." in k}
    assert set(snaps[0]) == kept and len(kept) == 2 * 6  # per layer: c_attn, c_proj, ln_1 (weight, bias each)
    assert all(torch.equal(snaps[50][k], model.state_dict()[k].float()) for k in kept)
    assert not torch.equal(snaps[0]["blocks.0.attn.c_attn.weight"], snaps[1]["blocks.0.attn.c_attn.weight"])


@pytest.mark.parametrize("option, word", [({"compile": True}, "compile"), ({"precision": "tf32"}, "tf32")])
@pytest.mark.parametrize("stacked", [False, True])
def test_options_the_cpu_cannot_honour_are_refused_before_anything_is_written(option, word, stacked, corpus, tmp_path):
    """torch.compile and TF32 exist on CUDA only: on the CPU the run would be plain fp32 eager under their label
    (a TF32 record reads the bias theorems), so they are refused by name, alone or stacked, before a folder is made."""
    from attnid.lm.batched import train_stack

    cfgs = [make_config("smoke", c, device="cpu", **option) for c in ("sgd", "adamw")]
    with pytest.raises(ValueError, match=f"{word}.*CUDA only"):
        if stacked:
            train_stack(cfgs, out=tmp_path, data=corpus, progress=False)
        else:
            train(cfgs[0], out=tmp_path, data=corpus, progress=False)
    assert list(tmp_path.iterdir()) == []


def test_resume_with_another_thread_count_is_identical(corpus, tmp_path):
    """The checkpoint records the thread count and the resume restores it (CPU reductions depend on it)."""
    cfg = make_config("smoke", "adamw")
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        full = train(cfg, out=tmp_path / "a", data=corpus, progress=False)
        with pytest.raises(Interrupted):
            train(cfg, out=tmp_path / "b", data=corpus, progress=False, stop_after=33)
        torch.set_num_threads(1)
        resumed = train(cfg, out=tmp_path / "b", data=corpus, progress=False)
        assert torch.get_num_threads() == 1  # the caller's setting comes back afterwards
    finally:
        torch.set_num_threads(before)
    assert resumed["rows"] == full["rows"] and resumed["threads"] == 2
    a, b = (load_snapshots(tmp_path / x / "smoke" / "adamw")[1] for x in "ab")  # kept through the checkpoint
    assert sorted(a) == sorted(b) and all(torch.equal(a[s][k], b[s][k]) for s in a for k in a[s])


def test_corpus_errors_give_the_remedy_of_their_source(tmp_path, monkeypatch):
    bad = tmp_path / "input.txt"
    bad.write_text("not shakespeare")
    monkeypatch.setenv("ATTNID_DATA", str(bad))
    with pytest.raises(data_mod.DataError, match="point ATTNID_DATA at a good copy") as e:
        data_mod.corpus_path()
    assert "re-downloaded" not in str(e.value) and "downloaded again" not in str(e.value)
    monkeypatch.delenv("ATTNID_DATA")
    with pytest.raises(data_mod.DataError, match="give the path of a good copy") as e:
        data_mod.corpus_path(bad)
    assert "ATTNID_DATA" not in str(e.value)


def test_a_run_folder_that_cannot_be_written_is_refused_before_training(corpus, tmp_path, monkeypatch):
    import tempfile

    from attnid.lm.records import RecordError

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "NamedTemporaryFile", refuse)
    with pytest.raises(RecordError, match="cannot write run records"):
        train(make_config("smoke", "sgd"), out=tmp_path, data=corpus, progress=False)


def test_a_full_disk_is_one_line(monkeypatch, capsys):
    from attnid import cli
    from attnid.lm import train as train_mod

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device", "data/runs/smoke/sgd/checkpoint.pt")

    monkeypatch.setattr(train_mod, "train", full)
    threads = torch.get_num_threads()
    try:
        assert cli.main(["train", "--profile", "smoke", "--case", "sgd", "--threads", "1"]) == 1
    finally:
        torch.set_num_threads(threads)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "No space left on device" in err[0] and "checkpoint.pt" in err[0] and "resumes" in err[0]


def test_law_residual_of_the_probe_equals_the_weights(corpus):
    """The probe's ``beta_law_residual`` after SGD + weight-decay steps equals ‖β_t − c_t β_0‖ / ‖c_t β_0‖
    computed here from the fused ``c_attn`` weights (rows 0..E: queries, E..2E: keys), c_t = Π(1 − η λ)²."""
    from attnid.lm.metrics import Key
    from attnid.lm.optimizers import build
    from attnid.lm.probe import IdentificationProbe

    cfg = make_config("smoke", "sgd_wd", weight_decay=0.05)
    model, opt = build(cfg, corpus.vocab_size, "cpu")
    E, H = cfg.n_embd, cfg.n_head

    def betas():
        out = []
        for layer in model.attention_layers():
            w, b = layer.c_attn.weight.detach().double(), layer.c_attn.bias.detach().double()
            Q = torch.cat([w[:E], b[:E, None]], 1).reshape(H, E // H, E + 1)
            K = torch.cat([w[E : 2 * E], b[E : 2 * E, None]], 1).reshape(H, E // H, E + 1)
            out.append(Q @ Q.transpose(-1, -2) - K @ K.transpose(-1, -2))
        return torch.stack(out)  # (L, H, D, D)

    beta0, probe, c = betas(), IdentificationProbe.for_model(model, opt), 1.0
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        for g in opt.param_groups:
            g["lr"] = 0.5
        x, y = corpus.batch("train", 8, cfg.block_size, gen, "cpu")
        opt.zero_grad()
        model(x, y)[1].backward()
        probe.before_step()
        opt.step()
        c *= (1 - 0.5 * 0.05) ** 2
        row = probe.after_step(c).result()
    bt = betas()

    def norm(M):
        return M.pow(2).sum((-1, -2, -3)).sqrt()

    want = norm(bt - c * beta0) / norm(c * beta0)
    assert torch.allclose(torch.tensor(row[Key.BETA_LAW], dtype=torch.float64), want, rtol=1e-9)
    drift = norm(bt - beta0) / norm(beta0)
    assert torch.allclose(torch.tensor(row[Key.BETA_DRIFT], dtype=torch.float64), drift, rtol=1e-9)
    assert (want - drift).abs().min() > 1e-3  # the two differ: c_t enters
