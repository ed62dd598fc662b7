"""Run records: a finished run is reused only when complete; every kind of damage is named."""

import gzip
import json
import shutil

import pytest
from plants import relist

from attnid.lm import data as data_mod
from attnid.lm import records
from attnid.lm.lifecycle import Interrupted
from attnid.lm.profiles import make_config
from attnid.lm.records import RecordError
from attnid.lm.train import train


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    try:
        corpus = data_mod.load()
    except data_mod.DataError as e:
        pytest.skip(f"corpus not available: {e}")
    out = tmp_path_factory.mktemp("runs")
    cfg = make_config("smoke", "sgd", save_model=True)
    train(cfg, out=out, data=corpus, progress=False)
    return out, cfg, corpus


@pytest.fixture
def run(finished, tmp_path):
    """A fresh copy of a finished smoke run: ``(base, folder, cfg, corpus)``."""
    out, cfg, corpus = finished
    shutil.copytree(out, tmp_path / "runs")
    return tmp_path / "runs", tmp_path / "runs" / "smoke" / "sgd", cfg, corpus


def test_finished_record_is_complete_and_compact(run):
    _base, d, cfg, _ = run
    rec = records.load(d)
    assert [r["step"] for r in rec.rows] == records.expected_steps(cfg.as_dict())
    assert set(rec.summary["files"]) == {"config.json", "metrics.jsonl.gz", "heads.json", "model.pt"}
    assert rec.summary["format"] == records.FORMAT and not (d / "checkpoint.pt").exists()
    text = gzip.decompress((d / "metrics.jsonl.gz").read_bytes()).decode()
    longest = max(
        len(tok) for tok in text.replace(",", " ").replace("]", " ").replace("[", " ").split() if tok[:1].isdigit()
    )
    assert longest <= 14  # 7 significant digits, e.g. 1.234567e-05


@pytest.mark.parametrize(
    "damage, word",
    [
        (lambda d: (d / "model.pt").unlink(), "model.pt: missing"),
        (lambda d: (d / "heads.json").unlink(), "heads.json: missing"),
        (lambda d: (d / "metrics.jsonl.gz").unlink(), "metrics.jsonl.gz: missing"),
        (lambda d: (d / "config.json").unlink(), "config.json: missing"),
        (lambda d: (d / "metrics.jsonl.gz").write_bytes(b""), "metrics.jsonl.gz: changed"),
        (lambda d: (d / "heads.json").write_text(""), "heads.json: changed"),
        (lambda d: (d / "summary.json").write_text(""), "summary.json: not valid JSON"),
    ],
)
def test_damaged_record_is_named_with_the_fix(run, damage, word):
    base, d, cfg, corpus = run
    damage(d)
    for call in (lambda: records.load(d), lambda: train(cfg, out=base, data=corpus, progress=False)):
        with pytest.raises(RecordError, match=word) as e:
            call()
        assert "--force" in str(e.value)
    train(cfg, out=base, data=corpus, progress=False, force=True)  # --force repairs it
    assert records.load(d).summary["steps"] == cfg.max_iters


def _rewrite_rows(d, keep):
    text = gzip.decompress((d / "metrics.jsonl.gz").read_bytes()).decode()
    (d / "metrics.jsonl.gz").write_bytes(gzip.compress(keep(text).encode()))


def _reseal(summary: dict) -> dict:
    """A summary with its seal made to match (a tampering that hides itself)."""
    return {**summary, "seal": records.seal_of(summary)}


@pytest.mark.parametrize("cut", ["line", "within", "gzip"])
def test_truncated_rows_are_refused_even_with_a_matching_file_list(run, cut):
    """Truncation at a line boundary, within a line, or of the gzip stream, with the hashes made to match."""
    _base, d, _cfg, _corpus = run
    if cut == "line":
        _rewrite_rows(d, lambda t: "".join(t.splitlines(keepends=True)[:3]))
        word = "holds 3 rows|ends at step"
    elif cut == "within":
        _rewrite_rows(d, lambda t: t[: len(t) // 2])
        word = "damaged"
    else:
        raw = (d / "metrics.jsonl.gz").read_bytes()
        (d / "metrics.jsonl.gz").write_bytes(raw[: len(raw) // 2])
        word = "damaged"
    relist(d)
    with pytest.raises(RecordError, match=word):
        records.load(d)


def _edit_summary(d, change, reseal: bool = True):
    summary = json.loads((d / "summary.json").read_text())
    change(summary)
    (d / "summary.json").write_text(json.dumps(_reseal(summary) if reseal else summary))


@pytest.mark.parametrize(
    "change, word",
    [
        (lambda s: s.pop("files"), "no file list"),
        (lambda s: s.update(files={}), "no file list"),
        (lambda s: s.update(files=["config.json"]), "no file list"),
        (lambda s: s["files"]["config.json"].pop("bytes"), "entry 'config.json'"),
        (lambda s: s["files"].pop("metrics.jsonl.gz"), "lacks metrics.jsonl.gz"),
        (lambda s: s.update(format=99), "unknown record format 99"),
        (lambda s: s.update(format="2"), "unknown record format '2'"),
        (lambda s: s.update(final_val_loss=0.5), "says final_val_loss = 0.5"),
        (lambda s: s.update(best_val_loss=0.1), "says best_val_loss"),
        (lambda s: s.update(steps=7), "says steps = 7"),
    ],
)
def test_a_tampered_summary_is_refused_in_one_line(run, change, word):
    base, d, cfg, corpus = run
    _edit_summary(d, change)
    for call in (lambda: records.load(d), lambda: train(cfg, out=base, data=corpus, progress=False)):
        with pytest.raises(RecordError, match=word) as e:
            call()
        assert "--force" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "change",
    [
        lambda s: s.update(rho_method="float32 weight difference"),  # moved sgd_orthogonal by 8 orders
        lambda s: s.update(rebalances=[{"step": 20, "loss_before": 2.0, "loss_after": 2.05}]),
        lambda s: s.update(seed=7),
        lambda s: s.update(metrics=False),
        lambda s: s.pop("seal"),
    ],
)
def test_a_hand_edited_summary_breaks_its_seal(run, change):
    """Any value of summary.json is sealed, not only the numbers it repeats from the rows."""
    base, d, cfg, corpus = run
    _edit_summary(d, change, reseal=False)
    for call in (lambda: records.load(d), lambda: train(cfg, out=base, data=corpus, progress=False)):
        with pytest.raises(RecordError, match=r"summary\.json: changed since the run finished") as e:
            call()
        assert "--force" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("key, value", [("seed", 7), ("case", "adamw"), ("profile", "paper")])
def test_a_summary_naming_another_run_is_refused_even_resealed(run, key, value):
    _base, d, _cfg, _corpus = run
    _edit_summary(d, lambda s: s.update({key: value}))
    with pytest.raises(RecordError, match=f"summary.json: names {key} {value!r}, its config.json"):
        records.load(d)


def test_an_unsealed_record_is_refused_and_sealed_once_it_verifies(run):
    """A record of format 2 (before the seal) is refused with the way to seal it; sealing checks it whole first."""
    _base, d, _cfg, _corpus = run
    _edit_summary(d, lambda s: (s.pop("seal"), s.update(format=2)), reseal=False)
    with pytest.raises(RecordError, match=r"not sealed \(record format 2, now 3\); `python tools/import_records.py"):
        records.load(d)
    (d / "heads.json").write_text("{}")
    with pytest.raises(RecordError, match=r"heads\.json: changed"):
        records.seal(d)  # a damaged record is never sealed
    assert "seal" not in json.loads((d / "summary.json").read_text())


def test_sealing_an_intact_unsealed_record(run):
    _base, d, _cfg, _corpus = run
    before = records.load(d).summary
    _edit_summary(d, lambda s: (s.pop("seal"), s.update(format=2)), reseal=False)
    assert records.seal(d) == before and records.load(d).summary == before


def test_a_fifo_in_place_of_a_file_is_refused_at_once(run):
    import os

    _base, d, _cfg, _corpus = run
    (d / "summary.json").unlink()
    os.mkfifo(d / "summary.json")
    with pytest.raises(RecordError, match=r"summary\.json: not a regular file"):
        records.load(d)


def test_rows_that_are_not_rows_are_refused(run):
    _base, d, _cfg, _corpus = run
    (d / "metrics.jsonl.gz").write_bytes(gzip.compress(b"[1, 2, 3]\n"))
    relist(d)
    with pytest.raises(RecordError, match=r"not {'step': int"):
        records.load(d)


def test_force_checks_the_corpus_before_it_touches_the_record(run, tmp_path, monkeypatch):
    base, d, cfg, _corpus = run
    before = records.load(d).summary
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("abc")
    monkeypatch.setenv("ATTNID_DATA", str(tiny))
    with pytest.raises(data_mod.DataError):
        train(cfg, out=base, progress=False, force=True)
    assert records.load(d).summary == before  # the finished record is intact


def test_force_replaces_only_what_the_record_owns_even_through_a_symlink(run, tmp_path):
    base, d, cfg, corpus = run
    (d / "notes.txt").write_text("my notes")
    real = tmp_path / "elsewhere"
    shutil.move(str(d), real)
    d.symlink_to(real, target_is_directory=True)
    old = records.load(d).summary["date"]
    s = train(cfg, out=base, data=corpus, progress=False, force=True)
    assert d.is_symlink() and (real / "notes.txt").read_text() == "my notes"
    assert records.load(d).summary["wall_seconds"] == pytest.approx(s["wall_seconds"])
    assert not list(base.glob("smoke/.sgd.force-*")) and not list(tmp_path.glob(".sgd.force-*"))
    assert isinstance(old, str)


def test_an_interrupted_forced_run_leaves_the_old_record(run):
    base, d, cfg, corpus = run
    before = records.load(d).summary
    with pytest.raises(Interrupted):
        train(cfg, out=base, data=corpus, progress=False, force=True, stop_after=5)
    assert records.load(d).summary == before


def test_a_killed_forced_runs_folder_is_removed_by_the_next_forced_run(run):
    """SIGKILL during a forced run leaves ``.sgd.force-*`` with a checkpoint; the next forced run removes it."""
    base, d, cfg, corpus = run
    stale = d.parent / ".sgd.force-killed"
    stale.mkdir()
    (stale / "checkpoint.pt").write_bytes(b"left by a killed process")
    with pytest.raises(Interrupted):
        train(cfg, out=base, data=corpus, progress=False, force=True, stop_after=2)
    assert not list(d.parent.glob(".sgd.force-*"))


def test_stale_checkpoint_next_to_a_summary_is_ignored(run):
    base, d, cfg, corpus = run
    (d / "checkpoint.pt").write_bytes(b"stale")
    again = train(cfg, out=base, data=corpus, progress=False)
    assert again["steps"] == cfg.max_iters and again["rows"] == records.load(d).rows


def test_damaged_checkpoint_and_config_are_named(run):
    base, d, cfg, corpus = run
    (d / "summary.json").unlink()  # an unfinished run ...
    (d / "checkpoint.pt").write_bytes(b"not a checkpoint")  # ... with a damaged resume point
    with pytest.raises(RecordError, match=r"checkpoint.pt: damaged"):
        train(cfg, out=base, data=corpus, progress=False)
    (d / "config.json").write_text("{not json")
    with pytest.raises(RecordError, match=r"config.json: not valid JSON"):
        train(cfg, out=base, data=corpus, progress=False)
    (d / "config.json").write_text(json.dumps({"profile": "smoke", "n_layer": 2}))
    with pytest.raises(RecordError, match=r"config.json: not a run config"):
        train(cfg, out=base, data=corpus, progress=False)


def test_another_config_in_the_folder_is_refused(run):
    base, d, _cfg, corpus = run
    other = make_config("smoke", "sgd", lr=0.1)
    with pytest.raises(RecordError, match="differs in lr"):
        train(other, out=base, data=corpus, progress=False)
    # execution fields (device, precision, compile, save_model) do not change what a run computes
    same = make_config("smoke", "sgd", precision="fp32", save_model=False)
    assert train(same, out=base, data=corpus, progress=False)["rows"] == records.load(d).rows


def test_failed_start_leaves_no_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNID_DATA", str(tmp_path / "missing.txt"))
    with pytest.raises(data_mod.DataError):
        train(make_config("smoke", "sgd"), out=tmp_path, progress=False)
    assert not (tmp_path / "smoke" / "sgd").exists()


def test_rounding_keeps_float32_precision():
    x = [0.1234567890123, 1.0e-14 / 3, float("nan"), 7, None, {"a": 2.0 / 3}]
    r = records.round_floats(x)
    assert r[0] == 0.1234568 and abs(r[1] - 1.0e-14 / 3) < 1e-20 and r[2] is None and r[3] == 7
    assert r[5]["a"] == 0.6666667


def test_committed_paper_records_check_out():
    """The paper-scale records shipped under data/runs/paper: chapter 6's seven cases, one stack on one H200, with
    their provenance; compact."""
    import subprocess

    from attnid.lm.profiles import SUITES

    root = records.committed_root() / "paper"
    cases = SUITES["dynamics"].cases_at("paper")
    for case in cases:
        rec = records.load(root / case)
        assert rec.rows[-1]["step"] == rec.config["max_iters"] == 5000
        assert rec.config["n_layer"] == rec.config["n_head"] == 6 and rec.config["n_embd"] == 384
        assert rec.summary["code_commit"] == "0144f25" and rec.summary["precision"] == "bf16"
        assert "H200" in rec.summary["machine"] and rec.summary["stacked_with"] == sorted(cases)
        assert (root / case / records.ROWS_FILE).stat().st_size <= 1.0 * 2**20
    assert abs(records.load(root / "adamw").summary["best_val_loss"] - 1.4697) < 0.01  # nanoGPT's README
    tracked = subprocess.run(
        ["git", "ls-files", "data/runs"], cwd=records.project_root(), capture_output=True, text=True
    ).stdout.split()
    if tracked:  # in a git checkout: what is committed stays small
        assert not [f for f in tracked if f.endswith(".pt")]
        assert sum((records.project_root() / f).stat().st_size for f in tracked) <= 25 * 2**20


def test_a_record_of_an_older_format_is_not_reused(run):
    base, d, cfg, corpus = run
    summary = json.loads((d / "summary.json").read_text())
    summary["format"] = 1
    del summary["files"]
    (d / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(RecordError, match=r"older attnid .* --force"):
        train(cfg, out=base, data=corpus, progress=False)
    assert train(cfg, out=base, data=corpus, progress=False, force=True)["format"] == records.FORMAT


def test_saved_model_loads_and_reproduces_the_recorded_head_baseline(run):
    from attnid.lm.ablation import fixed_batches, masked_loss
    from attnid.lm.model_files import load_model

    _base, d, cfg, corpus = run
    model = load_model(d)
    batches = fixed_batches(corpus, cfg.batch_size, cfg.block_size, cfg.head_batches, seed=cfg.seed)
    assert not model.training
    assert abs(masked_loss(model, batches) - records.load(d).heads["baseline"]) < 1e-5


# ------------------------------------------------------------------------------ records are the identity
@pytest.mark.parametrize(
    "dest, word",
    [
        ("smoke/sgd-s1", "sits in smoke/sgd-s1"),  # a seed copied under another seed
        ("cpu/sgd", "sits in cpu/sgd"),  # a smoke record under another profile
        ("smoke/adamw", "sits in smoke/adamw"),  # under another case
    ],
)
def test_a_record_is_read_only_from_its_own_folder(run, dest, word):
    base, d, _, _ = run
    shutil.copytree(d, base / dest)
    with pytest.raises(RecordError, match=word):
        records.load(base / dest)
    from attnid.lm.analysis import load_suite

    profile = dest.split("/")[0]
    with pytest.raises(RecordError, match="a record is read only from its own folder"):
        load_suite(profile, base=base)


def test_a_folder_name_that_is_not_a_run_name_is_refused(run):
    from attnid.lm.analysis import load_suite

    base, d, _, _ = run
    shutil.copytree(d, base / "smoke" / "sgd-s01")
    with pytest.raises(RecordError, match="sgd-s01: not a run folder name"):
        load_suite("smoke", base=base)


def test_two_seeds_with_equal_rows_are_refused(run):
    from attnid.lm.analysis import check_distinct_seeds

    base, d, _, _ = run
    rec = records.load(d)
    other = records.Record(base / "smoke" / "sgd-s1", {**rec.config, "seed": 1}, rec.summary, rec.rows)
    with pytest.raises(RecordError, match="hold the same run"):
        check_distinct_seeds({0: rec, 1: other})
    check_distinct_seeds({0: rec})  # one seed is fine


def test_claims_refuses_a_runs_folder_that_is_not_one(run, capsys):
    from attnid.cli import main

    base, d, _, _ = run
    assert main(["claims", "--profile", "smoke", "--runs", str(base / "nowhere")]) == 2
    assert "runs:" in capsys.readouterr().err
    assert main(["claims", "--profile", "smoke", "--runs", str(d / "config.json")]) == 2
    assert main(["claims", "--profile", "smoke", "--runs", str(base), "--seed-set", "1_0"]) == 2
    assert "seed-set" in capsys.readouterr().err
    assert main(["claims", "--profile", "smoke", "--runs", str(base), "--json"]) == 0


def test_an_unlisted_rows_file_beside_the_listed_one_is_refused_not_read(run):
    """A record whose sealed list names the legacy metrics.jsonl must not have its rows read from an unlisted
    metrics.jsonl.gz beside it (which would be read first): one evaluation forged by 0.5 nats is refused."""
    _base, d, _cfg, _corpus = run
    rows = [json.loads(line) for line in gzip.decompress((d / "metrics.jsonl.gz").read_bytes()).splitlines()]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "metrics.jsonl.gz").unlink()
    summary = json.loads((d / "summary.json").read_text())
    del summary["files"]["metrics.jsonl.gz"]
    summary["files"]["metrics.jsonl"] = records.file_entry(d / "metrics.jsonl")
    summary["seal"] = records.seal_of(summary)
    (d / "summary.json").write_text(json.dumps(summary))
    records.load(d)  # the legacy file, listed and sealed: read
    forged = [dict(r, val_loss=r["val_loss"] - 0.5) if "val_loss" in r else r for r in rows]
    (d / "metrics.jsonl.gz").write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in forged).encode()))
    with pytest.raises(records.Refused, match=r"metrics.jsonl.gz: refused: not listed"):
        records.load(d)


@pytest.mark.parametrize(
    ("rows_of", "says"),
    [
        (lambda rows: [dict(r, val_loss="2.0") if "val_loss" in r else r for r in rows], "not a finite number >= 0"),
        (lambda rows: [dict(r, val_loss=-0.5) if "val_loss" in r else r for r in rows], "not a finite number >= 0"),
        (lambda rows: [*rows, *({} for _ in range(100_000))], "lines, more than the [0-9,]+ rows its run records"),
        (lambda rows: [*rows, *({} for _ in range(len(rows) + 1))], r"rows, more than the [0-9,]+ rows its run"),
    ],
    ids=["string loss", "negative loss", "a flood of rows (counted in the bytes)", "rows beyond the run's"],
)
def test_rows_with_losses_no_run_gives_or_far_too_many_are_refused_in_one_line(run, rows_of, says):
    _base, d, _cfg, _corpus = run
    rows = [json.loads(line) for line in gzip.decompress((d / "metrics.jsonl.gz").read_bytes()).splitlines()]
    (d / "metrics.jsonl.gz").write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows_of(rows)).encode()))
    relist(d)
    with pytest.raises(RecordError, match=says):
        records.load(d)


def test_rows_nested_too_deep_are_damaged_not_a_traceback(run):
    _base, d, _cfg, _corpus = run
    (d / "metrics.jsonl.gz").write_bytes(gzip.compress(b"[" * 200_000 + b"]" * 200_000 + b"\n"))
    relist(d)
    with pytest.raises(RecordError, match="nests its JSON too deeply"):
        records.load(d)
