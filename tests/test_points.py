"""Trained points: an attention layer audited at given weights on the inputs its LayerNorm gives it."""

import io

import pytest
import torch
from plants import relist

from attnid.counting import collapsed_query_dims
from attnid.lm.gpt import GPT, GPTConfig
from attnid.lm.points import audit_point, layer_params


@pytest.fixture(scope="module")
def model_and_tokens():
    torch.manual_seed(0)
    m = GPT(GPTConfig(block_size=8, n_layer=2, n_head=2, n_embd=16, vocab_size=65)).double()
    tokens = torch.randint(65, (12, 8), generator=torch.Generator().manual_seed(1))
    return m, tokens


def test_a_random_init_sits_at_the_generic_count(model_and_tokens):
    m, tokens = model_and_tokens
    for layer in (1, 2):  # numbered from 1
        r = audit_point(m, tokens, layer)
        assert r["at_generic"] and r["unidentified"] == r["generic"] == 336 and r["gap"] > 1e4


@pytest.mark.parametrize("rank", [0, 1])
def test_a_collapsed_query_map_adds_exactly_the_closed_forms_directions(model_and_tokens, rank):
    m0, tokens = model_and_tokens
    m = GPT(m0.cfg).double()
    m.load_state_dict(m0.state_dict())
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        attn = m.blocks[1].attn
        D = attn.head_dim
        plant = torch.zeros(D, 16, dtype=torch.float64)
        if rank == 1:
            plant = torch.outer(
                torch.randn(D, generator=g, dtype=torch.float64), torch.randn(16, generator=g, dtype=torch.float64)
            )
        attn.c_attn.weight[:D] = plant  # head 0's query map
        attn.c_attn.bias[:D] = 0
    cfg, _ = layer_params(m.blocks[1].attn)
    r = audit_point(m, tokens, 2)  # blocks[1]: the second layer
    assert r["unidentified"] - r["generic"] == collapsed_query_dims(cfg, rank, hyperplane_inputs=True) > 0
    c = audit_point(m, tokens, 2, method="certify")  # the certificate refuses a special point
    assert not c["at_generic"] and c["note"].startswith("not certified")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, corpus):
    """A finished smoke run of a narrow model (E = 16, H = 2, two layers) that kept its weights."""
    from attnid.lm.profiles import make_config
    from attnid.lm.records import run_dir
    from attnid.lm.train import train

    base = tmp_path_factory.mktemp("runs")
    cfg = make_config("smoke", "adamw", n_embd=16, n_head=2, block_size=8, max_iters=20, save_model=True)
    train(cfg, out=base, data=corpus, progress=False)
    return run_dir("smoke", "adamw", 0, base)


def test_audit_run_gives_the_generic_count_at_every_layer(tiny_run, capsys):
    import json

    from attnid.cli import main

    assert main(["audit", "--run", str(tiny_run), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["layer"] for r in out["layers"]] == [1, 2]
    for r in out["layers"]:
        assert r["at_generic"] and r["unidentified"] == r["generic"] == 336 and r["gap"] > 1e4
        assert 0 < r["weakest"] < 1 and r["method"] == "dense"
    assert main(["audit", "--run", str(tiny_run), "--layer", "2"]) == 0
    text = capsys.readouterr().out
    assert "layer 2" in text and "layer 1" not in text and "every layer at a generic point" in text


def test_audit_run_sees_a_planted_collapsed_head(tiny_run, tmp_path, capsys):
    import json
    import shutil

    from attnid.cli import main

    planted = tmp_path / "planted"
    shutil.copytree(tiny_run, planted)
    ck = torch.load(planted / "model.pt", weights_only=False)
    D = 8
    ck["model"]["blocks.0.attn.c_attn.weight"][:D] = 0.0  # head 0's query map of layer 1 collapsed to rank 0
    ck["model"]["blocks.0.attn.c_attn.bias"][:D] = 0.0
    torch.save(ck, planted / "model.pt")
    relist(planted)  # the plant made to pass the seal: the audit reads it
    assert main(["audit", "--run", str(planted), "--json", "--method", "dense"]) == 0
    l0, l1 = json.loads(capsys.readouterr().out)["layers"]
    cfg = GPTConfig(block_size=8, n_layer=2, n_head=2, n_embd=16).attention_config()
    assert l0["unidentified"] - l0["generic"] == collapsed_query_dims(cfg, 0, hyperplane_inputs=True) == 56
    assert not l0["at_generic"] and l1["at_generic"]


@pytest.mark.parametrize(
    "args, word",
    [
        (["--layer", "3"], "layer must be an integer from 1 to 2"),
        (["--layer", "0"], "layer must be an integer from 1 to 2"),
        (["--layer", "-1"], "layer must be an integer from 1 to 2"),
        (["--embed", "8"], "--embed cannot be combined with --run"),
        (["--hf", "llama"], "--hf cannot be combined with --run"),
        (["--seq-len", "0"], "--seq-len cannot be combined with --run"),
    ],
)
def test_audit_run_refuses_by_name(tiny_run, args, word, capsys):
    from attnid.cli import main

    assert main(["audit", "--run", str(tiny_run), *args]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and word in lines[0]


def test_audit_refuses_a_layer_without_a_run_and_a_run_without_weights(tmp_path, capsys):
    from attnid.cli import main

    assert main(["audit", "--embed", "8", "--heads", "2", "--layer", "0"]) == 2
    assert "give --run or --checkpoint" in capsys.readouterr().err
    assert main(["audit", "--run", str(tmp_path)]) == 1  # a missing file, not a bad flag
    assert "no trained model" in capsys.readouterr().err


def test_audit_run_keeps_its_audits_for_this_model(tiny_run, tmp_path, corpus, monkeypatch):
    import shutil

    from attnid.lm import points

    d = tmp_path / "run"
    shutil.copytree(tiny_run, d)
    first = points.audit_run(d, corpus, layers=[2], cache=True)
    computed = []
    monkeypatch.setattr(points, "audit_point", lambda *a, **k: computed.append(a[2]) or {"layer": a[2]})
    assert points.audit_run(d, corpus, layers=[2], cache=True) == first and computed == []  # reused
    points.audit_run(d, corpus, cache=True)
    assert computed == [1]  # only the layer not yet audited
    ck = torch.load(d / "model.pt", weights_only=False)
    ck["model"]["blocks.1.attn.c_proj.bias"] += 1.0
    torch.save(ck, d / "model.pt")
    relist(d)
    points.audit_run(d, corpus, layers=[2], cache=True)
    assert computed == [1, 2]  # another model.pt: audited again


@pytest.mark.parametrize("reader", ["audit_run", "snapshot_distances"])
def test_the_cache_key_names_the_bytes_that_were_read(reader, tiny_run, tmp_path, corpus, monkeypatch):
    """model.pt is read once: a file swapped for another sealed model right after it was read leaves the cache
    entry keyed by the digest of the weights computed on, not by the swapped file's (a second read for the key
    would name the new file and hand its audits to the old weights)."""
    import hashlib
    import json
    import shutil

    from attnid.lm import points, records

    d = tmp_path / "run"
    shutil.copytree(tiny_run, d)
    monkeypatch.setattr(points, "audit_point", lambda model, tokens, k, **kw: {"layer": k})
    monkeypatch.setattr(points, "orbit_distance", lambda a, b, k: (0.0, 0.0))
    read: list[str] = []
    real_read = records.sealed_bytes

    def read_then_swap(folder, name):
        data, digest = real_read(folder, name)
        if name != "model.pt":  # the run's config (how many snapshots it takes), read apart
            return data, digest
        read.append(hashlib.sha256(data).hexdigest())
        ck = torch.load(io.BytesIO(data), weights_only=False)
        ck["model"]["blocks.1.attn.c_proj.bias"] += 1.0
        torch.save(ck, d / "model.pt")
        relist(d)
        return data, digest

    monkeypatch.setattr(records, "sealed_bytes", read_then_swap)
    if reader == "audit_run":
        points.audit_run(d, corpus, layers=[1], cache=True)
    else:
        points.snapshot_distances(d, points=1, cache=True)
    (key,) = json.loads((d / points.POINTS_FILE).read_text())
    assert len(read) == 1 and key.split("/")[0] == read[0] != records.file_entry(d / "model.pt")["sha256"]


def test_a_folder_that_cannot_be_written_keeps_no_audits_and_says_so_once(
    tiny_run, tmp_path, corpus, monkeypatch, capsys
):
    """A read-only copy of the records (the tests run as root, so the write is refused by a plant): the audits are
    computed and returned, nothing is kept, and one note (not one per layer) names the file."""
    import shutil

    from attnid.lm import points, records

    d = tmp_path / "run"
    shutil.copytree(tiny_run, d)
    monkeypatch.setattr(points, "audit_point", lambda model, tokens, k, **kw: {"layer": k})

    def refused(path, data):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(records, "atomic_write", refused)
    assert points.audit_run(d, corpus, cache=True) == [{"layer": 1}, {"layer": 2}]
    err = capsys.readouterr().err
    assert err.count("cannot keep audits") == 1 and f"{d / points.POINTS_FILE} (Permission denied)" in err
    assert not (d / points.POINTS_FILE).exists()


def test_motion_rows_are_kept_for_this_model_and_this_fit(tiny_run, tmp_path, monkeypatch):
    """The orbit fits are kept in points.json under the model's digest and the fit's version: reused by the next
    call; rows that an earlier fit left (planted under the old key, without the version) are refitted."""
    import json
    import shutil

    from attnid.lm import points
    from attnid.lm.data import sha256

    d = tmp_path / "run"
    shutil.copytree(tiny_run, d)
    first = points.snapshot_distances(d, points=1, cache=True)
    fits: list[int] = []
    real_fit = points.orbit_distance
    monkeypatch.setattr(points, "orbit_distance", lambda a, b, k: fits.append(k) or real_fit(a, b, k))
    assert points.snapshot_distances(d, points=1, cache=True) == first and fits == []  # reused
    kept = json.loads((d / points.POINTS_FILE).read_text())
    key = f"{sha256(d / 'model.pt')}/motion/{points.FIT_VERSION}"
    assert set(kept) == {key}
    stale = {step_layer: {**row, "orbit": 123.0} for step_layer, row in kept[key]["rows"].items()}
    old_key = f"{sha256(d / 'model.pt')}/motion"  # an older fit's rows, sealed as they were kept
    (d / points.POINTS_FILE).write_text(
        json.dumps({old_key: {"seal": points._points_seal(old_key, stale), "rows": stale}})
    )
    again = points.snapshot_distances(d, points=1, cache=True)
    assert fits == [0, 1] and 123.0 not in {r["orbit"] for r in again}
    assert again == first  # the same fit of the same weights


def test_motion_along_the_symmetry_is_undone_by_the_orbit_fit(tiny_run, tmp_path):
    import shutil

    from attnid.lm.model_files import load_snapshots
    from attnid.lm.points import model_from_snapshot, snapshot_distances
    from attnid.lm.train import rebalance_model

    rows = snapshot_distances(tiny_run)
    assert sorted({r["step"] for r in rows}) == [0, 1, 20] and {r["layer"] for r in rows} == {1, 2}
    for r in rows:
        if r["step"] == 0:
            assert r["raw"] == r["orbit"] == r["invariant"] == 0
        else:
            assert 0 < r["orbit"] <= r["raw"] and r["invariant"] > 1e-4
    assert sorted({r["step"] for r in snapshot_distances(tiny_run, points=1)}) == [0, 20]  # the last one kept
    # planted: the last snapshot replaced by the first one moved along the symmetry only
    d = tmp_path / "run"
    shutil.copytree(tiny_run, d)
    cfg, snaps, _digest = load_snapshots(d)
    m = model_from_snapshot(cfg, snaps[0])
    with torch.no_grad():
        m.blocks[0].attn.c_attn.bias.uniform_(-0.5, 0.5)  # off the zero-bias init, where rebalancing is trivial
    snaps[0] = {k: v.float() for k, v in m.state_dict().items() if k in snaps[0]}
    rebalance_model(m)
    with torch.no_grad():  # and the LayerNorm's scale traded into the maps that read it
        m.blocks[1].ln_1.weight.mul_(2.0)
        m.blocks[1].ln_1.bias.mul_(2.0)
        m.blocks[1].attn.c_attn.weight.div_(2.0)
    snaps[20] = {k: v.float() for k, v in m.state_dict().items() if k in snaps[20]}
    ck = torch.load(d / "model.pt", weights_only=False)
    ck["snapshots"] = snaps
    torch.save(ck, d / "model.pt")
    relist(d)
    last = [r for r in snapshot_distances(d) if r["step"] == 20]
    assert all(r["raw"] > 0.05 and r["orbit"] < 1e-5 * r["raw"] and r["invariant"] < 1e-6 for r in last), last


def test_the_orbit_fit_undoes_each_symmetry_and_not_an_identified_move():
    from attnid.lm.points import identified_moves, orbit_distance, symmetry_moves

    torch.manual_seed(0)
    m = GPT(GPTConfig(block_size=8, n_layer=2, n_head=2, n_embd=8, vocab_size=11)).double()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.3 * torch.randn_like(p))
    for name, b in symmetry_moves(m).items():
        for k in (0, 1):
            raw, orbit = orbit_distance(m, b, k)
            assert orbit <= 1e-6 * max(raw, 1.0), (name, k, raw, orbit)
        assert max(orbit_distance(m, b, k)[0] for k in (0, 1)) > 0.1, name  # the weights did move
    for name, b in identified_moves(m).items():  # planted: a change of the function stays at a distance
        raw, orbit = orbit_distance(m, b, 0)
        assert 0.3 * raw < orbit <= raw, (name, raw, orbit)


def test_the_narrow_width_names_its_layer_size():
    """Chapter 10 (and the profile's comment) give the audited layer's size: c_attn and c_proj with biases."""
    from pathlib import Path

    from attnid.lm.points import flatten
    from attnid.lm.profiles import POINTS_WIDTH

    m = GPT(GPTConfig(block_size=8, n_layer=1, **POINTS_WIDTH))
    n = flatten(layer_params(m.blocks[0].attn)[1]).numel()
    root = Path(__file__).resolve().parents[1]
    assert n == 1088 and f"{n:,} parameters a layer" in (root / "notebooks" / "10_your_model.py").read_text()


def test_a_hand_edited_audit_in_the_cache_is_recomputed(tiny_run, tmp_path, corpus):
    """points.json keeps each entry sealed: an audit edited by hand (one more unidentified direction, as if the
    layer sat at a special point) breaks its seal and is recomputed, not read."""
    import json
    import shutil

    from attnid.lm import points

    d = tmp_path / "run"
    shutil.copytree(tiny_run, d)
    (row,) = points.audit_run(d, corpus, layers=[1], cache=True)
    body = json.loads((d / points.POINTS_FILE).read_text())
    (key,) = body
    body[key]["rows"]["1"]["unidentified"] += 5
    body[key]["rows"]["1"]["at_generic"] = False
    (d / points.POINTS_FILE).write_text(json.dumps(body))
    (again,) = points.audit_run(d, corpus, layers=[1], cache=True)
    assert again["seconds"] != row["seconds"]  # recomputed, not read
    assert {k: v for k, v in again.items() if k != "seconds"} == {k: v for k, v in row.items() if k != "seconds"}


def test_two_audits_of_one_run_keep_both_layers(tmp_path):
    """Two processes auditing layers 1 and 2 of one run each write the rows they hold: the second must not drop the
    first's (the cache is merged under its lock, not replaced)."""
    from attnid.lm import points

    points._keep_points(tmp_path, "k", {"1": {"layer": 1}})  # process A
    points._keep_points(tmp_path, "k", {"2": {"layer": 2}})  # process B, which read the cache before A wrote
    assert points._read_points(tmp_path) == {"k": {"1": {"layer": 1}, "2": {"layer": 2}}}


def test_a_fifo_as_the_cache_is_not_read(tmp_path):
    import os

    from attnid.lm import points

    os.mkfifo(tmp_path / "points.json")
    assert points._read_points(tmp_path) == {}  # returns at once instead of blocking on the read


def test_the_weakest_direction_comes_with_its_data_and_a_bound_says_so(tiny_run, capsys):
    """The weakest identified direction depends on how much text the audit read: each row says how many tokens,
    and the table marks a certificate's value as the lower bound it is."""
    import json

    from attnid.cli import main

    assert main(["audit", "--run", str(tiny_run), "--json", "--layer", "1"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["layers"]
    assert row["tokens"] > 0 and row["tokens"] % 8 == 0  # whole windows of the model's context (8)
    assert main(["audit", "--run", str(tiny_run), "--layer", "1", "--method", "certify"]) == 0
    text = capsys.readouterr().out
    weakest = next(line for line in text.splitlines() if line.startswith("weakest "))
    assert "≥" in weakest and "tokens" in text
    assert main(["audit", "--run", str(tiny_run), "--layer", "1", "--method", "dense"]) == 0
    dense = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("weakest "))
    assert "≥" not in dense
