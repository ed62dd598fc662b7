"""Files a user hands us are untrusted: tensor files are read without running code, and a record's files are
checked against its seal before they are read."""

import gzip
import json
import os
import shutil

import pytest
import torch
from plants import hostile_pickle, relist

from attnid.cli import main
from attnid.lm import records
from attnid.lm.lifecycle import Checkpoint, Interrupted
from attnid.lm.profiles import make_config
from attnid.lm.train import train


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


@pytest.fixture(scope="module")
def interrupted_run(tmp_path_factory, corpus):
    """A smoke run stopped after 25 steps: its folder holds rows and a checkpoint at step 20."""
    base = tmp_path_factory.mktemp("stopped")
    with pytest.raises(Interrupted):
        train(make_config("smoke", "adamw"), out=base, data=corpus, progress=False, stop_after=25)
    return base


def _set(key, value):
    return lambda ck: ck.__setitem__(key, value)


def _first_tensor(part, change):
    def plant(ck):
        k = next(iter(ck[part]))
        ck[part][k] = change(ck[part][k])

    return plant


def _opt_tensor(change):
    def plant(ck):
        state = next(iter(ck["opt"]["state"].values()))
        state["exp_avg"] = change(state["exp_avg"])

    return plant


def _row(change):
    def plant(ck):
        change(ck["rows"][-1])

    return plant


CHECKPOINT_PLANTS = {
    "step past the end": ("step", _set("step", 1000)),
    "negative step": ("step", _set("step", -5)),
    "string step": ("step", _set("step", "20")),
    "step off the checkpoint grid": ("step", _set("step", 10)),
    "absurd threads": ("threads", _set("threads", 100_000)),
    "negative threads": ("threads", _set("threads", -1)),
    "NaN elapsed": ("elapsed", _set("elapsed", float("nan"))),
    "wrong weight shape": ("model", _first_tensor("model", lambda v: v[:1])),
    "NaN weight": ("model", _first_tensor("model", lambda v: v * float("nan"))),
    "a generator state torch refuses": ("gen", _set("gen", torch.zeros(7, dtype=torch.uint8))),
    "a string as the global RNG": ("rng", _set("rng", "state")),
    "optimizer state of the wrong shape": ("opt", _opt_tensor(lambda v: v.reshape(-1)[:3])),
    "NaN optimizer state": ("opt", _opt_tensor(lambda v: v * float("nan"))),
    "other weight decay": ("opt", lambda ck: ck["opt"]["param_groups"][0].__setitem__("weight_decay", 7.0)),
    "a forged eps": ("opt", lambda ck: ck["opt"]["param_groups"][0].__setitem__("eps", 1e-3)),
    "amsgrad switched on": ("opt", lambda ck: ck["opt"]["param_groups"][0].__setitem__("amsgrad", True)),
    "maximize switched on": ("opt", lambda ck: ck["opt"]["param_groups"][0].__setitem__("maximize", True)),
    "a row dropped": ("rows", lambda ck: ck["rows"].pop()),
    "a row's step changed": ("rows", _row(lambda r: r.__setitem__("step", 19))),
    "a tensor in a row": ("rows", _row(lambda r: r.__setitem__("lr", torch.zeros(2)))),
    "beta0 of the wrong shape": ("beta0", _set("beta0", torch.zeros(3))),
    "history past the step": ("history", _set("history", [[0, 999, None]])),
    "a snapshot of another shape": ("snapshots[0]", lambda ck: ck["snapshots"].__setitem__(0, {"x": torch.zeros(1)})),
}


@pytest.mark.parametrize("plant", list(CHECKPOINT_PLANTS))
def test_every_field_of_a_checkpoint_is_checked_before_resuming(interrupted_run, tmp_path, monkeypatch, capsys, plant):
    """Planted: one field of an honest checkpoint changed (a step past the end, absurd threads, a NaN weight, rows
    that disagree with the step...). Resuming refuses with one line naming the file and the field, exit 2, and no
    record is sealed; the honest checkpoint resumes to a sealed record (the control)."""
    field, change = CHECKPOINT_PLANTS[plant]
    shutil.copytree(interrupted_run, tmp_path / "runs")
    ck_path = records.run_dir("smoke", "adamw", 0, tmp_path / "runs") / "checkpoint.pt"
    ck = records.load_tensors(ck_path.read_bytes(), ck_path)
    change(ck)
    torch.save(ck, ck_path)
    monkeypatch.setenv("ATTNID_RUNS", str(tmp_path / "runs"))
    assert main(["train", "--profile", "smoke", "--case", "adamw", "--device", "cpu", "--json"]) == 2
    line = _one_error_line(capsys)
    assert str(ck_path) in line and f"field {field!r}" in line and "--force" in line, line
    assert not (ck_path.parent / "summary.json").exists()


def test_an_honest_checkpoint_resumes(interrupted_run, tmp_path, monkeypatch, capsys):
    shutil.copytree(interrupted_run, tmp_path / "runs")
    monkeypatch.setenv("ATTNID_RUNS", str(tmp_path / "runs"))
    assert main(["train", "--profile", "smoke", "--case", "adamw", "--device", "cpu", "--json"]) == 0
    assert (records.run_dir("smoke", "adamw", 0, tmp_path / "runs") / "summary.json").exists()


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


def test_a_huge_sparse_summary_is_refused_before_it_is_read(sealed_run, tmp_path):
    """Planted: summary.json grown to one byte past the bound (a sparse file: no disk, no memory until read)."""
    d = tmp_path / "smoke" / "adamw"  # a record is read from its own folder
    shutil.copytree(sealed_run, d)
    records.load(d)  # the control
    os.truncate(d / "summary.json", records.MAX_JSON_BYTES + 1)
    with pytest.raises(records.Refused, match="more than"):
        records.load(d)


def test_a_gzip_bomb_of_rows_is_refused_at_the_bound(sealed_run, tmp_path, monkeypatch):
    """Planted: rows that decompress to 8x the bound, listed in a resealed summary; reading stops at the bound."""
    d = tmp_path / "smoke" / "adamw"  # a record is read from its own folder
    shutil.copytree(sealed_run, d)
    monkeypatch.setattr(records, "MAX_ROWS_BYTES", 2**16)
    records.load(d)  # the control: the real rows are under it
    (d / records.ROWS_FILE).write_bytes(gzip.compress(b"0" * 2**19))
    relist(d)
    with pytest.raises(records.Refused, match="once decompressed"):
        records.load(d)


def test_a_model_file_past_the_bound_is_refused_before_it_is_read_or_hashed(sealed_run, tmp_path, capsys):
    """Planted: model.pt grown to exactly 2 GiB (sparse; the bound is under 2 GiB) and listed with that size in a
    resealed summary."""
    d = tmp_path / "run"
    shutil.copytree(sealed_run, d)
    assert records.MAX_TENSOR_BYTES + 1 == 2**31
    os.truncate(d / "model.pt", 2**31)
    summary = json.loads((d / "summary.json").read_text())
    summary["files"]["model.pt"]["bytes"] = 2**31
    summary["seal"] = records.seal_of(summary)
    (d / "summary.json").write_text(json.dumps(summary))
    assert main(["audit", "--run", str(d), "--json", "--layer", "1"]) == 2
    assert "more than" in _one_error_line(capsys)


def test_a_head_analysis_the_seal_does_not_list_is_refused(sealed_run, tmp_path):
    """Planted: a heads.json beside a sealed record whose file list does not name it."""
    d = tmp_path / "smoke" / "adamw"  # a record is read from its own folder
    shutil.copytree(sealed_run, d)
    summary = json.loads((d / "summary.json").read_text())
    summary["files"].pop("heads.json", None)
    summary["seal"] = records.seal_of(summary)
    (d / "summary.json").write_text(json.dumps(summary))
    (d / "heads.json").unlink(missing_ok=True)
    records.load(d)  # the control: no heads.json, none listed
    (d / "heads.json").write_text(json.dumps({"importance": [[1.0]]}))
    with pytest.raises(records.Refused, match="not listed"):
        records.load(d)


def test_terminal_escapes_in_a_records_summary_never_reach_the_terminal(sealed_run, tmp_path, capsys):
    """Planted: a record (resealed) whose precision, device and machine carry escape sequences. What the commands
    print from it (a claim's reason and the line it depends on, the scale a chapter names) is escaped."""
    from attnid.cli.claims import _print_claims
    from attnid.lm.analysis import scale_label

    d = tmp_path / "smoke" / "adamw"
    shutil.copytree(sealed_run, d)
    planted = "x\x1b]0;owned\x07\x1b[2J"
    summary = json.loads((d / "summary.json").read_text())
    for key in ("precision", "device", "machine"):
        summary[key] = planted
    summary["seal"] = records.seal_of(summary)
    (d / "summary.json").write_text(json.dumps(summary))
    assert "owned" in scale_label(records.load(d)) and "\x1b" not in scale_label(records.load(d))
    assert main(["claims", "--profile", "smoke", "--runs", str(tmp_path), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    rows[0].update(reason=f"trained at precision {planted}", depends_on=planted)
    _print_claims(rows[:1])
    out = capsys.readouterr().out
    assert "owned" in out and "\x1b" not in out and "\x07" not in out


def test_a_model_file_outside_a_sealed_record_is_refused(sealed_run, tmp_path, capsys):
    d = tmp_path / "run"
    shutil.copytree(sealed_run, d)
    (d / "summary.json").unlink()
    assert main(["audit", "--run", str(d)]) == 2
    assert "no sealed summary.json" in _one_error_line(capsys)


# ------------------------------------------------------------------------------ silent wrong results, ignored inputs
def _gpt2_checkpoint(tmp_path, capsys):
    from test_checkpoints import save, tiny

    d = save(tiny("gpt2")[1], tmp_path / "ckpt")
    capsys.readouterr()  # save_pretrained's progress bar
    return d


def test_a_checkpoint_with_missing_weights_is_refused_naming_them(tmp_path, capsys):
    """transformers fills a missing tensor with a random initialisation; audited, it read as a trained layer at a
    generic point. Weights lacking from the file (here layer 1's attention) refuse the audit, named."""
    pytest.importorskip("transformers")
    from safetensors.torch import load_file, save_file

    d = _gpt2_checkpoint(tmp_path, capsys)
    weights = load_file(d / "model.safetensors")
    save_file({k: v for k, v in weights.items() if ".h.0.attn." not in k}, d / "model.safetensors", {"format": "pt"})
    assert main(["audit", "--checkpoint", str(d), "--json"]) == 2
    line = _one_error_line(capsys)
    assert "lacks the weights" in line and "h.0.attn.c_attn" in line


def test_a_checkpoint_with_weights_that_are_not_finite_is_refused(tmp_path, capsys):
    pytest.importorskip("transformers")
    from safetensors.torch import load_file, save_file

    d = _gpt2_checkpoint(tmp_path, capsys)
    weights = load_file(d / "model.safetensors")
    weights["transformer.h.1.attn.c_proj.weight"][0, 0] = float("inf")
    save_file(weights, d / "model.safetensors", {"format": "pt"})
    assert main(["audit", "--checkpoint", str(d), "--json"]) == 2
    assert "not finite in transformer.h.1.attn.c_proj.weight" in _one_error_line(capsys)


def test_a_checkpoints_remote_code_is_never_imported(tmp_path, capsys):
    """Planted: an ``auto_map`` naming a configuration module of the checkpoint's own that would create a file when
    imported; the audit reads the family its model_type names, and the file never appears."""
    pytest.importorskip("transformers")
    d = _gpt2_checkpoint(tmp_path, capsys)
    marker = tmp_path / "ran"
    (d / "configuration_evil.py").write_text(
        f"open({str(marker)!r}, 'w').close()\nfrom transformers import GPT2Config as Evil\n"
    )
    cfg = json.loads((d / "config.json").read_text())
    cfg["auto_map"] = {"AutoConfig": "configuration_evil.Evil", "AutoModelForCausalLM": "configuration_evil.Evil"}
    (d / "config.json").write_text(json.dumps(cfg))
    assert main(["audit", "--checkpoint", str(d), "--json", "--layer", "1"]) == 0
    assert not marker.exists()


def test_a_pickled_weight_file_never_runs_its_code(tmp_path, capsys):
    """Planted: the safetensors replaced by a ``pytorch_model.bin`` whose pickle would create a file; refused (or
    read without running code), and the file never appears."""
    pytest.importorskip("transformers")
    d = _gpt2_checkpoint(tmp_path, capsys)
    marker = tmp_path / "ran"
    (d / "model.safetensors").unlink()
    hostile_pickle(d / "pytorch_model.bin", marker)
    assert main(["audit", "--checkpoint", str(d), "--json"]) == 2
    _one_error_line(capsys)
    assert not marker.exists()


def test_a_weight_index_that_leaves_the_folder_is_refused(tmp_path, capsys):
    pytest.importorskip("transformers")
    import json

    d = _gpt2_checkpoint(tmp_path, capsys)
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"lm_head.weight": "../other.bin"}}))
    assert main(["audit", "--checkpoint", str(d)]) == 2
    assert "outside its folder: ../other.bin" in _one_error_line(capsys)


def test_a_checkpoint_too_large_for_the_memory_is_refused_before_loading(tmp_path, capsys, monkeypatch):
    pytest.importorskip("transformers")
    from attnid import checkpoints

    d = _gpt2_checkpoint(tmp_path, capsys)
    loaded = []
    monkeypatch.setattr(checkpoints, "_check_loaded", lambda *a: loaded.append(a))
    assert main(["audit", "--checkpoint", str(d), "--max-memory", "1e-6"]) == 2
    assert "more than the" in _one_error_line(capsys) and not loaded  # refused before from_pretrained


def test_a_model_file_whose_config_declares_another_model_is_refused_before_building(sealed_run, tmp_path, capsys):
    """A 100 KB model.pt that declares a 3 GB model: its tensors do not fit its gpt_config, refused before GPT(...)
    allocates anything; an unknown config key and non-finite weights likewise, each one line naming the file."""
    d = tmp_path / "run"
    shutil.copytree(sealed_run, d)
    f = d / "model.pt"
    good = records.load_tensors(f.read_bytes(), f)
    plants = [
        ({**good, "gpt_config": {**good["gpt_config"], "n_embd": 16384, "n_layer": 48}}, "do not fit its gpt_config"),
        ({**good, "gpt_config": {**good["gpt_config"], "flash": True}}, "not a model's"),
        ({**good, "model": {**good["model"], "blocks.0.attn.c_attn.weight": torch.full((48, 16), float("nan"))}},
         "not finite"),
        ({**good, "gpt_config": {**good["gpt_config"], "n_layer": 100_000}}, "n_layer = 100000, its weights hold 2"),
        ({**good, "gpt_config": {**good["gpt_config"], "vocab_size": 2**62}}, "do not fit its gpt_config"),
        ({**good, "gpt_config": {**good["gpt_config"], "n_head": "2"}}, "not a model's (field n_head = 2)"),
        ({**good, "gpt_config": {**good["gpt_config"], "bias": 1}}, "not a model's (field bias = 1)"),
    ]  # fmt: skip
    for ck, word in plants:
        torch.save(ck, f)
        relist(d)
        assert main(["audit", "--run", str(d), "--json"]) == 1
        line = _one_error_line(capsys)
        assert str(f) in line and word in line, line


@pytest.mark.parametrize(
    "plant, word",
    [
        (lambda s: s.__setitem__(0, {"x": torch.zeros(1)}), "snapshot of step 0 do not fit"),
        (lambda s: s[0].__setitem__(next(iter(s[0])), next(iter(s[0].values())) * float("nan")), "not finite"),
        (lambda s: s.__setitem__("0", s.pop(0)), "not a dict of steps"),
        (lambda s: s.__setitem__(0, {k: v.repeat(64, 1) for k, v in s[0].items()}), "do not fit"),
        # more snapshots than the run has evaluations, each the same small tensors: counted before any is checked
        (lambda s: s.update({10_000 + i: s[0] for i in range(2_000)}), "snapshots, more than the"),
    ],
)
def test_the_snapshots_of_a_model_file_are_checked_like_its_weights(sealed_run, tmp_path, plant, word):
    """Planted: one snapshot of another shape (a 64x larger one among them), with a NaN, or keyed by a string, in a
    resealed model.pt: refused before any model is built from it (chapter 10's claims read them)."""
    from attnid.lm.model_files import load_snapshots

    d = tmp_path / "run"
    shutil.copytree(sealed_run, d)
    f = d / "model.pt"
    ck = records.load_tensors(f.read_bytes(), f)
    assert load_snapshots(d)[1].keys() == ck["snapshots"].keys()  # the control
    plant(ck["snapshots"])
    torch.save(ck, f)
    relist(d)
    with pytest.raises(records.RecordError, match=word):
        load_snapshots(d)


@pytest.mark.parametrize(
    "change, word",
    [
        ({"num_key_value_heads": 0}, "num_key_value_heads: 0 must be a positive integer"),
        ({"head_dim": 0}, "head_dim: 0 must be a positive integer"),
        ({"query_pre_attn_scalar": -1}, "query_pre_attn_scalar = -1"),
        ({"final_logit_softcapping": 0.0}, "final_logit_softcapping = 0.0"),
    ],
)
def test_a_zero_in_a_config_is_refused_not_read_as_its_default(tmp_path, capsys, change, word):
    """``x or default`` read 0 heads as H and a head size of 0 as E/H; each is now refused by name."""
    pytest.importorskip("transformers")
    import json

    from attnid.configs import CONFIG_DIR

    cfg = json.loads((CONFIG_DIR / "gemma-2-9b.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, **change}))
    assert main(["count", "--config", str(tmp_path)]) == 2
    assert word in _one_error_line(capsys)


def test_a_routed_scaling_factor_of_zero_is_refused(tmp_path, capsys):
    """DeepSeek-V3's routed experts are scaled by routed_scaling_factor: 0 zeroes their output, no harmless scale."""
    pytest.importorskip("transformers")
    import json

    from attnid.configs import CONFIG_DIR

    cfg = json.loads((CONFIG_DIR / "deepseek-v3.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "routed_scaling_factor": 0.0}))
    assert main(["count", "--config", str(tmp_path)]) == 2
    assert "routed_scaling_factor = 0.0 (a factor of 0 zeroes every routed expert's output)" in _one_error_line(capsys)


def test_gpt2_n_inner_zero_is_refused(tmp_path, capsys):
    pytest.importorskip("transformers")
    import json

    from attnid.configs import CONFIG_DIR

    cfg = json.loads((CONFIG_DIR / "gpt2.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "n_inner": 0}))
    assert main(["count", "--config", str(tmp_path), "--scope", "model"]) == 2
    assert "n_inner: 0 must be a positive integer" in _one_error_line(capsys)


def test_strings_from_a_users_file_are_printed_escaped_and_cut(tmp_path, capsys):
    """A config's source and an unknown field's value reach the terminal escaped (no escape sequence runs) and
    cut (a 300 MB field is not echoed whole)."""
    pytest.importorskip("transformers")
    import json

    from attnid.configs import CONFIG_DIR

    cfg = json.loads((CONFIG_DIR / "llama-2-7b.json").read_text())
    cfg["_attnid"] = {"source": "\x1b[31mred\x1b[0m"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert main(["count", "--config", str(tmp_path), "--scope", "model"]) == 0  # its header names the source
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\\x1b[31mred" in out
    cfg["mlp_bias"] = "\x1b[2J" + "x" * 1_000_000  # a field Llama's code reads, of the wrong kind
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert main(["count", "--config", str(tmp_path)]) == 2
    line = _one_error_line(capsys)
    assert "mlp_bias" in line and len(line) < 2000 and "\x1b" not in line
    del cfg["mlp_bias"]
    cfg["\x1b[2J" + "y" * 1_000_000] = 1  # a field no code reads, named by an escape and a megabyte
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert main(["count", "--config", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and len(out) < 10_000 and "not read" in out, out


def test_deeply_nested_json_is_one_line(tmp_path, capsys):
    (tmp_path / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    assert main(["count", "--config", str(tmp_path)]) == 2
    assert "nests its JSON too deeply" in _one_error_line(capsys)


@pytest.mark.parametrize("seed", ["-1", "100000000000000000000"])
def test_audit_run_checks_its_seed_as_every_command_does(sealed_run, capsys, seed):
    assert main(["audit", "--run", str(sealed_run), "--seed", seed]) == 2
    assert "seed must be an integer from 0 to 2**63 - 1" in _one_error_line(capsys)


def test_a_fifo_as_model_file_is_refused_not_waited_on(sealed_run, tmp_path, capsys):
    import os

    d = tmp_path / "run"
    shutil.copytree(sealed_run, d)
    (d / "model.pt").unlink()
    os.mkfifo(d / "model.pt")
    assert main(["audit", "--run", str(d)]) == 1
    line = _one_error_line(capsys)
    assert str(d / "model.pt") in line and "not a regular file" in line


@pytest.mark.parametrize("layer_type", ["sliding_attention", "full_attention"])
def test_every_layer_types_rope_is_checked(tmp_path, capsys, layer_type):
    """Gemma 3's sliding layers have their own RoPE: a base of 1 there (every pair at one frequency: 84
    unidentified directions, not 72) is refused as it is on the full-attention layers."""
    pytest.importorskip("transformers")
    import json

    from attnid.configs import CONFIG_DIR

    cfg = json.loads((CONFIG_DIR / "gemma-3-12b.json").read_text())
    cfg.pop("rope_local_base_freq", None)
    text = cfg.get("text_config", cfg)
    rope = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}}  # fmt: skip
    rope[layer_type]["rope_theta"] = 1.0
    text["rope_parameters"] = rope
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert main(["count", "--config", str(tmp_path)]) == 2
    assert f"rope_parameters['{layer_type}']: rope_theta 1.0 must be a positive number other than 1" in (
        _one_error_line(capsys)
    )


def _windowed_rank(window: int, E: int = 8, H: int = 2, L: int = 10) -> tuple[int, int]:
    """``(params, unidentified)`` of causal attention with all biases whose queries see the last ``window`` tokens,
    from the rank of its Jacobian at random weights and inputs (float64)."""
    D = E // H
    g = torch.Generator().manual_seed(0)
    shapes = {"Wq": (H, D, E), "Wk": (H, D, E), "Wv": (H, D, E), "Wo": (E, H * D), "bq": (H, D), "bk": (H, D),
              "bv": (H, D), "bo": (E,)}  # fmt: skip
    sizes = {k: int(torch.Size(v).numel()) for k, v in shapes.items()}
    theta = torch.randn(sum(sizes.values()), generator=g, dtype=torch.float64) / E**0.5
    X = torch.randn(6, L, E, generator=g, dtype=torch.float64)
    i = torch.arange(L)
    allowed = (i[:, None] >= i[None, :]) & (i[:, None] - i[None, :] < window)

    def f(t):
        p = dict(zip(shapes, (part.reshape(shapes[k]) for k, part in zip(shapes, t.split(list(sizes.values()))))))
        q, k, v = (torch.einsum("hde,ble->bhld", p[f"W{c}"], X) + p[f"b{c}"][None, :, None] for c in "qkv")
        s = (q @ k.transpose(-1, -2) / D**0.5).masked_fill(~allowed, float("-inf"))
        y = (s.softmax(-1) @ v).transpose(1, 2).reshape(6, L, H * D)
        return (y @ p["Wo"].T + p["bo"]).reshape(-1)

    s = torch.linalg.svdvals(torch.func.jacfwd(f)(theta))
    return theta.numel(), theta.numel() - int((s > 1e-9 * s[0]).sum())


def test_a_sliding_window_of_two_tokens_keeps_the_count_and_one_is_refused(tmp_path, capsys):
    """A window of at least two tokens leaves the count of full causal attention (the Jacobian's rank says so);
    a window of one token makes every query and key weight unidentified, so such a config is refused by name."""
    pytest.importorskip("transformers")
    import json

    from attnid.attention import AttentionConfig
    from attnid.configs import CONFIG_DIR, MIN_WINDOW
    from attnid.counting import count

    full = count(AttentionConfig(8, 2, bias="all", causal=True)).unidentified
    assert [_windowed_rank(w)[1] for w in (MIN_WINDOW, 3, 10)] == [full] * 3
    assert _windowed_rank(1)[1] > full
    cfg = json.loads((CONFIG_DIR / "mistral-7b.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "sliding_window": 1}))
    assert main(["count", "--config", str(tmp_path)]) == 2
    assert "sliding_window = 1 (a window of one token" in _one_error_line(capsys)
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "sliding_window": 2}))
    assert main(["count", "--config", str(tmp_path)]) == 0


@pytest.mark.parametrize(
    "field, value, word",
    [
        ("sliding_window", 1, "field sliding_window sits beside text_config"),
        ("rope_local_base_freq", 1.0, "field rope_local_base_freq sits beside text_config"),
        ("anything_else", "x", "field anything_else sits beside text_config"),
        ("hidden_size", 64, "field hidden_size sits beside text_config"),
    ],
)
def test_a_text_field_beside_a_multimodal_text_config_is_refused(tmp_path, capsys, field, value, word):
    """Planted: a field of the text model at the top of a multimodal Gemma 3 file, where transformers does not read
    it; refused by name instead of silently ignored. The released file as shipped is counted (the control). The
    tying beside text_config is the multimodal class's own field, read (tests/test_families.py)."""
    pytest.importorskip("transformers")
    from attnid.configs import CONFIG_DIR

    cfg = json.loads((CONFIG_DIR / "gemma-3-12b.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert main(["count", "--config", str(tmp_path)]) == 0
    capsys.readouterr()
    cfg[field] = value
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert main(["count", "--config", str(tmp_path)]) == 2
    assert word in _one_error_line(capsys)


def test_the_temporary_files_of_a_killed_write_are_removed_when_the_run_resumes(interrupted_run, tmp_path, monkeypatch):
    """Planted: the temporary files that ``kill -9`` leaves at each write of a run folder (rows, checkpoint,
    summary, model), beside a stopped run; resuming it removes them, and a file of the user's stays."""
    shutil.copytree(interrupted_run, tmp_path / "runs")
    d = records.run_dir("smoke", "adamw", 0, tmp_path / "runs")
    planted = [d / f".{name}.x1y2z3.tmp" for name in ("metrics.jsonl.gz", "checkpoint.pt", "summary.json", "model.pt")]
    for f in planted:
        f.write_bytes(b"half a write")
    (d / "notes.txt").write_text("mine")
    monkeypatch.setenv("ATTNID_RUNS", str(tmp_path / "runs"))
    assert main(["train", "--profile", "smoke", "--case", "adamw", "--device", "cpu", "--json"]) == 0
    assert [f for f in planted if f.exists()] == [] and (d / "notes.txt").read_text() == "mine"


def test_a_count_tables_columns_never_run_together(capsys):
    """At a width whose counts have 17 digits and more, each row of the table still reads as three columns, and the
    numbers stay right-aligned under their headers."""
    assert main(["count", "--embed", "1000000", "--heads", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    table = lines[lines.index(next(x for x in lines if x.startswith("block"))) :][:6]
    assert all(len(line.split()) == 3 for line in table), table
    assert len({len(line) for line in table}) == 1  # right-aligned: every row ends at the same column


def _published_copy(sealed_run, tmp_path):
    """A copy of a sealed record in a folder of its own name, as the committed ones sit."""
    import shutil

    d = tmp_path / "smoke" / sealed_run.name
    shutil.copytree(sealed_run, d)
    return d


@pytest.mark.parametrize("plant", ["dotdot", "symlink", "broken seal"])
def test_publishing_copies_only_a_verified_records_listed_files_never_through_a_link(sealed_run, tmp_path, plant):
    """tools/publish.py: a listed `..` name (the checkout's files onto the site), a listed file that is a symbolic
    link (/proc/self/environ), a record whose seal fails: each is refused, and nothing of it is copied."""
    import json

    from booktool import tool
    from plants import relist

    publish = tool("publish")
    d = _published_copy(sealed_run, tmp_path)
    copied = publish.publish_record(d, tmp_path / "site" / "ok")  # the control: a record that verifies
    assert "summary.json" in copied and "model.pt" not in copied
    summary = json.loads((d / "summary.json").read_text())
    if plant == "dotdot":
        (tmp_path / "secret.txt").write_text("token")
        summary["files"]["../../secret.txt"] = records.file_entry(tmp_path / "secret.txt")
        summary["seal"] = records.seal_of(summary)
        (d / "summary.json").write_text(json.dumps(summary))
    elif plant == "symlink":
        (d / "config.json").rename(tmp_path / "real_config.json")
        (d / "config.json").symlink_to(tmp_path / "real_config.json")
        relist(d)
    else:
        summary["final_val_loss"] = 0.0
        (d / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(publish.PublishError):
        publish.publish_record(d, tmp_path / "site" / "planted")
    assert not (tmp_path / "site" / "planted").exists()


def test_the_site_carries_the_runs_of_the_profile_it_was_built_at(sealed_run, tmp_path, monkeypatch):
    """A chapter launched from the published site reads the build's own runs (cpu: half an hour of training on 2
    cores) instead of training them again: they ride along beside the committed ones, sealed files only."""
    from booktool import tool

    build = tmp_path / "build" / "smoke"
    (build / "_build" / "html").mkdir(parents=True)
    (build / "_generated").mkdir()
    monkeypatch.setenv("ATTNID_RUNS", str(sealed_run.parent.parent))
    site = tool("publish").prepare(build, "https://github.com/o/r", "0" * 40)
    published = site / "data" / "runs" / "smoke" / sealed_run.name
    assert (published / "summary.json").is_file() and not (published / "model.pt").exists()
    assert "the smoke runs the book was built with" in (site / "start").read_text()
