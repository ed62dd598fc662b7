"""The invariants of a layer (chapter 10, attnid.invariants): complete (they compute the layer), exactly as
many as the identified directions (their Jacobian's rank), unchanged by every symmetry of the book (float64,
1e-10), and changed by what is not a symmetry."""

from __future__ import annotations

import pytest
import torch

from attnid.attention import AttentionConfig, attention, flatten, init_params, unflatten
from attnid.counting import count
from attnid.dynamics import rebalance_params, trade_groups
from attnid.invariants import (
    attention_from_invariants,
    fold_layernorm,
    head_matching,
    invariant_distance,
    layer_invariants,
)
from attnid.lm.gpt import GPT, GPTConfig
from attnid.lm.points import (
    gpt_layer_invariants,
    identified_moves,
    layer_params,
    model_distances,
    raw_distance,
    symmetry_moves,
)
from attnid.rope import random_commutant
from attnid.symmetry import absorb_value_bias, shift_key_bias, transform_qk, transform_vo

TOL = 1e-10
CONFIGS = {
    "plain": AttentionConfig(8, 2, bias="all"),
    "rope causal": AttentionConfig(8, 2, bias="all", causal=True, rope=True),
    "partial rope gqa": AttentionConfig(8, 4, groups=2, bias="qkv", rope=True, rope_dims=2),
    "qk-norm head": AttentionConfig(8, 2, bias="all", qk_norm="head"),
    "qk-norm proj rope gqa": AttentionConfig(8, 4, groups=2, bias="all", qk_norm="proj", rope=True),
    "qk-norm eps": AttentionConfig(8, 2, bias="all", qk_norm="head", qk_norm_eps=0.1),
    "softcap": AttentionConfig(8, 2, bias="kv", logit_softcap=2.0),
    "value bias only": AttentionConfig(8, 2, bias="v"),
}


def _X(cfg: AttentionConfig, seed: int = 0) -> torch.Tensor:
    return torch.randn(3, cfg.E, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def _dist(cfg: AttentionConfig, p: dict, q: dict) -> float:
    return invariant_distance(layer_invariants(cfg, p), layer_invariants(cfg, q), relative=True)


@pytest.mark.parametrize("name", CONFIGS)
def test_the_invariants_compute_the_layer(name):
    cfg = CONFIGS[name]
    p, X = init_params(cfg, seed=1), _X(cfg)
    Y = attention(X, p, cfg)
    assert (attention_from_invariants(layer_invariants(cfg, p), X) - Y).abs().max() < TOL * Y.abs().max()


@pytest.mark.parametrize("name", CONFIGS)
def test_the_invariants_jacobian_has_the_rank_of_the_identified_directions(name):
    """Null space = the unidentified directions exactly: constant along each, changed by every other one."""
    cfg = CONFIGS[name]
    p = init_params(cfg, seed=2)
    theta = flatten(p)
    J = torch.func.jacrev(lambda t: layer_invariants(cfg, unflatten(t, p)).vector())(theta)
    s = torch.linalg.svdvals(J)
    identified = theta.numel() - count(cfg).unidentified
    assert s[identified - 1] > 1e-6 * s[0]  # every identified direction moves the invariants
    assert identified == len(s) or s[identified] < 1e-12 * s[0]  # and nothing else does


def _permute_heads(cfg: AttentionConfig, p: dict, seed: int) -> dict:
    """Heads permuted within their key/value groups, and the groups among themselves."""
    g = torch.Generator().manual_seed(seed)
    n = cfg.H // cfg.G
    groups = torch.randperm(cfg.G, generator=g)
    heads = torch.cat([groups[k] * n + torch.randperm(n, generator=g) for k in range(cfg.G)])
    out = dict(p)
    for k, v in p.items():
        if k in ("W_Q", "b_Q", "W_O") or (k == "g_Q" and v.dim() == 2):
            out[k] = v[heads]
        elif k in ("W_K", "b_K", "W_V", "b_V") or (k == "g_K" and v.dim() == 2):
            out[k] = v[groups]
    return out


def _qk_gl(cfg: AttentionConfig, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if cfg.rope:
        return torch.stack([random_commutant(cfg.D, g, cfg.R) for _ in range(cfg.G)])
    return torch.randn(cfg.G, cfg.D, cfg.D, dtype=torch.float64, generator=g) + 2 * torch.eye(cfg.D)


def _symmetries(cfg: AttentionConfig, p: dict) -> dict[str, dict]:
    """Every symmetry of the book that applies to ``cfg``, applied to ``p`` (checked against the output)."""
    g = torch.Generator().manual_seed(5)
    out = {"permutation": _permute_heads(cfg, p, 3)}
    C = torch.randn(cfg.G, cfg.C, cfg.C, dtype=torch.float64, generator=g) + 2 * torch.eye(cfg.C)
    out["vo GL"] = transform_vo(p, cfg, C)
    if not cfg.qk_norm:
        out["qk GL (RoPE commutant)" if cfg.rope else "qk GL"] = transform_qk(p, cfg, _qk_gl(cfg, 6))
        if cfg.G == cfg.H:
            out["rebalancing"] = rebalance_params(p, cfg)
        if "k" in cfg.bias and cfg.logit_softcap is None:
            delta = torch.zeros(cfg.G, cfg.D, dtype=torch.float64)
            delta[:, cfg.R :] = torch.randn(cfg.G, cfg.D - cfg.R, dtype=torch.float64, generator=g)
            out["key bias shift"] = shift_key_bias(p, delta)
    else:
        trade = dict(p)
        d = torch.ones(p["g_K"].shape, dtype=torch.float64)
        for grp in trade_groups(cfg):
            d[..., grp] = torch.rand(d.shape[:-1], dtype=torch.float64, generator=g)[..., None] + 0.5
        q_factor = d if d.dim() == 1 else d.repeat_interleave(cfg.H // cfg.G, 0)
        trade["g_Q"], trade["g_K"] = p["g_Q"] * q_factor, p["g_K"] / d
        out["norm-weight trade"] = trade
        if cfg.qk_norm_eps == 0:
            scaled = dict(p)
            scaled["W_Q"], scaled["b_Q"] = 3.0 * p["W_Q"], 3.0 * p["b_Q"]
            out["projection scale"] = scaled
    if "o" in cfg.bias and "v" in cfg.bias:
        out["value bias into output bias"] = absorb_value_bias(p, cfg)
    return out


@pytest.mark.parametrize("name", CONFIGS)
def test_every_symmetry_leaves_the_invariants_equal(name):
    cfg = CONFIGS[name]
    p, X = init_params(cfg, seed=4), _X(cfg, 1)
    Y = attention(X, p, cfg)
    for sym, q in _symmetries(cfg, p).items():
        assert (attention(X, q, cfg) - Y).abs().max() < TOL * Y.abs().max(), sym  # a symmetry indeed
        assert _dist(cfg, p, q) < TOL, sym


def test_head_matching_undoes_a_permutation_and_a_non_symmetry_is_measured():
    cfg = CONFIGS["partial rope gqa"]
    p = init_params(cfg, seed=7)
    q = _permute_heads(cfg, p, 1)
    a, b = layer_invariants(cfg, p), layer_invariants(cfg, q)
    perm = head_matching(a, b)
    for k in a.heads:
        assert (a.heads[k] - b.heads[k][perm]).abs().max() < TOL
    assert sorted(perm) == list(range(cfg.H)) and perm != list(range(cfg.H))
    # planted: the output maps of two heads swapped alone, or one output map scaled: not symmetries
    swapped = dict(p)
    swapped["W_O"] = p["W_O"][[1, 0, 2, 3]]
    scaled = dict(p)
    scaled["W_O"] = p["W_O"].clone()
    scaled["W_O"][2] *= 1.001
    assert _dist(cfg, p, swapped) > 0.05
    assert 1e-5 < _dist(cfg, p, scaled) < 1e-3


def test_distance_refuses_different_architectures():
    a = layer_invariants(CONFIGS["plain"], init_params(CONFIGS["plain"]))
    b = layer_invariants(CONFIGS["softcap"], init_params(CONFIGS["softcap"]))
    with pytest.raises(ValueError, match="different architectures"):
        invariant_distance(a, b)
    with pytest.raises(ValueError, match=r"\['b_O'\] missing"):
        layer_invariants(CONFIGS["plain"], {k: v for k, v in init_params(CONFIGS["plain"]).items() if k != "b_O"})


# ------------------------------------------------------------------------------ a GPT: LayerNorm folded in
def _gpt() -> GPT:
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=8, n_layer=2, n_head=2, n_embd=8, vocab_size=11)).double()
    with torch.no_grad():  # off nanoGPT's symmetric init (zero biases, unit norms): a generic point
        for prm in model.parameters():
            prm.add_(0.3 * torch.randn_like(prm))
    return model


def test_a_gpts_symmetries_leave_its_layer_invariants_equal():
    model = _gpt()
    tokens = torch.randint(0, 11, (2, 8), generator=torch.Generator().manual_seed(0))
    logits = model(tokens)[0]
    moves = symmetry_moves(model)
    assert set(moves) == {
        "rebalancing", "value–output map", "norm-weight trade", "LayerNorm hyperplane", "head permutation"
    }  # fmt: skip
    for name, m in moves.items():
        assert (m(tokens)[0] - logits).abs().max() < 1e-9 * logits.abs().max(), name  # a symmetry indeed
        assert max(model_distances(model, m)) < TOL, name
        assert max(raw_distance(model, m, k) for k in (0, 1)) > 1e-3, name  # the weights did move
    for name, m in identified_moves(model).items():  # planted: moves that change the function
        d0, d1 = model_distances(model, m)
        assert d0 > 1e-3 and d1 < TOL, name
        assert (m(tokens)[0] - logits).abs().max() > 1e-4 * logits.abs().max(), name


def test_fold_layernorm_is_the_layer_behind_its_norm():
    model = _gpt()
    block = model.blocks[0]
    cfg, p = layer_params(block.attn)
    x = torch.randn(2, 8, 8, dtype=torch.float64)  # (B, L, E) residual stream
    with torch.no_grad():
        direct = block.attn(block.ln_1(x))
        z = torch.nn.functional.layer_norm(x, (8,), eps=block.ln_1.eps)  # the standardised input
        folded = attention(z.transpose(1, 2), fold_layernorm(cfg, p, block.ln_1.weight, block.ln_1.bias)[1], cfg)
    assert (folded.transpose(1, 2) - direct).abs().max() < 1e-12
    assert gpt_layer_invariants(model, 0).cfg == cfg
