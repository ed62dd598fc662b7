import pytest
import torch

from attnid.attention import AttentionConfig, attention, init_params
from attnid.dynamics import (
    augment,
    beta,
    head_beta_drift,
    qk_singular_values,
    rebalance_qk,
    solve_sylvester,
    tau,
    unidentified_step_fraction,
)


def _qk(D=4, E=12, heads=(), seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(*heads, D, E, generator=g, dtype=torch.float64),
        torch.randn(*heads, D, E, generator=g, dtype=torch.float64),
    )


def test_sylvester_residual():
    Q, K = _qk(heads=(2, 3))
    GQ, GK = Q @ Q.mT, K @ K.mT
    C = torch.randn(2, 3, 4, 4, dtype=torch.float64)
    S = solve_sylvester(GQ, GK, C)
    assert (S @ GQ + GK @ S - C).abs().max() <= 1e-10


def _loss_grad(Q, K, M):
    """Gradient of 0.5‖Kᵀ Q − M‖², a loss that sees (Q, K) only through Kᵀ Q."""
    R = K.mT @ Q - M
    return K @ R, Q @ R.mT  # dL/dQ, dL/dK


def test_gradient_step_is_orthogonal_to_invariant_subspace():
    Q, K = _qk(heads=(3,))
    M = torch.randn(12, 12, dtype=torch.float64)
    A, B = _loss_grad(Q, K, M)
    assert unidentified_step_fraction(Q, K, -A, -B).max() <= 1e-20


def test_step_along_subspace_has_rho_one():
    Q, K = _qk(heads=(3,))
    S = torch.randn(3, 4, 4, dtype=torch.float64)
    rho = unidentified_step_fraction(Q, K, S @ Q, -S.mT @ K)
    assert (rho - 1).abs().max() <= 1e-10


def test_zero_update_gives_nan_not_a_spike():
    Q, K = _qk()
    assert torch.isnan(unidentified_step_fraction(Q, K, torch.zeros_like(Q), torch.zeros_like(K)))


def test_rebalance_keeps_outputs_and_zeroes_beta():
    cfg = AttentionConfig(12, 3, bias="all", causal=True)
    p = init_params(cfg, seed=0)
    p["W_Q"] = p["W_Q"] * 3.0  # unbalance the heads
    p["b_K"] = p["b_K"] * 0.2
    X = torch.randn(2, 12, 7, dtype=torch.float64)
    W_Q, b_Q, W_K, b_K = rebalance_qk(p["W_Q"], p["b_Q"], p["W_K"], p["b_K"])
    q = dict(p, W_Q=W_Q, b_Q=b_Q, W_K=W_K, b_K=b_K)
    assert (attention(X, q, cfg) - attention(X, p, cfg)).abs().max() <= 1e-10
    Qa, Ka = augment(W_Q, b_Q), augment(W_K, b_K)
    assert beta(Qa, Ka).abs().max() <= 1e-10
    # the balanced point has the smallest norm on the orbit: ‖Q‖² + ‖K‖² = 2 ‖Kᵀ Q‖_*
    norm2 = (Qa**2).sum((-1, -2)) + (Ka**2).sum((-1, -2))
    nuclear = qk_singular_values(Qa, Ka).sum(-1)
    assert (norm2 - 2 * nuclear).abs().max() <= 1e-9
    before = augment(p["W_Q"], p["b_Q"]), augment(p["W_K"], p["b_K"])
    assert ((before[0] ** 2).sum() + (before[1] ** 2).sum()) > norm2.sum() + 1e-3


def test_qk_singular_values_match_the_product():
    Q, K = _qk()
    ref = torch.linalg.svdvals(K.mT @ Q)[:4]
    assert (qk_singular_values(Q, K) - ref).abs().max() <= 1e-10


def test_beta_drift_of_gradient_steps_is_second_order():
    Q, K = _qk(D=3, E=6)
    M = torch.randn(6, 6, dtype=torch.float64)
    b0 = beta(Q, K)
    drifts = []
    for lr in (1e-2, 1e-3):
        A, B = _loss_grad(Q, K, M)
        drifts.append(head_beta_drift(beta(Q - lr * A, K - lr * B), b0).item())
    assert 70 < drifts[0] / drifts[1] < 130
    assert tau(Q, K).shape == ()


def test_rebalancing_under_rope_uses_the_commutant_only():
    from attnid.dynamics import rebalance_qk_rope

    cfg = AttentionConfig(12, 3, bias="all", rope=True, causal=True)
    p = init_params(cfg, seed=1)
    p["W_Q"] = p["W_Q"] * 3.0
    X = torch.randn(2, 12, 9, dtype=torch.float64)
    Y = attention(X, p, cfg)
    W_Q, b_Q, W_K, b_K = rebalance_qk_rope(p["W_Q"], p["b_Q"], p["W_K"], p["b_K"])
    q = dict(p, W_Q=W_Q, b_Q=b_Q, W_K=W_K, b_K=b_K)
    assert (attention(X, q, cfg) - Y).abs().max() <= 1e-10
    Qa, Ka = augment(W_Q, b_Q), augment(W_K, b_K)

    def pair(M):
        return (M * M).sum(-1).reshape(3, 2, 2).sum(-1)

    assert (pair(Qa) - pair(Ka)).abs().max() <= 1e-10  # every frequency pair balanced
    assert beta(Qa, Ka).abs().max() > 1e-3  # but beta is not zero
    # the unrestricted rebalance is not a symmetry of a RoPE layer
    full = rebalance_qk(p["W_Q"], p["b_Q"], p["W_K"], p["b_K"])
    q = dict(p, W_Q=full[0], b_Q=full[1], W_K=full[2], b_K=full[3])
    assert (attention(X, q, cfg) - Y).abs().max() > 1e-3


def test_rope_rebalance_handles_the_rotate_half_layout():
    """rotate_half pairs rows (i, i + D/2) where this package pairs (2i, 2i+1): the two layouts differ by a
    fixed row permutation, and the rebalance commutes with it. An unknown layout is refused."""
    from attnid.dynamics import rebalance_qk_rope

    g = torch.Generator().manual_seed(4)
    W_Q, W_K = (torch.randn(2, 6, 7, generator=g, dtype=torch.float64) * s for s in (3.0, 1.0))
    b_Q, b_K = torch.randn(2, 6, generator=g, dtype=torch.float64), torch.randn(2, 6, generator=g, dtype=torch.float64)
    perm = torch.tensor([0, 2, 4, 1, 3, 5])  # interleaved row 2i -> i, 2i+1 -> i + D/2
    inter = rebalance_qk_rope(W_Q, b_Q, W_K, b_K)
    half = rebalance_qk_rope(W_Q[:, perm], b_Q[:, perm], W_K[:, perm], b_K[:, perm], layout="half")
    for a, b in zip(inter, half):
        assert (a[:, perm] - b).abs().max() <= 1e-12
    mixed = rebalance_qk_rope(W_Q[:, perm], b_Q[:, perm], W_K[:, perm], b_K[:, perm])  # the wrong pairing
    assert (mixed[0] - half[0]).abs().max() > 1e-3
    with pytest.raises(ValueError, match="layout"):
        rebalance_qk_rope(W_Q, b_Q, W_K, b_K, layout="neox")


def test_several_updates_share_one_solve():
    from attnid import dynamics

    g = torch.Generator().manual_seed(5)
    Q, K = torch.randn(3, 4, 4, 9, generator=g), torch.randn(3, 4, 4, 9, generator=g)
    A, B = torch.randn(2, 3, 4, 4, 9, generator=g), torch.randn(2, 3, 4, 4, 9, generator=g)
    both = dynamics.unidentified_step_fraction(Q, K, A, B)
    for i in range(2):
        assert torch.allclose(both[i], dynamics.unidentified_step_fraction(Q, K, A[i], B[i]), atol=1e-14)


def test_rope_layers_are_refused_or_rebalanced_on_the_commutant():
    import pytest

    from attnid import dynamics

    cfg = AttentionConfig(16, 4, bias="all", rope=True, causal=True)
    p = init_params(cfg, seed=0)
    X = torch.randn(2, 16, 12, dtype=torch.float64)
    with pytest.raises(ValueError, match="RoPE"):
        dynamics.rebalance_qk(p["W_Q"], p["b_Q"], p["W_K"], p["b_K"], rope=True)
    with pytest.raises(ValueError, match="RoPE"):
        dynamics.unidentified_step_fraction(p["W_Q"], p["W_K"], p["W_Q"], p["W_K"], rope=True)
    for c in (cfg, cfg.with_(rope=False)):
        q = init_params(c, seed=0)
        out = attention(X, dynamics.rebalance_params(q, c), c)
        assert (out - attention(X, q, c)).abs().max() < 1e-10
    full = dynamics.rebalance_qk(p["W_Q"], p["b_Q"], p["W_K"], p["b_K"])  # what the refusal prevents
    bad = dict(p, W_Q=full[0], b_Q=full[1], W_K=full[2], b_K=full[3])
    assert (attention(X, bad, cfg) - attention(X, p, cfg)).abs().max() > 1e-3
