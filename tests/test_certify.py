"""The pieces of certify's per-group route against direct computations: the Jacobian through the activations, the
Gram of its query/key columns, the known directions' complement, the Gram factor and its rounding bound, and the
sparse known directions."""

import math

import numpy as np
import pytest
import scipy.sparse
import torch
from torch.func import jacrev

import attnid.certify as C
from attnid.attention import AttentionConfig, flatten, head_mixtures, init_params, unflatten
from attnid.audit import CertificateError, _layer_fn, audit, default_data_size, random_inputs
from attnid.certify import activations, blocks, linalg, strategies
from attnid.counting import count
from attnid.symmetry import qk_direction, qk_generators, tangent_basis, tangent_rows, vo_direction

GROUP_CONFIGS = [
    AttentionConfig(8, 2, bias="all", causal=True),
    AttentionConfig(8, 2, bias="none"),
    AttentionConfig(8, 4, groups=2, bias="qkv", rope_dims=2),  # GQA: two heads per group, partial RoPE
    AttentionConfig(8, 2, bias="kvo", rope=True, causal=True),
    AttentionConfig(8, 2, head_dim=3, value_dim=2, bias="k", logit_softcap=2.0),
    AttentionConfig(8, 2, groups=1, bias="qv"),  # MQA
]


def _group(cfg, g=0, seq_len=None):
    """Group ``g``'s parameters, the single-group config, inputs and the group's activations."""
    p = init_params(cfg, seed=1)
    B, L = default_data_size(cfg, flatten(p).numel(), ratio=1.5, seq_len=seq_len)
    X = random_inputs(cfg, B, L, seed=2)
    names = [k for k in p if k not in ("W_O", "b_O")]
    pg = {k: p[k].reshape(cfg.G, -1)[g].reshape(-1, *p[k].shape[1:]) for k in names}
    sub = cfg.with_(heads=cfg.H // cfg.G, groups=1)
    return pg, sub, X, C.GroupActivations.at(X, pg, sub, chunk=16)


@pytest.mark.parametrize("cfg", GROUP_CONFIGS, ids=str)
def test_the_jacobian_through_the_activations_is_the_jacobian(cfg):
    """Every column of GroupActivations (``∂Z/∂[W b]`` from the activations' Jacobians and the inputs) equals reverse
    mode through the whole group to 1e-12, channel by channel, in the coordinates of ``ext_order``; so does its
    product with random directions (``tangent``)."""
    pg, sub, X, acts = _group(cfg, g=cfg.G - 1)
    theta = flatten(pg)
    full = jacrev(lambda v: head_mixtures(X, unflatten(v, pg), sub))(theta)  # (B, n, C, L, n_g)
    order = acts.ext_order("QKV")
    assert sorted(order.tolist()) == list(range(theta.numel()))  # every coordinate once
    scale = full.abs().max()
    for c in range(sub.C):
        want = full[:, :, c].permute(1, 0, 2, 3).reshape(-1, theta.numel())[:, order]  # rows (k, b, i)
        assert (acts.columns("QKV", c) - want).abs().max() <= 1e-12 * scale
    t = torch.randn(theta.numel(), 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    want = torch.einsum("bkcln,nm->mbkcl", full, t)
    assert (acts.tangent(t) - want).abs().max() <= 1e-12 * scale * t.abs().sum(0).max()


@pytest.mark.parametrize("cfg", GROUP_CONFIGS[:4], ids=str)
def test_the_query_key_gram_equals_the_gram_of_the_columns(cfg):
    """query_key_gram, formed from the activations without the Jacobian, equals Σ_c J_cᵀ J_c of the query/key columns
    to 1e-12, and its scale (the absolute Jacobian's squared norm) is at least ‖J‖_F²."""
    _, sub, _, acts = _group(cfg)
    G, scale = acts.query_key_gram()
    J = [acts.columns("QK", c) for c in range(sub.C)]
    want = sum(j.T @ j for j in J)
    assert (G - want).abs().max() <= 1e-12 * want.abs().max()
    assert scale >= sum(float((j**2).sum()) for j in J) * (1 - 1e-12)


def test_a_mixing_that_is_not_the_layers_is_refused(monkeypatch):
    """The chain rule through the activations is checked against forward mode through the whole group: a planted
    mixing (the mixtures doubled where certify differentiates, not in the layer) fails the check by name."""
    cfg = AttentionConfig(8, 2, bias="all")
    p = init_params(cfg, seed=1)
    X = random_inputs(cfg, 3, 4)
    pg = {k: p[k][:1] for k in p if k not in ("W_O", "b_O")}
    sub = cfg.with_(heads=1, groups=1)
    C.GroupActivations.at(X, pg, sub, chunk=8)  # the control: the true mixing passes
    real = activations.mix_heads
    monkeypatch.setattr(activations, "mix_heads", lambda *a: {"Z": 2 * real(*a)["Z"]})
    with pytest.raises(CertificateError, match="differs from forward mode"):
        C.GroupActivations.at(X, pg, sub, chunk=8)


def _explicit_complement(T):
    """An orthonormal basis of the complement of T's columns from the full Q of its QR."""
    Q = torch.linalg.qr(T, mode="complete").Q
    return Q[:, T.shape[1] :]


@pytest.mark.parametrize("unit", [False, True], ids=["random", "unit vectors (τ = 0 reflectors)"])
def test_the_complement_of_the_known_directions(unit):
    """``M Q_⊥`` through the compact WY form spans and measures the same as an explicit basis of the complement (the
    two bases differ by an orthogonal map: equal Gram matrices and singular values), written over M, and the Gram
    taken to the complement on both sides equals ``Q_⊥ᵀ G Q_⊥`` of the same basis."""
    g = torch.Generator().manual_seed(0)
    n, k = 30, 7
    if unit:  # directions that are coordinate axes: geqrf returns reflectors with τ = 0
        T = torch.eye(n, dtype=torch.float64)[:, [0, 1, 5, 2, 9, 3, 29]]
    else:
        T = torch.randn(n, k, generator=g, dtype=torch.float64)
    qr, t_cond = linalg._householder(T, 1e-9)
    assert t_cond > 1e-3
    if unit:
        assert (qr[1] == 0).any()
    V, T_inv = linalg._compact_wy(qr)
    Q = torch.eye(n, dtype=torch.float64) - V @ torch.linalg.solve_triangular(T_inv, V.T, upper=True)
    assert (Q.T @ Q - torch.eye(n, dtype=torch.float64)).abs().max() < 1e-13  # the WY form is orthogonal
    assert (T.T @ Q[:, k:]).abs().max() < 1e-13  # and its trailing columns are the complement
    M = torch.randn(12, n, generator=g, dtype=torch.float64)
    want = M @ _explicit_complement(T)
    written = M.clone()
    got = linalg._on_complement(written, qr)
    assert torch.allclose(got @ got.T, want @ want.T, atol=1e-12)
    assert torch.allclose(got, M @ Q[:, k:], atol=1e-13)
    assert got.data_ptr() == written[:, k:].data_ptr()  # in place: a view of M's last columns
    A = torch.randn(n, n, generator=g, dtype=torch.float64)
    G = A @ A.T
    upper = np.asfortranarray(G.numpy())
    both = torch.from_numpy(blocks._gram_on_complement(upper, qr)).triu()
    want2 = (Q[:, k:].T @ G @ Q[:, k:]).triu()
    assert (both - want2).abs().max() <= 1e-12 * G.abs().max()


def test_the_gram_factor_and_its_bound():
    """The Cholesky factor of BᵀB is an R of B up to the stated bound (its singular values move by at most err), the
    exact route is a QR's R, and a B with fewer rows than columns has no factor; a planted column scale of 1e-9 puts
    the bound above GRAM_MARGIN σ_min², where certify takes the QR."""
    g = torch.Generator().manual_seed(0)
    B = torch.randn(300, 40, generator=g, dtype=torch.float64)
    R, err = linalg._gram_factor(B, exact=False)
    s = torch.linalg.svdvals(B)
    assert 0 < err < 1e-10 * s[0] ** 2
    assert (torch.linalg.svdvals(R) ** 2 - s**2).abs().max() <= err
    R_qr, err_qr = linalg._gram_factor(B, exact=True)
    assert err_qr == 0.0 and torch.allclose(R_qr.T @ R_qr, B.T @ B, atol=1e-10)
    assert linalg._gram_factor(B[:30], exact=False) == (None, 0.0)
    B[:, 0] *= 1e-9
    _, err = linalg._gram_factor(B, exact=False)
    assert err > C.GRAM_MARGIN * float(torch.linalg.svdvals(B)[-1]) ** 2  # certify would take the QR here


def test_a_group_is_certified_alike_by_its_gram_and_by_the_qr(monkeypatch):
    """One group's triangular factor from the Gram route (the query/key Gram less WᵀW, both sides on the complement,
    the Cholesky), from the Gram of the rows and from the exact route (GRAM_MARGIN = -1: the QR of the rows) have the
    same singular values to 1e-10 of the largest, and the routes' estimates agree with them to the power iterations'
    tolerance."""
    cfg = AttentionConfig(16, 2, bias="all", causal=True)
    p = init_params(cfg, seed=0)
    B, L = default_data_size(cfg, flatten(p).numel(), ratio=1.5)
    X = random_inputs(cfg, B, L)
    T = C.direction_rows(tangent_rows(p, cfg)[0])
    blocks, _ = C.certification_blocks(cfg, p, X, _layer_fn(cfg, p, X), T, 1e-9)
    out = C.output_block(cfg, p, X, 1e-9)
    factors = []
    real = strategies._block_triangular_singular_values

    def keep(R_s, n_c, B1, R22, gen):
        R = torch.zeros(len(B1) + len(R22), len(B1) + len(R22), dtype=torch.float64)
        n1 = len(B1)
        R[:n1, :n1], R[:n1, n1:], R[n1:, n1:] = torch.block_diag(*[R_s] * n_c), B1, R22
        factors.append(torch.linalg.svdvals(R))
        return real(R_s, n_c, B1, R22, gen)

    monkeypatch.setattr(strategies, "_block_triangular_singular_values", keep)
    low, high = C.group_singular_values(blocks[1], out.Qz, torch.Generator().manual_seed(0))
    monkeypatch.setattr(strategies, "GRAM_MARGIN", -1.0)
    low_qr, high_qr = C.group_singular_values(blocks[1], out.Qz, torch.Generator().manual_seed(0))
    assert len(factors) == 4  # the query/key Gram; then, refused by the margin, it again, the rows' Gram and the QR
    gram_sv, rows_sv, qr_sv = factors[0], factors[2], factors[3]
    for sv in (gram_sv, rows_sv):
        assert (sv - qr_sv).abs().max() <= 1e-10 * qr_sv[0]
    assert low == pytest.approx(low_qr, rel=1e-3) and high == pytest.approx(high_qr, rel=1e-3)
    assert low_qr == pytest.approx(float(qr_sv[-1]), rel=1e-3) and high_qr == pytest.approx(float(qr_sv[0]), rel=1e-3)


def test_qk_norm_ties_the_groups():
    """QK-norm's weight is shared by the groups, so certify never splits such a layer by group."""
    assert C.splits_by_group(AttentionConfig(16, 4, bias="all"))
    assert not C.splits_by_group(AttentionConfig(16, 4, bias="all", qk_norm="head"))
    assert not C.splits_by_group(AttentionConfig(8, 4, head_dim=2, value_dim=3))  # H·C > E: W_O not injective


def test_known_directions_as_sparse_rows():
    """The tangent directions are built as sparse rows: each QK and VO row the flat direction of qk_direction and
    vo_direction for its generator (written independently, one dense direction at a time), no stored zero, the
    same numbers as the dense basis; a dense (n, k) tensor becomes the same rows, and NaN stays (a direction with
    NaN is not null)."""
    cfg = AttentionConfig(16, 4, groups=2, bias="all", rope_dims=2)
    p = init_params(cfg, seed=0)
    rows, blocks = tangent_rows(p, cfg)
    dense = torch.cat(list(tangent_basis(p, cfg).values()), 1)
    assert isinstance(rows, scipy.sparse.csr_array) and (rows.data != 0).all()
    assert torch.equal(torch.from_numpy(rows.toarray()).T, dense)
    gens, j = qk_generators(cfg), blocks["qk"].start
    for g in range(cfg.G):
        for S0 in gens:
            S = torch.zeros(cfg.G, cfg.D, cfg.D, dtype=torch.float64)
            S[g] = S0
            assert torch.allclose(torch.from_numpy(rows[[j]].toarray()[0]), flatten(qk_direction(p, cfg, S)))
            j += 1
    j = blocks["vo"].start
    for g in range(cfg.G):
        for i in range(cfg.C**2):
            S = torch.zeros(cfg.G, cfg.C * cfg.C, dtype=torch.float64)
            S[g, i] = 1.0
            want = flatten(vo_direction(p, cfg, S.reshape(cfg.G, cfg.C, cfg.C)))
            assert torch.allclose(torch.from_numpy(rows[[j]].toarray()[0]), want)
            j += 1
    assert sum(sl.stop - sl.start for sl in blocks.values()) == dense.shape[1] == count(cfg).unidentified
    again = C.direction_rows(dense)
    assert (again != rows).nnz == 0
    dense[5, 2] = math.nan
    assert math.isnan(C.direction_rows(dense)[2, 5])


def test_a_wide_layer_takes_the_query_key_gram(monkeypatch):
    """The route of the E = 128 audit (per group, value split, query/key Gram) at E = 32: the count equals the closed
    form, every group takes the Gram route, and the certificate is clear."""
    cfg = AttentionConfig(32, 8, bias="all")
    seen = []
    real = strategies._gram_on_complement

    def spy(*a, **k):
        seen.append(1)
        return real(*a, **k)

    monkeypatch.setattr(strategies, "_gram_on_complement", spy)
    r = audit(cfg, method="certify")
    assert r.unidentified == count(cfg).unidentified and r.details["certificate"] == "per-group QR"
    assert len(seen) == cfg.G and r.sv_gap > 1e6
