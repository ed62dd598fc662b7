"""The §5 analysis (attnid.lm.analysis), the metrics schema and `attnid claims`: on the committed
paper-scale records (no training) and on smoke runs."""

import json

import numpy as np
import pytest
import torch
from booktool import book_tool

from attnid.dynamics import unidentified_step_fraction
from attnid.lm import analysis, records
from attnid.lm.analysis import load_suite
from attnid.lm.claims import CLAIM_IDS, POINT_CLAIM_IDS, evaluate_claims
from attnid.lm.metrics import SCHEMA, Key, check_row
from attnid.lm.profiles import make_config
from attnid.lm.records import Record, RecordError, committed_root, load_run
from attnid.lm.train import train

PAPER = committed_root() / "paper"


def _strict(text: str):
    """json.loads that refuses NaN and Infinity, as JavaScript and jq do."""

    def bad(name):
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=bad)


# ------------------------------------------------------------------------------ one run's numbers
def test_rho_key_comes_from_the_records_method(paper):
    assert analysis.rho_key(paper.first("adamw")) == Key.RHO  # the H200 records: the float64 update
    rec = paper.first("adamw")
    odd = Record(rec.path, rec.config, {**rec.summary, "rho_method": "guesswork"}, rec.rows)
    with pytest.raises(RecordError, match="unknown rho_method"):
        analysis.rho_key(odd)


def test_isotropic_share_is_that_of_the_bias_augmented_matrices():
    """A random isotropic step of a head's [W_Q | b_Q], [W_K | b_K] (D × (E+1)) has mean ρ D/(2(E+1));
    at E = 4, D = 2 that is 0.2, against 0.25 for D/(2E): the tolerance separates the two."""
    E, H, n = 4, 2, 6000
    D = E // H
    g = torch.Generator().manual_seed(0)
    Q = torch.randn(H, D, E + 1, generator=g, dtype=torch.float64)
    K = torch.randn(H, D, E + 1, generator=g, dtype=torch.float64)
    A = torch.randn(n, H, D, E + 1, generator=g, dtype=torch.float64)
    B = torch.randn(n, H, D, E + 1, generator=g, dtype=torch.float64)
    rho = unidentified_step_fraction(Q.expand(n, H, D, E + 1), K.expand(n, H, D, E + 1), A, B).mean().item()
    iso = analysis.isotropic_rho(make_config("smoke", "adamw", n_embd=E, n_head=H).as_dict())
    assert iso == pytest.approx(D / (2 * (E + 1)))
    assert abs(rho - iso) < 0.01
    assert abs(rho - D / (2 * E)) > 0.035
    no_bias = analysis.isotropic_rho(make_config("smoke", "adamw", n_embd=E, n_head=H, bias=False).as_dict())
    assert no_bias == pytest.approx(D / (2 * E))


def test_paper_scale_numbers(paper):
    """The figures the paper-scale records hold (their README gives the same)."""
    sgd, adamw = paper.first("sgd"), paper.first("adamw")
    assert analysis.mean_rho(sgd) == pytest.approx(9.17e-7, rel=0.02)
    assert analysis.isotropic_rho(adamw.config) == pytest.approx(64 / (2 * 385))
    assert analysis.best_val_loss(adamw) == pytest.approx(1.4617, abs=1e-3)
    assert np.allclose(analysis.final_drift(sgd)[[0, -1]], [0.463, 0.0076], atol=0.005)
    assert analysis.layer_trend(sgd) < 0  # six layers: the drift falls with depth
    assert analysis.layer_order(sgd) == 1.0  # every earlier layer drifts more than every later one


def test_claims_cli_json_is_strict(paper, capsys):
    from attnid.cli import main

    assert main(["claims", "--profile", "paper", "--json"]) == 0
    rows = _strict(capsys.readouterr().out)
    assert [r["id"] for r in rows] == [*CLAIM_IDS, *POINT_CLAIM_IDS]  # chapter 10's after the paper's
    for r in rows:
        assert {"id", "claim", "profile", "value", "threshold", "control", "seeds", "verdict"} <= set(r)
        assert r["verdict"] in ("yes", "no", "inconclusive", "pending") and r["profile"] == "paper"
    assert main(["claims", "--profile", "paper", "--seed-set", "0,x"]) == 2


def test_claims_reads_a_runs_folder_alone_and_names_every_records_source(paper, tmp_path, capsys, monkeypatch):
    """Planted: one paper record in a folder of one's own. ``--runs`` reads it alone (the committed records do not
    fill the other cases); ``--with-committed`` reads both and each row names where its records came from; a runs
    folder that would be mixed with the committed records without being asked is refused."""
    import shutil

    from attnid.cli import main
    from attnid.lm import records

    committed = records.committed_root()
    shutil.copytree(committed / "paper" / "sgd_lr0.125", tmp_path / "paper" / "sgd_lr0.125")
    assert main(["claims", "--profile", "paper", "--runs", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "on 1 records" in out and f"records: sgd_lr0.125 from {tmp_path}\n" in out  # not 7: nothing filled in
    assert main(["claims", "--profile", "paper", "--runs", str(tmp_path), "--with-committed", "--json"]) == 0
    rows = {r["id"]: r for r in _strict(capsys.readouterr().out)}
    assert rows["drift_falls_with_lr"]["sources"]["sgd_lr0.125"] == str(tmp_path)
    assert rows["drift_falls_with_lr"]["sources"]["sgd_lr0.0625"] == str(committed)
    assert rows["drift_falls_with_lr"]["precisions"]["sgd_lr0.125"] == "bf16"  # each row names the precision read
    monkeypatch.setenv("ATTNID_RUNS", str(tmp_path))
    assert main(["claims", "--profile", "paper"]) == 2
    assert "come from 2 places" in capsys.readouterr().err
    assert main(["claims", "--profile", "paper", "--runs", ""]) == 2  # an empty name is refused, not read as "."
    assert "runs: '' is not a folder" in capsys.readouterr().err


# ------------------------------------------------------------------------------ smoke runs
@pytest.fixture(scope="module")
def smoke_suite(corpus, tmp_path_factory):
    """The dynamics suite below smoke size (20 steps), 3 seeds of the cases that the claims without the sweep
    need: what is checked here is the reading of records, not what training does."""
    out = tmp_path_factory.mktemp("runs")
    short = dict(max_iters=20, eval_interval=10, ckpt_interval=10, metric_interval=5)
    for s in (0, 1, 2):
        for case in ("sgd", "sgd_wd", "adamw"):
            train(make_config("smoke", case, seed=s, **short), out=out, data=corpus, progress=False)
    # only these records, whatever a `make book PROFILE=smoke` left in this checkout's data/runs/ (the test below)
    return out, load_suite("smoke", base=out)


def test_a_runs_folder_reads_the_checkouts_records_only_for_the_committed_profiles(smoke_suite, tmp_path, monkeypatch):
    """A smoke (or cpu) rerun left in the checkout's data/runs/ is not read beside another runs folder; the paper and
    mid records, which ship with the project, are."""
    import shutil

    out, _ = smoke_suite
    checkout, base = tmp_path / "checkout", tmp_path / "elsewhere"
    shutil.copytree(out / "smoke" / "sgd-s1", checkout / "smoke" / "sgd-s1")  # a stray rerun in the checkout
    shutil.copytree(out / "smoke" / "sgd", base / "smoke" / "sgd")
    monkeypatch.setattr(records, "committed_root", lambda: checkout)
    assert sorted(load_suite("smoke", base=base).runs["sgd"]) == [0]
    assert records.find_runs("smoke", ["sgd"], seed=1, base=base) == {}
    records_digest = book_tool().records_digest  # the book's cache key over the records a chapter reads
    digest = records_digest(["smoke"], ["sgd"], records.record_roots("smoke", base))
    assert digest == records_digest(["smoke"], ["sgd"], [base])
    monkeypatch.undo()
    if not (committed_root() / "paper" / "sgd").is_dir():
        pytest.skip("the committed paper records are not in this checkout")
    assert 0 in load_suite("paper", base=base).runs["sgd"]  # read from the committed records


def test_rows_follow_the_schema(smoke_suite):
    _out, runs = smoke_suite
    rec = runs.first("adamw")
    cfg = make_config("smoke", "adamw").gpt_config()
    for row in rec.rows:
        check_row(row, cfg.n_layer, cfg.n_head, cfg.head_dim)
    written = {k for r in rec.rows for k in r}
    assert written == set(SCHEMA)  # every key the schema names is written, and nothing else
    with pytest.raises(ValueError, match="not in the metrics schema"):
        check_row({"rho_typo": 1.0}, 2, 4, 16)


def test_suite_loading_and_seed_bands(smoke_suite):
    out, runs = smoke_suite
    assert runs.seeds(("sgd", "sgd_wd", "adamw")) == [0, 1, 2]
    _steps, mean, lo, hi = analysis.band(runs, "adamw", Key.VAL_LOSS, lambda v: v)
    finals = [analysis.final_val_loss(runs.runs["adamw"][s]) for s in (0, 1, 2)]
    assert mean[-1] == pytest.approx(np.mean(finals)) and lo[-1] == min(finals) and hi[-1] == max(finals)
    assert len(set(finals)) == 3  # the seeds are different runs
    spread = analysis.over_seeds(runs, "sgd", analysis.mean_rho)
    assert spread["n"] == 3 and spread["max"] < 1e-12  # plain SGD: float64 round-off of float32 gradients
    assert load_suite("smoke", base=out, seeds=[1]).seeds(("sgd",)) == [1]


def test_claims_on_smoke_runs(smoke_suite):
    _, runs = smoke_suite
    rows = {r["id"]: r for r in evaluate_claims(runs)}
    assert rows["sgd_orthogonal"]["verdict"] == "yes" and rows["sgd_orthogonal"]["seeds"] == 3
    assert rows["drift_falls_with_lr"]["verdict"] == "pending"  # no sweep cases trained here
    assert rows["drift_earlier_layers"]["verdict"] == "pending"  # no 4-layer SGD trained here
    law = rows["wd_beta_law"]
    assert law["seeds"] == 3 and law["law_measure"].startswith("β") and len(law["per_layer"]) == 2


def test_run_suite_trains_only_what_is_missing(corpus, tmp_path, monkeypatch):
    from attnid.lm.launch import pending_configs

    monkeypatch.setenv("ATTNID_RUNS", str(tmp_path))
    cfgs = [make_config("smoke", c, max_iters=4, eval_interval=2, metric_interval=2) for c in ("sgd", "adamw")]
    train(cfgs[0], data=corpus, progress=False)
    assert pending_configs(cfgs) == [cfgs[1]]
    other = make_config("smoke", "sgd", max_iters=6, eval_interval=2, metric_interval=2)
    assert pending_configs([other]) == [other]  # another config's record is no reuse
    assert load_run("smoke", "sgd").rows[-1][Key.STEP] == 4


def test_readings_of_chapter_7():
    assert [analysis.rho_slope_reading(s) for s in (-0.53, -1.05, -1.3)] == ["slower", "as fast", "faster"]
    assert analysis.against_seed_noise(0.006, 0.04, 2) == "within"
    assert analysis.against_seed_noise(0.05, 0.04, 2) == "beyond"
    assert analysis.against_seed_noise(0.05, 0.0, 1) == "no estimate"


def test_sign_reading():
    assert analysis.sign_reading([0.2, 0.5]) == "positive in every run"
    assert analysis.sign_reading([-0.93, -0.1]) == "negative in every run"
    assert analysis.sign_reading([-0.93, 0.41, -0.17, -0.02, 0.09]) == "of mixed sign (2 of 5 positive)"
