"""Chapter 10's module (attnid.chapters.yourmodel): its tables and sentences from real configs, a trained narrow
run and synthetic tables, each sentence checked against planted numbers."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from attnid.chapters import yourmodel as ch
from attnid.lm.gpt import GPT, GPTConfig
from attnid.presets import ALL_PRESETS, preset_count

pytest.importorskip("transformers")


def test_shipped_configs_count_as_their_presets():
    t = ch.table_shipped_configs()
    assert len(t) == len(ALL_PRESETS)
    for name in ("gpt2", "llama-3-8b", "deepseek-v3"):
        row = t[t["config"] == name].iloc[0]
        for scope in ("attention", "block", "model"):
            assert row[f"{scope} unidentified"] == preset_count(name, scope).unidentified
    bert = t[t["config"] == "bert-base"].iloc[0]
    assert bert["attention unidentified"] == preset_count("bert-base").unidentified and math.isnan(
        bert["block unidentified"]
    )


def test_your_config_is_read_like_a_file_and_a_block_not_modelled_is_left_out():
    fields = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2}
    t = ch.table_your_config({**fields, "intermediate_size": 128, "num_hidden_layers": 2, "vocab_size": 100})
    # GQA with G = 2 groups of D = 16 under RoPE: per group the commutant (16) and the value-output GL (16²)
    assert t.iloc[0]["attention unidentified"] == 2 * (16 + 16**2)
    # MLP biases, which Llama's code reads and attnid's Llama block does not have: the attention is still counted,
    # the block and the model are not (the command names the field)
    t = ch.table_your_config({**fields, "intermediate_size": 128, "num_hidden_layers": 2, "vocab_size": 100,
                              "mlp_bias": True})  # fmt: skip
    assert t.iloc[0]["attention unidentified"] == 2 * (16 + 16**2) and t.iloc[0]["block unidentified"] is None


def test_moves_table_separates_symmetries_from_identified_moves():
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=8, n_layer=2, n_head=2, n_embd=8, vocab_size=11))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    tokens = torch.randint(0, 11, (2, 8), generator=torch.Generator().manual_seed(0))
    t = ch.table_moves(model, tokens)
    sym, ident = t[t["kind"] == "symmetry"], t[t["kind"] == "identified"]
    assert len(sym) == 5 and len(ident) == 2
    assert (sym["invariants moved"] < 1e-10).all() and (sym["logits moved"] < 1e-10).all()
    assert (sym["weights moved"] > 1e-3).all()
    assert (ident["invariants moved"] > 1e-4).all() and (ident["logits moved"] > 1e-6).all()
    f = ch.moves_facts(t)
    assert f["n_symmetry_moves"] == 5 and f["sym_max_invariants"] < 1e-10 < f["ident_min_invariants"]


def _points(rows: list[dict]) -> pd.DataFrame:
    keys = ("case", "layer", "at_generic", "weakest")
    return pd.DataFrame([dict(zip(keys, r)) for r in rows])


def test_points_sentence_says_what_the_table_holds():
    generic = _points([("sgd", 0, True, 1e-3), ("sgd", 1, True, 1e-8)])
    text = ch.points_sentence(generic, "the narrow runs")
    assert text.startswith("Of the 2 layers of the narrow runs, 2 sit at the generic count.")
    assert "1.0e-08 to 1.0e-03" in text and "in 1 of those 2 layers it is below 1e-06" in text
    assert "undecided" not in text and "at least" not in text
    text = ch.points_sentence(generic.assign(method="certify"), "chapter 6's runs")
    assert "the certificate bounds the weakest identified direction from below by 1.0e-08 to 1.0e-03" in text
    assert "a millionth" not in text  # a lower bound says nothing of how weak the direction is
    planted = _points([("sgd", 0, True, 1e-3), ("sgd", 1, False, 1e-3), ("adamw", 0, None, 1e-11)])
    text = ch.points_sentence(planted, "x")
    assert "1 sit at the generic count, 1 have more unidentified directions than it (a special point) and 1 are" in text
    assert "bounds the weakest identified direction from below only, by 1.0e-11 to 1.0e-11" in text
    f = ch.points_facts(planted, "p")
    assert (f["p_generic"], f["p_special"], f["p_undecided"], f["p_bound_min"]) == (1, 1, 1, 1e-11)
    missing = pd.DataFrame([{"case": "sgd", "layer": None, "at_generic": None, "weakest": None}])
    assert "kept no weights" in ch.points_sentence(missing, "x")


def test_motion_table_and_sentence_from_a_planted_frame():
    rows = [
        {"case": case, "step": step, "layer": layer, "raw": 1.0 * step / 10, "orbit": orbit * step / 10}
        for case, orbit in (("sgd", 0.9), ("adamw", 0.5))
        for step in (0, 5, 10)
        for layer in (0, 1)
    ]
    t = ch.table_motion(pd.DataFrame(rows))
    assert list(t["case"]) == ["sgd", "sgd", "adamw", "adamw"]
    assert list(t["along the symmetry"]) == pytest.approx([0.19, 0.19, 0.75, 0.75])
    text = ch.motion_sentence(t)
    assert "undoes 19% to 75%" in text and "most under AdamW (75% to 75%" in text and "least under SGD" in text
    assert ch.motion_facts(t) == pytest.approx({"along_min": 0.19, "along_max": 0.75})
    assert "kept its snapshots" in ch.motion_sentence(pd.DataFrame())
    assert len(ch.fig_motion(pd.DataFrame(rows)).axes) == 2 and len(ch.fig_motion(pd.DataFrame()).axes) == 1


def test_points_table_audits_a_kept_run_and_names_the_missing(corpus, tmp_path):
    from attnid.lm.profiles import make_config
    from attnid.lm.train import train

    cfg = make_config("smoke", "points_adamw", block_size=8, max_iters=20)
    train(cfg, out=tmp_path, data=corpus, progress=False)
    t = ch.table_points("smoke", corpus, base=tmp_path)
    kept = t[t["case"] == "adamw"]
    assert list(kept["layer"]) == [1, 2] and list(kept["unidentified"]) == list(kept["generic"]) == [336, 336]
    assert list(kept["method"]) == ["dense", "dense"]  # the sentence words a certificate's bound by it
    assert (tmp_path / "smoke" / "points_adamw" / "points.json").exists()  # kept for the next build
    missing = t[t["case"] != "adamw"]
    assert len(missing) == 3 and set(missing["note"]) == {"no weights kept (model.pt)"}
    frame = ch.motion_frame("smoke", base=tmp_path)  # chapter 6's runs: none in this folder
    assert frame.empty
    claims = ch.table_claims("smoke", base=tmp_path).set_index("id")
    assert claims.loc["trained_points_generic", "verdict"] == "pending"  # three of the four runs are missing
    assert claims.loc["wd_moves_along_symmetry", "verdict"] == "pending"


def test_certified_cases_default_to_adamw_and_refuse_what_is_not_a_case():
    assert ch.certified_cases("smoke") == ()
    assert ch.certified_cases("cpu") == ch.certified_cases("paper") == ("adamw",)
    assert ch.certified_cases("cpu", True) == ("sgd", "sgd_wd", "adamw", "adamw_rebalance")
    assert ch.certified_cases("cpu", False) == ch.certified_cases("cpu", []) == ()
    assert ch.certified_cases("smoke", ["adamw_rebalance", "sgd"]) == ("sgd", "adamw_rebalance")  # the book's order
    for bad in ("adamw", ["adam"], [0], 1):
        with pytest.raises(ValueError, match="certify_chapter6: expected None, True, False or a list of sgd"):
            ch.certified_cases("cpu", bad)
    assert ch.cases_named(("adamw",)) == "AdamW run"
    assert ch.cases_named(("sgd", "sgd_wd", "adamw")) == "SGD, SGD + weight decay and AdamW runs"
