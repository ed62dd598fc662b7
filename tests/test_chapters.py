"""The chapter modules (attnid.chapters): tables, sentences and figures from the committed paper-scale records
and synthetic records, in seconds."""

from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
import pytest

from attnid.chapters import decay, sweep, verdicts
from attnid.chapters import dynamics as ch
from attnid.lm.analysis import load_suite
from attnid.lm.metrics import Key
from attnid.lm.profiles import RunConfig, lr_at, make_config
from attnid.lm.records import Record

matplotlib.use("Agg")


@pytest.fixture(scope="module")
def scales():
    from test_claims import synthetic_suite

    paper = load_suite("paper")
    if "sgd_wd" not in paper:
        pytest.skip("the committed paper-scale records are not in this checkout")
    return {"paper scale": paper, "smoke rerun": synthetic_suite()}


def test_wd_law_table_and_sentence(scales):
    t = decay.table_wd_law(scales)
    paper = t[t["scale"] == "paper scale"]
    assert list(paper["layer"]) == [1, 2, 3, 4, 5, 6] and set(paper["measured on"]) == {"β"}
    assert list(paper["tested"]) == [False, False, False, True, True, True]
    assert list(paper["holds (< 1 %)"]) == [False, False, False, True, True, True]
    text = decay.law_sentence(t, "paper scale")
    assert "holds to 1 % in layer(s) 4, 5, 6" in text and "fails in layer(s) 1, 2, 3" in text
    assert "residual 0.01 to 0.27" in text and "read on β" in text
    reading = decay.law_remainder_reading(t)  # 0.0051 to 0.19 of the remainder: a bound of about 0.19, not 1 %
    assert "a remainder below c_T bounds the residual by about 0.19, not by the 1 % tolerance" in reading
    assert reading.startswith("The residual is 0.0") and "in every layer, scale and seed" in reading
    # planted: layer 1's residual split over three seeds (0.05, 0.005, 0.008): its median passes, as the claim reads
    # it, though its mean (0.021) would not; the sentence says how many seeds pass
    small = t[t["scale"] == "smoke rerun"].copy()
    first = small.index[small["layer"] == 1]
    small.loc[first, "law residual"] = [0.05, 0.005, 0.008][: len(first)]
    text = decay.law_sentence(small, "smoke rerun")
    assert "holds to 1 % in layer(s) 1" in text and "2 of 3 seeds pass layer 1" in text
    paper_only = t[t["scale"] == "paper scale"]
    assert "below 1 % in 3 of 3 (layer, seed) pairs" in decay.law_remainder_reading(paper_only)
    worse = t.assign(**{"law residual": t["law residual"] * 10})
    assert "in some layers something beyond" in decay.law_remainder_reading(worse)
    fig = decay.fig_wd_law(scales, {k: k for k in scales})
    assert len(fig.axes) == 2 and fig.axes[1].get_xlabel().startswith("plain SGD")


def test_drift_by_layer_reads_the_deep_case_where_there_is_one(scales):
    t = decay.table_drift_by_layer(scales)
    order = "order (Kendall's τ; 1: every earlier layer drifts more)"
    paper = t[t["scale"] == "paper scale"]
    assert list(paper["case"]) == ["sgd"] and len(paper.iloc[0]["final drift per layer, first to last"].split(",")) == 6
    rerun = t[t["scale"] == "smoke rerun"]
    assert list(rerun["case"]) == ["sgd_deep"] * 3 and list(rerun["seed"]) == [0, 1, 2]  # one row per seed
    assert (rerun[order] == 1.0).all() and paper[order].iloc[0] == 1.0


# ------------------------------------------------------------------------------ the ladder of scales
def test_ladder_table_and_sentence_follow_the_rows(scales):
    import copy

    from test_claims import PLANTS

    from attnid.chapters import ladder

    rows = verdicts.claim_rows(scales)
    t = ladder.table_ladder(rows, scales)
    assert list(t.columns) == ["claim", "smoke (4 × 4 × 64)", "paper (6 × 6 × 384)"]  # smallest model first
    cells = t.set_index("claim")
    assert cells.loc["adamw_covers", "paper (6 × 6 × 384)"] == "inconclusive (1 seed, against the paper)"
    assert cells.loc["adamw_covers", "smoke (4 × 4 × 64)"] == "yes (3 seeds)"
    assert cells.loc["rebalance_keeps_loss", "paper (6 × 6 × 384)"] == "yes (1 seed)"
    assert cells.loc["key_bias_grad_zero", "paper (6 × 6 × 384)"] == "inconclusive (1 seed, undecided)"  # bf16
    read = ladder.ladder_readings(rows, scales)
    assert "adamw_covers" in read["changes"] and "rebalance_keeps_loss" in read["with"]
    # with the paper where read, but the bf16 paper records cannot decide it: not "with at every scale"
    assert "key_bias_grad_zero" in read["partial"] and "key_bias_grad_zero" not in read["with"]
    assert not [i for ids in read.values() for i in ids if i.endswith("_at_loss")]  # a twin is no claim of its own
    text = ladder.ladder_sentence(rows, scales, middle="smoke rerun")
    assert "*adamw_covers* (smoke yes (3 seeds); paper inconclusive (1 seed, against the paper))" in text
    assert "the smoke rerun reads: " in text and "*adamw_covers* yes (3 seeds)" in text
    # a plant at the small scale turns a claim against the paper at both: the sentence moves it
    planted = copy.copy(scales)
    planted["smoke rerun"] = PLANTS["adamw_covers"](scales["smoke rerun"])
    moved = ladder.ladder_readings(verdicts.claim_rows(planted), planted)
    assert "adamw_covers" in moved["against"] and "adamw_covers" not in moved["changes"]
    # seeds split at one scale and with the paper at the other: undecided there, not a change with scale
    split = rows.copy()
    paper_scale = next(n for n, sc in scales.items() if sc.profile == "paper")
    at = (split["id"] == "rebalance_keeps_loss") & (split["scale"] == paper_scale)
    split.loc[at, ["verdict", "side"]] = ["inconclusive", "split"]
    assert at.sum() == 1
    read_split = ladder.ladder_readings(split, scales)
    assert "rebalance_keeps_loss" in read_split["partial"] and "rebalance_keeps_loss" not in read_split["changes"]
    split.loc[at, "side"] = "against the paper"  # a side against it: that is a change
    assert "rebalance_keeps_loss" in ladder.ladder_readings(split, scales)["changes"]
    facts = ladder.ladder_facts(rows, scales)
    assert facts["ladder_scales"] == 2 and facts["ladder_changes"] == len(read["changes"])
    assert facts["ladder_partial"] == len(read["partial"]) >= 2
    assert sum(facts[k] for k in ("ladder_with", "ladder_against", "ladder_changes", "ladder_partial")) + len(
        read["unread"]
    ) == len({i for i in rows["id"] if not i.endswith("_at_loss")})


def test_ladder_quantities_against_scale(scales):
    from attnid.chapters import ladder

    q = ladder.scale_quantities(scales).set_index("scale")
    assert list(q.index) == ["smoke (4 × 4 × 64)", "paper (6 × 6 × 384)"]
    assert q.loc["paper (6 × 6 × 384)", "isotropic ρ"] == pytest.approx(64 / 770)
    assert q.loc["paper (6 × 6 × 384)", "c_T"] == pytest.approx(0.064187, rel=1e-5)
    assert q.loc["paper (6 × 6 × 384)", "law residual, tested layers"] == pytest.approx(0.003221, rel=1e-3)
    assert q.loc["paper (6 × 6 × 384)", "remainder / c_T, tested layers"] == pytest.approx(0.5127, rel=1e-3)
    profiles = ladder.drift_profiles(scales)
    depth, d = profiles["paper (6 × 6 × 384)"]
    assert d.shape == (1, 6) and depth[0] == pytest.approx(1 / 12)
    fig = ladder.fig_ladder(scales)
    assert len(fig.axes) == 3 and all(ax.get_title() for ax in fig.axes)


def test_key_bias_step_recovers_a_planted_step():
    """A key bias that starts at zero and takes steps of s·η_t per coordinate: all aligned, the coherent share
    reads s; independent ±s·η_t, the random-walk share reads s within its sampling error."""
    cfg = make_config("smoke", "adamw", max_iters=4000, metric_interval=4000)  # metric steps 1 and 4000
    c = RunConfig.from_dict(cfg.as_dict())
    D, H, L, s = cfg.gpt_config().head_dim, cfg.n_head, cfg.n_layer, 0.02
    eta = np.array([lr_at(c, t) for t in range(c.max_iters)])
    aligned = np.full((L, H), s * np.sqrt(D) * eta.sum())
    rng = np.random.default_rng(0)
    walk = np.linalg.norm(s * (rng.choice([-1, 1], size=(L, H, D, len(eta))) * eta).sum(-1), axis=-1)
    for norms, which in ((aligned, 0), (walk, 1)):
        first = {Key.STEP: 1, Key.NORM_BK: np.zeros((L, H)).tolist()}
        rows = [first, {Key.STEP: c.max_iters, Key.NORM_BK: norms.tolist()}]
        rec = Record(Path("/synthetic/adamw"), cfg.as_dict(), {}, rows)
        assert decay.key_bias_step(rec)[which] == pytest.approx(s, rel=0.1 if which else 1e-12)


def test_disagreements_name_single_seed_rows_against_the_paper(scales):
    rows = verdicts.claim_rows(scales)
    text = verdicts.disagreements(rows)
    for claim_id in ("adamw_closest", "adamw_covers", "sgd_conserves_beta"):
        assert f"{claim_id} (paper scale, 1 seed)" in text
    assert "Read **no**: none" in text
    shown = verdicts.table_claims(rows)
    assert len(shown) == len(rows) and shown["verdict"].str.startswith(("yes", "no", "inconclusive", "pending")).all()
    good = verdicts.disagreements(verdicts.claim_rows({"smoke rerun": scales["smoke rerun"]}))
    assert "Read **no**: none" in good and "Pending: none" in good and "The other 0 undecided" in good


@pytest.mark.parametrize("name", ["fig_loss", "fig_rho", "fig_beta", "fig_bias"])
def test_training_figures_draw_from_records(scales, name):
    """Chapter 6's figures over training draw one line per optimizer case from records (paper and synthetic)."""
    f = getattr(ch, name)
    fig = f(scales, {k: k for k in scales}) if name in ("fig_loss", "fig_rho") else f(scales["smoke rerun"], "x")
    lines = [line for ax in fig.axes for line in ax.get_lines() if not line.get_label().startswith("_")]
    assert len(fig.axes) >= 2 and len(lines) >= 4


def test_sweep_table_slopes_are_the_log_log_fit():
    """The sweep's synthetic drift is 0.04 (η/0.5)² 0.5^layer: a slope of exactly 2 in every layer."""
    from test_claims import synthetic_suite

    t = sweep.table_sweep(synthetic_suite())
    assert np.allclose(t["slope of log drift vs log η (mean over seeds)"], 2.0) and list(t["layer"]) == [1, 2, 3, 4]
    fig = sweep.fig_sweep(synthetic_suite(), "x")
    assert fig.axes[0].get_legend_handles_labels()[1] == [f"layer {i}" for i in (1, 2, 3, 4)]


def test_spectra_table_and_figure(scales):
    t = sweep.table_spectra(scales)
    paper = t[t["scale"] == "paper scale"].set_index("case")
    assert paper.loc["SGD", "D"] == 64 and 0 < paper["smallest σ / largest (any head, any seed)"].min() < 1
    fig = sweep.fig_spectra(scales, {k: k for k in scales})
    assert len(fig.axes) == 2 and len(fig.axes[0].get_lines()) == 3 * 6  # three cases x six heads (paper)


def test_wd_transient_figure_shows_only_the_early_steps(scales):
    runs = scales["smoke rerun"]
    cut = decay.transient_cut(runs)
    assert cut == max(50 // 5, 3 * 10)  # the smoke profile: 50 steps, a metric row every 10
    fig = decay.fig_wd_transient(runs, cut, "x")
    assert all(line.get_xdata().max() <= cut for ax in fig.axes for line in ax.get_lines())


def test_floor_by_learning_rate():
    """The synthetic sweep: the float32-difference ρ floor is 1e-7 in the middle and 1e-6 in the last row."""
    from test_claims import N, synthetic_suite

    runs = synthetic_suite()
    lrs, floor, exact = ch.floor_by_lr(runs)
    assert lrs == [0.0625, 0.125, 0.25, 0.5]
    assert all(f["mean"] == pytest.approx((1e-7 * (N - 1) + 1e-6) / N) for f in floor)
    assert all(e["max"] < 1e-12 for e in exact)
    assert len(ch.fig_floor(runs, "x").axes) == 3  # two panels and the learning-rate axis


def test_the_bf16_key_bias_share_is_the_claims_measure_on_bf16_scales_only(scales):
    """The paper records (bf16) give 3.8e-2, the key-bias claim's own measure; the fp32 smoke rerun is not named
    until it is planted as bf16."""
    import copy

    from attnid.lm.records import Record

    bias = decay.table_bias(scales)
    text = decay.bf16_key_bias_share(bias, scales)
    assert text == "up to 3.8e-02 of the typical query-bias gradient at the paper scale"
    planted = copy.deepcopy(scales)
    for by_seed in planted["smoke rerun"].runs.values():
        for s, rec in by_seed.items():
            by_seed[s] = Record(rec.path, rec.config, {**rec.summary, "precision": "bf16"}, rec.rows)
    assert "at the smoke rerun" in decay.bf16_key_bias_share(decay.table_bias(planted), planted)


def test_every_case_of_chapter_6_is_shown_by_its_name():
    """Every case of the dynamics suite (the deeper SGD run of the shallow profiles among them) has a display name;
    an id without one is shown as itself, never as a blank."""
    from attnid.chapters import labelled
    from attnid.lm.profiles import SUITES

    cases = list(SUITES["dynamics"].cases)
    shown = labelled(pd.DataFrame({"case": [*cases, "mine"]}))["case"].tolist()
    assert "sgd_deep" in cases and shown[cases.index("sgd_deep")] == "SGD, 4 layers"
    assert all(isinstance(s, str) and s for s in shown) and shown[-1] == "mine"
    assert len(set(shown[:-1])) == len(cases)


def test_the_late_spike_sentence_reads_only_records_whose_floor_is_float32s():
    """Planted: a bf16 scale whose SGD ratio is above the claim's threshold (its own rounding floor). The sentence
    names it as not read and does not count it as SGD's float32 floor rising; read as fp32 it would."""
    from test_claims import synthetic_suite

    runs = synthetic_suite()
    late = pd.DataFrame(
        [
            {"scale": "cpu rerun", "case": "sgd", "seeds": 3, "precision": "fp32", ch.LATE_F32: 1.3},
            {"scale": "cpu rerun", "case": "adamw", "seeds": 3, "precision": "fp32", ch.LATE_F32: 1.1},
            {"scale": "paper scale", "case": "sgd", "seeds": 1, "precision": "bf16", ch.LATE_F32: 4.9},
        ]
    )
    text = ch.late_sentence(late, runs)
    assert "for no optimizer" in text and "the paper scale records, trained at bf16, are not read here" in text
    late.loc[2, "precision"] = "fp32"
    assert "(paper scale, 4.9×)" in ch.late_sentence(late, runs)


# ------------------------------------------------------------------------------ chapter 7 (attnid.chapters.heads)
def _heads_runs(corr: float = 1.0, rho_power: float = -1.0, seeds=(0, 1)):
    """A synthetic head-count sweep at the smoke profile: ρ of every head ``∝ H^rho_power`` times
    ``1 + corr·importance``, validation loss falling with H by more than the seeds differ."""
    from attnid.chapters.heads import HeadRuns
    from attnid.lm.ablation import PRUNE_TOLERANCES
    from attnid.lm.analysis import SuiteRuns
    from attnid.lm.profiles import SUITES

    rng = np.random.default_rng(0)
    sweep = SuiteRuns("smoke", "heads")
    for case in SUITES["heads"].cases:
        for s in seeds:
            cfg = make_config("smoke", case, seed=s, metric_interval=49, eval_interval=50)  # rows at steps 1, 50
            g = cfg.gpt_config()
            L, H, D = cfg.n_layer, cfg.n_head, g.head_dim
            imp = rng.uniform(0.0, 0.1, (L, H))
            rho = 0.02 * H**rho_power * (1 + corr * 10 * imp)
            row = {Key.STEP: 1, Key.RHO: rho.tolist(), Key.QK_SV: np.tile(np.geomspace(1, 0.1, D), (L, H, 1)).tolist()}
            heads = {
                "importance": imp.tolist(),
                "baseline": 2.0,
                "n_batches": 4,
                "pruning_curve": [{"fraction": f, "loss": 2.0 + f} for f in (0.0, 0.5, 1.0)],
                "prunable": {f"{t:g}": 0.25 for t in PRUNE_TOLERANCES},
            }
            summary = {
                "seed": s,
                "final_val_loss": 2.0 - 0.01 * np.log2(H) + 1e-4 * s,
                "rho_method": "float64 optimizer update",
            }
            rec = Record(
                Path(f"/synthetic/{case}-s{s}"),
                {**cfg.as_dict(), "seed": s},
                summary,
                [row, {**row, Key.STEP: 50}],
                heads,
            )
            sweep.runs.setdefault(case, {})[s] = rec
    return HeadRuns("smoke", sweep.first("heads_H4"), sweep, "pending")


def test_heads_chapter_reads_a_planted_sweep():
    from attnid.chapters import heads as hc

    h = _heads_runs()
    rows = hc.sweep_rows(h)
    summary = hc.table_sweep(rows)
    assert list(summary["H"]) == [1, 2, 4, 8, 16, 4]
    assert summary["identified fraction"].iloc[:5].tolist() == pytest.approx(
        [1 - 1 / (2 * k) for k in (1, 2, 4, 8, 16)]
    )
    assert "It falls about as fast as 1/(2H)" in hc.rho_slope_sentence(summary)  # ρ ∝ 1/H planted
    assert "positive in 10 of them" in hc.correlation_sentence(rows)  # ρ rises with importance in every run
    assert "larger than the seed noise" in hc.loss_sentence(summary, 2)
    assert "pending" in hc.intro_sentence(h) and hc.pruning_sentence(h).startswith("Prunable: within 1%: 25%")
    facts = hc.facts(h, rows, summary)
    assert facts["prunable_5"] == 0.25 and facts["corr_sign"].startswith("positive")
    for f in (hc.fig_head_grids(h), hc.fig_pruning(h), hc.fig_rho_vs_h(rows, summary, "smoke")):
        assert f.axes[0].get_title()


def test_heads_chapter_readings_flip_with_the_plant():
    """Against ρ ∝ H⁰ (no fall) and ρ falling as importance rises, the readings turn."""
    from attnid.chapters import heads as hc

    h = _heads_runs(corr=-0.9, rho_power=0.0)
    rows = hc.sweep_rows(h)
    summary = hc.table_sweep(rows)
    assert "It falls more slowly than 1/(2H)" in hc.rho_slope_sentence(summary)
    assert "positive in 0 of them" in hc.correlation_sentence(rows)
    assert "within seed noise" in hc.loss_sentence(summary.assign(**{"val loss, nats/char (max)": 3.0}), 2)


# ------------------------------------------------------------------------------ chapter 8 (attnid.chapters.blocks)
def test_blocks_chapter_closed_forms_of_published_models():
    """Regression guards against numbers derived by hand from the released configs (the closed forms meet the
    Jacobian of the real modules in tests/test_hf.py)."""
    from attnid.chapters import blocks as bc
    from attnid.presets import preset_count

    compare = bc.table_compare()
    facts = bc.compare_facts(compare)
    assert preset_count("gpt2", "model").total_params == 124_439_808  # the published count
    assert facts["gpt2_model"] == 1_347_352 and facts["llama_model"] == 25_917_440
    assert facts["llama_rotation"] == 4096 * 4095 // 2  # E(E − 1)/2 with E = 4096
    assert facts["gpt2_product"] == 12 * 12 * (64**2 + 64**2)
    parts = compare.drop(columns=["model", "whole model (closed form)", "params"]).sum(axis=1)
    assert (parts == compare["whole model (closed form)"]).all()
    points = bc.compare_points(compare)
    assert "1,179,648 for GPT-2 small" in points
    # 167,704 beyond the product: 18,432 of them attention key/value biases (12 layers x 12 heads x (64 + 64)),
    # not norm, MLP or stream terms
    assert "would leave out 167,704 directions for GPT-2 small: 18,432 from the attention's key and value" in points
    assert "and 149,272 from the norms, the output biases and the residual stream" in points


def test_gpt2_block_moves_and_a_planted_audit_mismatch():
    from attnid.chapters import blocks as bc

    moves = bc.gpt2_block_moves()
    assert moves["max |Δy|"].iloc[:2].max() < 1e-12 and moves["max |Δy|"].iloc[2] > 1e-3
    audits = bc.table_block_audits([("gpt2", dict(heads=1, ffn=12))])
    assert (audits["closed form"] == audits["Jacobian"]).all() and audits["gap"].iloc[0] > 1e6
    with pytest.raises(AssertionError, match="differs from its closed form"):
        bc._checked(audits.assign(Jacobian=audits["Jacobian"] + 1))


# ------------------------------------------------------------------------------ chapter 9 (attnid.chapters.recent)
@pytest.fixture(scope="module")
def variants():
    """Chapter 9's variant table against our layer's Jacobian (about 5 s: read by two tests)."""
    from attnid.chapters import recent as rc

    return rc.variant_table(real=False)


def test_recent_chapter_counts_meet_the_jacobian_and_a_planted_error_raises(variants, monkeypatch):
    """Chapter 9's variant table: every closed form equals the Jacobian count of our layer (the real modules
    are tests/test_modern_attention.py's); a closed form that is off by one raises instead of being shown."""
    from attnid.chapters import recent as rc

    df = variants
    assert (df["unidentified"] == df["our layer"]).all() and (df["smallest gap"] > 1e6).all()
    qk = dict(zip(df["variant"], df["QK block"], strict=True))
    assert qk["RoPE (Llama)"] == 2 * 8 and qk["RoPE + QK-norm per head, ε = 0 (Qwen3)"] == 2 + 2 + 4
    assert (
        qk["RoPE + QK-norm per head, ε = 0.05"] == 4 and qk["RoPE + QK-norm over the projection, ε = 0 (OLMo 2)"] == 10
    )
    keys = dict(zip(df["variant"], df["key bias"], strict=True))
    assert keys["biases, no RoPE"] == 2 * 8 and keys["biases, no RoPE, soft-capping c = 1"] == 0
    assert keys["biases, no RoPE, soft-capping c = 50"] == 0  # identified at the released cap too (barely)
    # Gemma 2's real module rotates every dimension: its key bias is identified without the cap as well, so its row
    # cannot show the cap's effect, and the chapter says which rows no released module checks
    assert keys["RoPE + soft-capping, c = 50 (Gemma 2)"] == keys["RoPE (Llama)"] == 0
    import dataclasses

    def off_by_one(cfg):  # a closed form that miscounts the QK block by one
        c = real_count(cfg)
        return dataclasses.replace(
            c, unidentified_by_block={**c.unidentified_by_block, "qk": c.unidentified_by_block["qk"] + 1}
        )

    real_count = rc.count
    monkeypatch.setattr(rc, "count", off_by_one)
    with pytest.raises(AssertionError, match="gives"):
        rc.variant_table(real=False)


def test_recent_chapter_published_and_conservation_facts(variants):
    from attnid.chapters import recent as rc

    published = rc.published_table()
    rows = published.set_index("model")
    assert rows.loc["qwen3-8b", "QK block"] == 128 // 2 and rows.loc["qwen3-8b", "QK block without"] == 8 * 128
    assert rows.loc["olmo-2-7b", "QK block"] == 32 * 64 and rows.loc["gemma-2-9b", "QK block"] == 8 * 256
    conservation = rc.conservation_table()
    exact = conservation[conservation["ε"] == 0]
    assert exact[["scales", "norm-weight trade"]].to_numpy().max() < 1e-12
    assert conservation[conservation["ε"] > 0]["scales"].min() > 1e-4
    mla = rc.mla_table(real=False)
    v3 = mla.set_index("attention layer").loc["DeepSeek-V3"]
    assert v3["qk_nope"] == v3["vo"] == 128 * 128**2 and v3["qk_rope"] == 64
    assert v3["q_latent"] == 1536 * 1535 // 2 + 1536 and v3["kv_latent"] == 512 * 511 // 2 + 512  # ε > 0
    scopes = rc.scopes_table(real=False)
    by_model = scopes.set_index("model")
    assert by_model.loc["qwen3-8b", "stream rotations"] == 4096 * 4095 // 2
    assert (by_model.loc[["olmo-2-7b", "gemma-3-12b", "gemma-2-9b"], "stream rotations"] == 0).all()
    assert by_model.loc["olmo-2-7b", "norm weights"] == 0 and by_model.loc["gemma-2-9b", "norm weights"] == 2 * 3584
    assert by_model.loc["deepseek-v3", "MLP rescaling"] == 256 * 2048 + 2048
    assert (scopes["block"] < scopes["attention"]).all() and scopes["small layer audit"].isna().all()
    facts = rc.facts(variants, published, conservation, mla, scopes)
    assert facts["qwen_qk"] == 64 and facts["n_real"] == 0 and facts["v3_latents"] == v3["q_latent"] + v3["kv_latent"]
    assert "“biases, no RoPE, soft-capping c = 50”" in facts["ours_only"] and "Gemma 2" in facts["ours_only_reason"]
    assert facts["n_layer_audits"] == 0 and facts["qwen_rotation_share"] > 0.5
    assert facts["olmo_beyond_layers"] == 2 * 4096 and facts["gemma_beyond_layers"] == 0  # final norm + logit shift


def test_records_sentence_names_each_scales_provenance(scales):
    from attnid.chapters import ladder

    text = ladder.records_sentence(scales)
    assert (
        "*paper scale*: 7 records, trained on x86_64, 16 cores, Intel(R) Xeon(R) Processor; NVIDIA H200 (bf16, torch "
        "2.11.0+cu130) by the code of commit 0144f25, 6 minutes of machine time in all" in text  # one stack: once
    )
    assert text.index("smoke rerun") < text.index("paper scale")  # smallest model first


def test_the_ladder_names_the_measure_of_each_law_reading(scales):
    """The law's cell and the ladder's quantities say whether a scale was read on β or on τ per head (records without
    the residual), and the sentence comparing the two readings follows from their numbers."""
    import copy

    from test_claims import _without

    from attnid.chapters import ladder

    older = copy.copy(scales)
    older["smoke rerun"] = _without(scales["smoke rerun"], "sgd_wd", Key.BETA_LAW)  # τ only, as older records
    rows = verdicts.claim_rows(older)
    cells = ladder.table_ladder(rows, older).set_index("claim").loc["wd_beta_law"]
    assert "on τ" in cells["smoke (4 × 4 × 64)"] and "on β" in cells["paper (6 × 6 × 384)"]
    q = ladder.scale_quantities(older).set_index("scale")
    assert list(q["law measured on"]) == ["τ", "β"]
    text = ladder.law_measure_sentence(q.reset_index())
    assert "smoke (4 × 4 × 64) on τ, paper (6 × 6 × 384) on β" in text
    paper = q.loc["paper (6 × 6 × 384)"]
    assert f"τ {paper['τ residual, tested layers']:.2g} against β {paper['law residual, tested layers']:.2g}" in text
    stricter = paper["τ residual, tested layers"] > paper["law residual, tested layers"]
    assert ("τ is the stricter reading" in text) == stricter


def test_the_ladder_says_whether_the_matched_loss_reading_changes_a_verdict(scales):
    import copy

    from test_claims import PLANTS

    from attnid.chapters import ladder

    assert ladder.matched_loss_changes(verdicts.claim_rows(scales), scales) == []
    planted = copy.copy(scales)
    planted["smoke rerun"] = PLANTS["adamw_closest_at_loss"](scales["smoke rerun"])
    rows = verdicts.claim_rows(planted)
    changes = ladder.matched_loss_changes(rows, planted)
    assert changes == [("adamw_closest", "smoke", "yes (3 seeds)", "no (3 seeds)", True)]
    text = ladder.ladder_sentence(rows, planted)
    assert "*adamw_closest* at smoke: yes (3 seeds) at the same step, no (3 seeds) at the same loss" in text
    # planted: one seed changes side when the target moves by the tolerance: the change is said to be undecided
    twin = (rows["scale"] == "smoke rerun") & (rows["id"] == "adamw_closest_at_loss")
    rows.loc[twin, "band_sides"] = pd.Series([[[False, False, False], [True, False, False], [False] * 3]] * twin.sum(),
                                             index=rows.index[twin])  # fmt: skip
    assert ladder.matched_loss_changes(rows, planted)[0][-1] is False
    text = ladder.matched_loss_sentence(rows, planted)
    assert (
        "change no verdict beyond the cut's uncertainty" in text
        and "the reading does not decide: *adamw_closest*" in text
    )
