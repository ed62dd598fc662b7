import itertools

import numpy as np
import pytest
import torch
from torch import nn

from attnid.attention import AttentionConfig
from attnid.audit import audit, audit_torch_mha
from attnid.counting import count, total_params

# (E, H, G, D, C): D != E/H, C != D, G in {1, 2, H}, D or C above E
SHAPES = [
    (8, 2, 2, 4, 4),
    (8, 2, 1, 4, 4),
    (8, 4, 2, 2, 2),
    (8, 4, 4, 2, 3),
    (6, 2, 2, 3, 2),
    (12, 3, 1, 4, 2),
    (8, 4, 4, 2, 1),
    (4, 2, 2, 6, 5),
    (8, 2, 2, 2, 4),
]
BIASES = ["none", "all", "qkv", "k", "v"]


def _grid():
    out = []
    for i, ((E, H, G, D, C), bias) in enumerate(itertools.product(SHAPES, BIASES)):
        rope = (i % 3 == 1) and D % 2 == 0 and D <= E
        out.append(AttentionConfig(E, H, groups=G, head_dim=D, value_dim=C, bias=bias, rope=rope, causal=bool(i % 2)))
    return out


GRID = _grid()


@pytest.mark.parametrize("cfg", GRID, ids=str)
def test_jacobian_rank_equals_closed_form(cfg):
    r = audit(cfg, method="dense")
    assert r.total_params == total_params(cfg)
    assert r.unidentified == count(cfg).unidentified
    assert r.sv_gap > 1e6  # the rank decision is clear-cut


@pytest.mark.parametrize(
    "cfg",
    [
        AttentionConfig(16, 4, bias="all", causal=True),
        AttentionConfig(16, 4, groups=2, bias="qkv", rope=True),
        AttentionConfig(12, 3, head_dim=2, value_dim=3, bias="kvo"),
    ],
    ids=str,
)
def test_certify_agrees_with_dense(cfg):
    dense, cert = audit(cfg, method="dense"), audit(cfg, method="certify")
    assert cert.method == "certify"
    assert cert.unidentified == dense.unidentified == count(cfg).unidentified
    assert cert.details["null_residual_max"] < 1e-12
    assert cert.sv_gap > 1e6


@pytest.mark.parametrize("bias", [True, False])
def test_torch_multihead_attention_audit(bias):
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, bias=bias, batch_first=True)
    with torch.no_grad():
        for prm in mha.parameters():
            prm.add_(0.3 * torch.randn_like(prm))
    r = audit_torch_mha(mha, causal=True)
    assert r.unidentified == count(AttentionConfig(8, 2, bias="all" if bias else "none")).unidentified


def test_too_short_sequence_is_refused():
    with pytest.raises(ValueError, match="seq_len"):
        audit(AttentionConfig(4, 2), seq_len=1)


def test_block_audits_and_qk_product():
    from attnid.audit import audit_block, qk_product_rank
    from attnid.counting import orthonormal_qk_dof

    cfg = AttentionConfig(16, 4, groups=2, rope=True, causal=True)
    assert audit_block(cfg, ("W_Q", "W_K")).unidentified == 2 * 4  # G·D with RoPE
    assert audit_block(cfg, ("W_V", "W_O")).unidentified == 2 * 4 * 4  # G·C²
    assert audit_block(cfg.with_(rope=False), ("W_Q", "W_K")).unidentified == 2 * 16
    # single head, square V, no output map: only the QK block is unidentified
    single = AttentionConfig(6, 1, head_dim=6, value_dim=6)
    assert audit_block(single, ("W_Q", "W_K", "W_V")).unidentified == 36
    for ortho in (False, True):
        assert qk_product_rank(8, 3, orthonormal=ortho).rank == orthonormal_qk_dof(8, 3)
    with pytest.raises(ValueError, match="names"):
        audit_block(cfg, ("b_Q",))


def _tangent(cfg):
    from attnid.attention import init_params
    from attnid.symmetry import tangent_basis

    return torch.cat(list(tangent_basis(init_params(cfg, seed=0), cfg).values()), dim=1)


def test_certify_refuses_planted_bad_directions():
    """Three random (non-null) directions added to the known ones: the certificate fails instead of
    answering 83 for 80; a repeated direction (not independent) fails too."""
    from attnid.audit import CertificateError

    cfg = AttentionConfig(8, 2, bias="all", causal=True)
    T = _tangent(cfg)
    assert audit(cfg, method="certify", directions=T).unidentified == count(cfg).unidentified == 80
    bad = torch.cat([T, torch.randn(T.shape[0], 3, generator=torch.Generator().manual_seed(1), dtype=T.dtype)], 1)
    with pytest.raises(CertificateError, match="3 of the 83 supplied directions are not null"):
        audit(cfg, method="certify", directions=bad)
    with pytest.raises(CertificateError, match="not independent"):
        audit(cfg, method="certify", directions=torch.cat([T, T[:, :1]], 1))
    with pytest.raises(CertificateError, match="beyond the 79 supplied"):  # one symmetry left out
        audit(cfg, method="certify", directions=T[:, 1:])


def test_certify_uses_the_given_rtol():
    cfg = AttentionConfig(8, 2, bias="all")
    assert audit(cfg, method="certify", rtol=1e-6).tol == pytest.approx(
        1e-6 / 1e-9 * audit(cfg, method="certify").tol, rel=1e-6
    )


def test_too_little_data_is_refused_not_undercounted():
    cfg = AttentionConfig(16, 4, bias="all", causal=True)
    with pytest.raises(ValueError, match=r"batch: 1 sequences .* too few"):
        audit(cfg, method="dense", batch=1)
    for bad in (None, "cfg"):
        with pytest.raises(TypeError, match="cfg"):
            audit(bad)
    with pytest.raises(ValueError, match="batch"):
        audit(cfg, batch=-1)


@pytest.mark.parametrize("E, D", [(6, 2), (8, 3), (5, 5)])
def test_svd_construction_count(E, D):
    from attnid.audit import svd_construction_rank

    r = svd_construction_rank(E, D)
    assert r["constraints"] == D * (D + 1)
    assert r["tangent_dim"] == r["rank_on_tangent"] == 2 * D * E - D * D


# partial RoPE: (E, H, G, D, R) with R < D, every bias setting that touches the QK block, GQA and MQA
PARTIAL = [(16, 2, 2, 8, 4), (16, 4, 2, 4, 2), (12, 2, 1, 6, 2), (16, 2, 2, 8, 6), (8, 2, 2, 4, 2)]


@pytest.mark.parametrize(
    "cfg",
    [
        AttentionConfig(E, H, groups=G, head_dim=D, bias=bias, rope_dims=R, causal=True)
        for (E, H, G, D, R), bias in itertools.product(PARTIAL, ["none", "k", "q", "qk", "all"])
    ],
    ids=str,
)
def test_partial_rope_counts_equal_the_jacobian(cfg):
    """R + (D − R)² per group for the QK block, D − R unidentified key-bias coordinates per group."""
    r = audit(cfg, method="dense")
    c = count(cfg)
    assert r.unidentified == c.unidentified
    assert r.sv_gap > 1e6
    G, D, R = cfg.G, cfg.D, cfg.R
    assert c.unidentified_by_block["qk"] == G * (R + (D - R) ** 2)
    assert c.unidentified_by_block["key_bias"] == (G * (D - R) if "k" in cfg.bias else 0)


def test_partial_rope_certify_uses_the_partial_commutant():
    cfg = AttentionConfig(16, 4, groups=2, bias="all", rope_dims=2, causal=True)
    cert = audit(cfg, method="certify")
    assert cert.unidentified == count(cfg).unidentified == audit(cfg, method="dense").unidentified
    assert cert.details["null_residual_max"] < 1e-12


@pytest.mark.parametrize("L", [0, 2.5, True])
def test_bad_sequence_lengths_are_refused(L):
    with pytest.raises(ValueError, match="seq_len"):
        audit(AttentionConfig(4, 2), seq_len=L)


def test_rope_audit_refuses_sequences_too_short_for_its_frequencies():
    """At E = 4, H = 1, D = 8 with L = 2 the Jacobian showed 80 with a clear gap; the truth is 56."""
    cfg = AttentionConfig(4, 1, head_dim=8, rope=True)
    with pytest.raises(ValueError, match="too few for RoPE"):
        audit(cfg, seq_len=2, batch=16)
    assert audit(cfg).unidentified == 56  # sized by default


@pytest.mark.parametrize("rtol", [1e-300, 0.5, 0.0])
def test_untrustworthy_rank_tolerances_are_refused(rtol):
    with pytest.raises(ValueError, match="rtol"):
        audit(AttentionConfig(8, 2), rtol=rtol)


def test_torch_mha_audit_guards_its_data_and_leaves_the_module_alone():
    from attnid.audit import audit_module, audit_torch_mha

    mha = torch.nn.MultiheadAttention(8, 2)
    for kw in (dict(batch=1), dict(seq_len=1), dict(seq_len=2.5)):
        with pytest.raises(ValueError, match=r"batch|seq_len"):
            audit_torch_mha(mha, **kw)
    assert audit_torch_mha(mha).unidentified == 80
    assert mha.in_proj_weight.dtype == torch.float32  # audited a copy
    with pytest.raises(ValueError, match="constant input"):
        audit_module(torch.nn.Linear(4, 4), (torch.zeros(3, 4),))
    with pytest.raises(TypeError, match=r"nn.Module"):
        audit_module("not a module", (torch.randn(3, 4),))
    with pytest.raises(ValueError, match="kdim"):
        audit_torch_mha(torch.nn.MultiheadAttention(8, 2, kdim=4, vdim=4))


def test_power_iterations_match_the_singular_values():
    """The block power / inverse iterations of certify give the extreme singular values of a matrix
    whose spectrum is known (to their stopping tolerances), and 0 for a singular one."""
    from attnid.audit import POWER_RTOL, smallest_singular_value, top_singular_value

    g = torch.Generator().manual_seed(0)
    n = 200
    U = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64)).Q
    V = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64)).Q
    s = torch.logspace(0, -6, n, dtype=torch.float64)
    K = U @ torch.diag(s) @ V.T
    top = top_singular_value(lambda W: (K.T @ (K @ W.T)).T, n, g)
    assert abs(top - 1.0) < 10 * POWER_RTOL
    assert abs(smallest_singular_value(K, g) / 1e-6 - 1) < 1e-3
    K[:, 0] = 0
    assert smallest_singular_value(K, g) == 0.0


def test_certify_reports_where_its_time_goes():
    r = audit(AttentionConfig(16, 4, bias="all"), method="certify")
    stages = r.details["stage_seconds"]
    assert list(stages) == [
        *("output_block", "known_directions", "null_residuals", "sigma_max", "block_jacobians", "block_factors")
    ]
    assert all(v >= 0 for v in stages.values()) and sum(stages.values()) <= r.seconds


@pytest.mark.parametrize(
    "cfg, route",
    [
        (AttentionConfig(16, 4, bias="all", causal=True), "per-group QR"),
        (AttentionConfig(16, 4, groups=2, bias="qkv", rope_dims=2), "per-group QR"),
        (AttentionConfig(16, 4, groups=1, bias="kvo", rope=True, causal=True), "per-group QR"),  # MQA: one group
        (AttentionConfig(8, 4, head_dim=2, value_dim=3, bias="all"), "whole sketch"),  # H·C = 12 > E: W_O not injective
    ],
    ids=str,
)
def test_certify_routes_agree_with_dense(cfg, route):
    cert = audit(cfg, method="certify")
    assert cert.details["certificate"] == route
    assert cert.details["jacobian_blocks"] == (cfg.G if route == "per-group QR" else 1)
    assert cert.unidentified == audit(cfg, method="dense").unidentified == count(cfg).unidentified
    assert cert.sv_gap > 1e6


def test_directions_that_span_two_groups_take_the_whole_sketch():
    """The same null space given by directions mixed across groups: the per-group split does not apply,
    the whole sketch certifies the same count."""
    cfg = AttentionConfig(8, 2, bias="all", causal=True)
    T = _tangent(cfg)
    mixed = T.clone()
    mixed[:, 0] += T[:, -1]  # the last direction (value bias) lives in the other group than the first (QK)
    r = audit(cfg, method="certify", directions=mixed)
    assert r.details["certificate"] == "whole sketch"
    assert r.unidentified == count(cfg).unidentified == 80


def _certify_at(cfg, p):
    from attnid.attention import attention, flatten, unflatten
    from attnid.audit import _certify, default_data_size, jacobian_rank, random_inputs

    B, L = default_data_size(cfg, flatten(p).numel())
    X = random_inputs(cfg, B, L)
    dense = jacobian_rank(lambda v: attention(X, unflatten(v, p), cfg).reshape(-1), flatten(p))
    return (lambda: _certify(cfg, p, X)), dense


def test_a_singular_output_map_is_not_split_by_group():
    """The per-group split needs W_O injective. A head whose W_O is zero has its whole query, key and
    value block unidentified (dense: 160 + its 204 − the 40 already counted = 324); split by group, each group's
    own Jacobian would still look full rank. Certify must take the whole sketch and refuse. Two heads
    sharing one W_O (also singular) keep the count, and the whole sketch certifies it."""
    from attnid.attention import init_params
    from attnid.audit import CertificateError

    cfg = AttentionConfig(16, 4, bias="all")
    p = init_params(cfg, seed=0)
    p["W_O"][1] = 0
    run, dense = _certify_at(cfg, p)
    assert dense.unidentified == 324 > count(cfg).unidentified  # the control: the count really changed
    with pytest.raises(CertificateError, match="beyond the"):
        run()
    p = init_params(cfg, seed=0)
    p["W_O"][1] = p["W_O"][0]
    run, dense = _certify_at(cfg, p)
    r = run()
    assert r.details["certificate"] == "whole sketch"
    assert r.unidentified == dense.unidentified == count(cfg).unidentified


def test_tolerance_window_gives_the_rank():
    from attnid.audit import tolerance_window

    sv = np.array([3.0, 1.0, 0.5, 1e-4, 1e-8, 1e-16])
    lo, hi = tolerance_window(sv, 3)
    assert (lo, hi) == (pytest.approx(1e-4 / 3), pytest.approx(0.5 / 3))
    for t in (lo, np.sqrt(lo * hi), hi * 0.999):
        assert int((sv > t * sv[0]).sum()) == 3
    assert int((sv > hi * sv[0]).sum()) == 2
    assert tolerance_window(sv, 6)[0] == 0.0
    with pytest.raises(ValueError, match="rank must be"):
        tolerance_window(sv, 0)


def test_a_large_dense_audit_says_what_it_is_doing(monkeypatch, capsys):
    """Above PROGRESS_ENTRIES Jacobian entries a dense audit shows a bar and the factoring on stderr, never on
    stdout (which may carry JSON); below it, nothing."""
    import attnid.audit as audit_mod

    cfg = AttentionConfig(8, 2)
    quiet = audit(cfg, method="dense", progress=True)
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(audit_mod, "PROGRESS_ENTRIES", 0)
    loud = audit(cfg, method="dense", progress=True)
    out, err = capsys.readouterr()
    assert out == "" and "Jacobian" in err and "factoring the" in err
    assert loud.unidentified == quiet.unidentified


@pytest.mark.parametrize("ratio", [0, -1.0, float("nan"), float("inf"), True])
def test_a_data_ratio_that_is_not_a_positive_number_is_refused_by_name(ratio):
    """``ratio`` = 0 once fell back to the default silently (``ratio or 3``): every value is honoured or refused."""
    with pytest.raises(ValueError, match="ratio must be a positive number"):
        audit(AttentionConfig(8, 2), ratio=ratio)


def test_an_ill_conditioned_output_map_is_certified_factor_by_factor():
    """One head's W_O scaled by 1e-7: the product bound σ_min(W_O) · σ_min(group) falls under 1e-9 σ_max, but
    W_O is still injective (1e-7 > 1e-9 of its scale) and every group is clear at its own: certified, with the
    count that the dense Jacobian shows at a finer cut. Scaled to 0 (not injective), the count changes and the
    certificate refuses (test_a_singular_output_map_is_not_split_by_group)."""
    from attnid.attention import init_params

    cfg = AttentionConfig(16, 4, bias="all")
    p = init_params(cfg, seed=0)
    p["W_O"][1] *= 1e-7
    run, _ = _certify_at(cfg, p)
    r = run()
    d = r.details
    assert d["certificate"] == "per-group QR" and d["sigma_kept"] / d["sigma_max"] < 1e-9 < d["group_kept_ratio"]
    fine = _dense_at(cfg, p, rtol=1e-13)
    assert r.unidentified == fine.unidentified == count(cfg).unidentified and fine.sv_gap > 1e3


def _dense_at(cfg, p, rtol):
    from attnid.attention import attention, flatten, unflatten
    from attnid.audit import default_data_size, jacobian_rank, random_inputs

    B, L = default_data_size(cfg, flatten(p).numel())
    X = random_inputs(cfg, B, L)
    return jacobian_rank(lambda v: attention(X, unflatten(v, p), cfg).reshape(-1), flatten(p), rtol=rtol)


@pytest.mark.parametrize(
    "cfg",
    [AttentionConfig(16, 4, bias="all", causal=True), AttentionConfig(16, 4, groups=2, bias="qkv", rope_dims=2)],
    ids=str,
)
def test_null_residuals_through_each_group_equal_those_of_the_whole_layer(cfg):
    """The per-group route differentiates each known direction through its own group's mixtures (plus its W_O
    and b_O parts): the same ‖J t‖/‖t‖ as forward mode through the whole layer, for the symmetries and for planted
    directions that are not null (one group's φ with random W_O and b_O parts), which the certificate refuses."""
    from attnid.attention import flatten, init_params, param_slices
    from attnid.audit import CertificateError, _certify, _layer_fn, default_data_size, random_inputs
    from attnid.certify import certification_blocks, null_residuals, null_residuals_by_group

    p = init_params(cfg, seed=0)
    theta = flatten(p)
    B, L = default_data_size(cfg, theta.numel())
    X = random_inputs(cfg, B, L)
    gen = torch.Generator().manual_seed(3)
    where = param_slices(p)
    planted = torch.zeros(theta.numel(), 3, dtype=torch.float64)
    for j, g in enumerate((0, cfg.G - 1, 0)):  # group g's query, key and value coordinates, and all of W_O, b_O
        for k in ("W_Q", "b_Q", "W_K", "b_K", "W_V", "b_V", "W_O", "b_O"):
            if k in p:
                rows = torch.arange(where[k].start, where[k].stop)
                rows = rows if k in ("W_O", "b_O") else rows.reshape(cfg.G, -1)[g]
                planted[rows, j] = torch.randn(len(rows), generator=gen, dtype=torch.float64)
    T = torch.cat([_tangent(cfg), planted], 1)
    f = _layer_fn(cfg, p, X)
    blocks, wo_min = certification_blocks(cfg, p, X, f, T, 1e-9)
    assert wo_min is not None and len(blocks) == cfg.G  # every direction touches one group: the per-group route
    for b in blocks:
        b.shape = (B, L)
    whole = null_residuals(f, theta, T, 16)
    grouped = null_residuals_by_group(cfg, p, X, T, blocks, 16)
    assert torch.allclose(grouped, whole, rtol=1e-10, atol=1e-12)
    assert (whole[-3:] > 1e-2).all() and whole[:-3].max() < 1e-10  # the plants are not null, the symmetries are
    with pytest.raises(CertificateError, match=r"3 of the \d+ supplied directions are not null"):
        _certify(cfg, p, X, directions=T)
