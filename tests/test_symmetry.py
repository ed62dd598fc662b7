import pytest
import torch

from attnid.attention import AttentionConfig, attention, flatten, init_params, unflatten
from attnid.rope import random_commutant
from attnid.symmetry import (
    absorb_value_bias,
    qk_direction,
    shift_key_bias,
    tangent_basis,
    transform_qk,
    transform_vo,
)

CFG = AttentionConfig(12, 3, bias="all", causal=True)


def _X(cfg, seed=1):
    return torch.randn(2, cfg.E, 6, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _ill_conditioned(n, cond, seed):
    g = torch.Generator().manual_seed(seed)
    U, _ = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64))
    V, _ = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64))
    return U @ torch.diag(torch.logspace(0, torch.log10(torch.tensor(cond)).item(), n, dtype=torch.float64)) @ V.T


def test_qk_and_vo_transforms_leave_outputs_unchanged():
    p, X = init_params(CFG, seed=0), _X(CFG)
    Y = attention(X, p, CFG)
    g = torch.Generator().manual_seed(3)
    for S in (
        torch.randn(3, 4, 4, generator=g, dtype=torch.float64),
        torch.stack([_ill_conditioned(4, 1e4, s) for s in range(3)]),
    ):
        assert (attention(X, transform_qk(p, CFG, S), CFG) - Y).abs().max() <= 1e-10
        assert (attention(X, transform_vo(p, CFG, S), CFG) - Y).abs().max() <= 1e-10
    # a generic perturbation of W_Q does change the output
    q = dict(p, W_Q=p["W_Q"] * 1.01)
    assert (attention(X, q, CFG) - Y).abs().max() > 1e-4


def test_gqa_transform_is_per_group():
    cfg = AttentionConfig(8, 4, groups=2, bias="qkv")
    p, X = init_params(cfg, seed=1), _X(cfg)
    S = torch.randn(2, 2, 2, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    assert (attention(X, transform_qk(p, cfg, S), cfg) - attention(X, p, cfg)).abs().max() <= 1e-10


def test_rope_commutant_invariance_but_not_generic_S():
    cfg = AttentionConfig(8, 2, bias="qk", rope=True, causal=True)
    p, X = init_params(cfg, seed=2), _X(cfg)
    Y = attention(X, p, cfg)
    g = torch.Generator().manual_seed(0)
    S = torch.stack([random_commutant(4, g) for _ in range(2)])
    assert (attention(X, transform_qk(p, cfg, S), cfg) - Y).abs().max() <= 1e-10
    S_generic = torch.randn(2, 4, 4, generator=g, dtype=torch.float64)
    assert (attention(X, transform_qk(p, cfg, S_generic), cfg) - Y).abs().max() > 1e-3


def test_bias_invariances():
    p, X = init_params(CFG, seed=0), _X(CFG)
    Y = attention(X, p, CFG)
    delta = torch.randn(3, 4, generator=torch.Generator().manual_seed(9), dtype=torch.float64) * 10
    assert (attention(X, shift_key_bias(p, delta), CFG) - Y).abs().max() <= 1e-10
    absorbed = absorb_value_bias(p, CFG)
    assert absorbed["b_V"].abs().max() == 0
    assert (attention(X, absorbed, CFG) - Y).abs().max() <= 1e-10


def test_tangents_have_zero_derivative_and_second_order_change():
    cfg = AttentionConfig(8, 2, groups=1, bias="all", causal=True)
    p, X = init_params(cfg, seed=0), _X(cfg)
    theta = flatten(p)

    def f(v):
        return attention(X, unflatten(v, p), cfg)

    T = torch.cat(list(tangent_basis(p, cfg).values()), dim=1)
    assert T.shape[1] == 16 + 16 + 4 + 4
    assert torch.linalg.matrix_rank(T) == T.shape[1]
    J_T = torch.stack([torch.func.jvp(f, (theta,), (T[:, j],))[1] for j in range(T.shape[1])])
    assert J_T.abs().max() <= 1e-10
    # a finite step along a QK tangent changes Y at second order: ΔY(t) / ΔY(t/2) ≈ 4
    S = torch.randn(1, 4, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    d = flatten(qk_direction(p, cfg, S))
    dy = [(f(theta + t * d) - f(theta)).abs().max().item() for t in (1e-2, 5e-3)]
    assert dy[0] > 1e-8
    assert abs(dy[0] / dy[1] - 4.0) < 0.1


def test_step_response_slopes():
    import numpy as np

    from attnid.symmetry import step_response

    cfg = AttentionConfig(8, 2, bias="qk")
    p, X = init_params(cfg, seed=0), _X(cfg)
    S = torch.randn(2, 4, 4, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    steps = torch.logspace(-4, -2, 5).tolist()
    tangent = step_response(p, cfg, X, qk_direction(p, cfg, S), steps).numpy()
    generic = {k: torch.randn_like(v) for k, v in p.items()}
    other = step_response(p, cfg, X, generic, steps).numpy()

    def slope(y):
        return np.polyfit(np.log(steps), np.log(y), 1)[0]

    assert abs(slope(tangent) - 2) < 0.05 and abs(slope(other) - 1) < 0.05


def test_bias_gradients_key_bias_is_zero():
    from attnid.symmetry import bias_gradient_norms

    p, X = init_params(CFG, seed=0), _X(CFG)
    g = bias_gradient_norms(p, CFG, X)
    assert g["b_K"] <= 1e-12 and g["b_Q"] > 1e-3 and g["b_V"] > 1e-3 and g["b_O"] > 1e-3
    rope = AttentionConfig(12, 3, bias="all", rope=True, causal=True)
    assert bias_gradient_norms(init_params(rope, seed=0), rope, X)["b_K"] > 1e-3


def test_gradient_is_orthogonal_to_the_value_bias_direction():
    from attnid.attention import AttentionConfig, init_params
    from attnid.symmetry import bias_gradients, value_bias_direction

    cfg = AttentionConfig(12, 4, groups=2, bias="all", causal=True)
    p = init_params(cfg, seed=1)
    X = torch.randn(3, 12, 7, dtype=torch.float64)
    g = bias_gradients(p, cfg, X, seed=2)
    d = value_bias_direction(p, cfg, torch.randn(cfg.G, cfg.C, dtype=torch.float64))
    along = sum(float((g[k] * d[k]).sum()) for k in d)
    assert float(g["b_V"].norm()) > 1e-2 and abs(along) < 1e-12 * float(g["b_V"].norm())


def test_partial_rope_symmetries():
    """With RoPE on the first R of D dimensions: any S on the other D − R (plus the rotated blocks'
    commutant) leaves the output unchanged, and so does a key-bias shift on the unrotated coordinates;
    a matrix coupling the two parts, or a shift of a rotated coordinate, does not."""
    from attnid.rope import apply_rope, commutant_basis

    cfg = AttentionConfig(12, 2, head_dim=6, bias="qk", rope_dims=2, causal=True)
    assert cfg.rope and cfg.R == 2
    p, X = init_params(cfg, seed=3), _X(cfg)
    Y = attention(X, p, cfg)
    g = torch.Generator().manual_seed(1)
    assert commutant_basis(6, 2).shape == (2 + 16, 6, 6)
    S = torch.stack([random_commutant(6, g, rope_dims=2) for _ in range(2)])
    assert (attention(X, transform_qk(p, cfg, S), cfg) - Y).abs().max() <= 1e-10
    coupling = torch.eye(6, dtype=torch.float64).expand(2, 6, 6).clone()
    coupling[:, 0, 4] = 0.5  # mixes an unrotated coordinate into a rotated one
    assert (attention(X, transform_qk(p, cfg, coupling), cfg) - Y).abs().max() > 1e-3
    shift = torch.zeros(2, 6, dtype=torch.float64)
    shift[:, 2:] = torch.randn(2, 4, generator=g, dtype=torch.float64)
    assert (attention(X, shift_key_bias(p, shift), cfg) - Y).abs().max() <= 1e-12
    shift[:, 0] = 1.0
    assert (attention(X, shift_key_bias(p, shift), cfg) - Y).abs().max() > 1e-3
    # full RoPE is R = D; the unrotated rows pass through unchanged
    Z = torch.randn(3, 6, 5, generator=g, dtype=torch.float64)
    assert torch.equal(apply_rope(Z, dims=6), apply_rope(Z))
    assert torch.equal(apply_rope(Z, dims=2)[:, 2:], Z[:, 2:])


@pytest.mark.parametrize("R", [0, 3, 10, -2])
def test_bad_rope_dims_are_refused(R):
    with pytest.raises(ValueError, match="rope_dims must be an even integer"):
        AttentionConfig(16, 2, rope_dims=R)
