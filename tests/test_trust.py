"""Files a user hands us are untrusted: tensor files are read without running code, and a record's files are
checked against its seal before they are read."""

import shutil

import pytest
import torch
from plants import hostile_pickle, relist

from attnid.cli import main
from attnid.lm import records
from attnid.lm.profiles import make_config
from attnid.lm.train import Checkpoint, Interrupted, train


@pytest.fixture(scope="module")
def sealed_run(tmp_path_factory, corpus):
    """A finished smoke run of a narrow model that kept its weights (model.pt, sealed with its record)."""
    base = tmp_path_factory.mktemp("runs")
    cfg = make_config("smoke", "adamw", n_embd=16, n_head=2, block_size=8, max_iters=20, save_model=True)
    train(cfg, out=base, data=corpus, progress=False)
    return records.run_dir("smoke", "adamw", 0, base)


def _one_error_line(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize("resealed", [True, False])
def test_audit_run_never_runs_the_code_of_a_hostile_model_file(sealed_run, tmp_path, capsys, resealed):
    """A model.pt whose pickle would create a file: refused by its seal, and refused by the loader when the seal is
    made to match; the file never appears."""
    d = tmp_path / "run"
    shutil.copytree(sealed_run, d)
    marker = tmp_path / "ran"
    hostile_pickle(d / "model.pt", marker)
    if resealed:
        relist(d)
    assert main(["audit", "--run", str(d), "--json"]) == 2
    line = _one_error_line(capsys)
    assert not marker.exists()
    assert str(d / "model.pt") in line and "refused" in line
    assert ("plain tensor file" in line) if resealed else ("sha256" in line)


def test_resuming_never_runs_the_code_of_a_hostile_checkpoint(corpus, tmp_path, monkeypatch, capsys):
    cfg = make_config("smoke", "adamw")
    with pytest.raises(Interrupted):
        train(cfg, out=tmp_path, data=corpus, progress=False, stop_after=25)
    ck = records.run_dir("smoke", "adamw", 0, tmp_path) / "checkpoint.pt"
    assert Checkpoint.load(ck).step == 20  # our own checkpoint loads without running code
    marker = tmp_path / "ran"
    hostile_pickle(ck, marker, payload_key="rows")
    monkeypatch.setenv("ATTNID_RUNS", str(tmp_path))
    assert main(["train", "--profile", "smoke", "--case", "adamw", "--device", "cpu", "--json"]) == 2
    line = _one_error_line(capsys)
    assert not marker.exists()
    assert str(ck) in line and "refused" in line and "--force" in line


def test_a_model_file_that_differs_from_its_record_is_refused(sealed_run, tmp_path, capsys):
    """Another run's weights (or an edit) in place of model.pt: its sha256 differs from the seal's; the same file
    listed anew in the resealed summary is read (the seal is the record's integrity, and an edit that reseals is
    the user's own)."""
    d = tmp_path / "run"
    shutil.copytree(sealed_run, d)
    ck = records.load_tensors((d / "model.pt").read_bytes(), d / "model.pt")
    ck["model"]["blocks.0.attn.c_proj.bias"] += 1.0
    torch.save(ck, d / "model.pt")
    assert main(["audit", "--run", str(d), "--json", "--layer", "1"]) == 2
    assert "differs from the size and sha256" in _one_error_line(capsys)
    relist(d)
    assert main(["audit", "--run", str(d), "--json", "--layer", "1"]) == 0


def test_a_model_file_outside_a_sealed_record_is_refused(sealed_run, tmp_path, capsys):
    d = tmp_path / "run"
    shutil.copytree(sealed_run, d)
    (d / "summary.json").unlink()
    assert main(["audit", "--run", str(d)]) == 2
    assert "no sealed summary.json" in _one_error_line(capsys)
