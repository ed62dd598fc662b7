"""Training loop of chapter 6 (smoke size)."""
import pytest
import torch

from attnid import data as data_mod
from attnid.profiles import CASES, PROFILES, make_config
from attnid.train import Interrupted, load_run, rebalance_model, train


@pytest.fixture(scope="module")
def corpus():
    try:
        return data_mod.load()
    except data_mod.DataError as e:
        pytest.skip(f"corpus not available: {e}")


@pytest.fixture(scope="module")
def smoke_runs(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    return out, {c: train(make_config("smoke", c), out=out, data=corpus, progress=False) for c in CASES}


def test_every_case_runs_and_learns(smoke_runs):
    out, runs = smoke_runs
    for case, s in runs.items():
        assert (out / "smoke" / case / "summary.json").exists()
        assert s["final_val_loss"] < 4.17   # below ln(65) ≈ 4.17, the uniform guess


def test_sgd_rho_is_round_off_and_far_below_adamw(smoke_runs):
    _, runs = smoke_runs
    mean_rho = {}
    for case in ("sgd", "adamw"):
        vals = [v for r in runs[case]["rows"] if "rho" in r for layer in r["rho"] for v in layer]
        mean_rho[case] = sum(vals) / len(vals)
    assert mean_rho["sgd"] < 1e-4
    assert mean_rho["adamw"] > 100 * mean_rho["sgd"]


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
    from attnid import dynamics
    from attnid.train import build, qk_stack
    model, _ = build(make_config("smoke", "adamw"), corpus.vocab_size, "cpu")
    with torch.no_grad():
        for layer in model.attention_layers():
            layer.c_attn.bias.normal_()
    rebalance_model(model)
    Q, K = qk_stack(model)
    assert dynamics.beta(Q, K).abs().max() < 1e-5


def test_interrupted_run_resumes_to_identical_metrics(corpus, tmp_path):
    cfg = make_config("smoke", "adamw_rebalance")
    full = train(cfg, out=tmp_path / "a", data=corpus, progress=False)
    with pytest.raises(Interrupted):
        train(cfg, out=tmp_path / "b", data=corpus, progress=False, stop_after=33)   # checkpoint at 20
    ck = tmp_path / "b" / "smoke" / "adamw_rebalance" / "checkpoint.pt"
    assert ck.exists() and not (ck.parent / "summary.json").exists()
    resumed = train(cfg, out=tmp_path / "b", data=corpus, progress=False)
    assert resumed["rows"] == full["rows"]
    assert resumed["rebalances"] == full["rebalances"]
    # a finished run is reused, not recomputed
    again = train(cfg, out=tmp_path / "b", data=corpus, progress=False)
    assert again["wall_seconds"] == resumed["wall_seconds"]
    summary, rows = load_run("smoke", "adamw_rebalance", base=tmp_path / "b")
    assert rows == full["rows"]


def test_paper_profile_code_path_in_smoke_size(corpus, tmp_path):
    p = PROFILES["paper"]
    cfg = make_config("paper", "adamw", max_iters=3, batch_size=2, block_size=16, n_embd=48, n_head=6, n_layer=2,
                      eval_iters=1, eval_interval=2)
    assert cfg.dropout == p["dropout"] == 0.2 and cfg.bias
    s = train(cfg, out=tmp_path, data=corpus, progress=False)
    assert len(s["rows"][0]["rho"][0]) == 6


@pytest.mark.parametrize("kwargs, word", [
    (dict(profile="huge", case="sgd"), "profile"),
    (dict(profile="cpu", case="lion"), "case"),
    (dict(profile="cpu", case="sgd", lr=0.0), "lr"),
    (dict(profile="cpu", case="sgd", lr=-1.0), "lr"),
    (dict(profile="cpu", case="sgd", n_head=5), "n_head"),
    (dict(profile="cpu", case="sgd", optimizer="lion"), "optimizer"),
])
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
    from attnid.profiles import check_profile, resolve_device
    assert check_profile("smoke") == "smoke" and resolve_device("cpu") == "cpu"
    with pytest.raises(ValueError, match="profile"):
        check_profile("large")
    with pytest.raises(ValueError, match="device"):
        resolve_device("tpu")
