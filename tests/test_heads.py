import numpy as np
import pytest
import torch

from attnid.attention import attention_steps, from_fused
from attnid.lm.ablation import effective_rank, head_importance, masked_loss, max_prunable_fraction, pruning_curve
from attnid.lm.data import CharData
from attnid.lm.gpt import GPT, GPTConfig


def _data() -> CharData:
    """A tiny random corpus in the real ``CharData`` (20 symbols)."""
    ids = torch.randint(0, 20, (2000,), generator=torch.Generator().manual_seed(0))
    return CharData(train=ids, val=ids, chars=[chr(ord("a") + i) for i in range(20)])


@pytest.fixture
def model():
    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=20, block_size=16, n_layer=2, n_head=4, n_embd=32))
    with torch.no_grad():  # nanoGPT zero-inits biases and uses tiny weights: make heads matter
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return m


def _batches(n=3):
    from attnid.lm.ablation import fixed_batches

    return fixed_batches(_data(), 4, 16, n, seed=1)


def test_no_mask_reproduces_baseline_exactly(model):
    b = _batches()
    with torch.no_grad():
        model.eval()
        plain = float(np.mean([model(x, y)[1].item() for x, y in b]))
    assert masked_loss(model, b) == pytest.approx(plain, abs=1e-12)
    assert masked_loss(model, b, np.ones((2, 4))) == masked_loss(model, b)


def test_masking_removes_exactly_that_heads_term(model):
    layer = model.attention_layers()[0].double()
    cfg, p = from_fused(layer.c_attn.weight, layer.c_attn.bias, layer.c_proj.weight, layer.c_proj.bias, 4)
    x = torch.randn(2, 10, 32, dtype=torch.float64)
    steps = attention_steps(x.transpose(1, 2), p, cfg)
    layer.eval()
    for h in range(4):
        layer.head_mask = torch.ones(4, dtype=torch.float64)
        layer.head_mask[h] = 0
        y = layer(x).transpose(1, 2)
        expected = steps["Y"] - steps["head_out"][:, h]
        assert (y - expected).abs().max() <= 1e-10
    layer.head_mask = None
    assert (layer(x).transpose(1, 2) - steps["Y"]).abs().max() <= 1e-10


def test_importance_and_pruning_curve(model):
    b = _batches()
    base, imp = head_importance(model, b)
    assert imp.shape == (2, 4) and np.abs(imp).max() > 1e-4
    curve = pruning_curve(model, b, imp)
    assert len(curve) == 9 and curve[0]["loss"] == base and curve[-1]["fraction"] == 1.0
    first = tuple(curve[1]["head"])
    assert imp[first] == imp.min()
    f1, f5 = max_prunable_fraction(curve, 0.01), max_prunable_fraction(curve, 0.05)
    assert 0 <= f1 <= f5 <= 1


def test_max_prunable_fraction_stops_at_first_crossing():
    curve = [
        {"loss": 1.0, "fraction": 0.0},
        {"loss": 1.005, "fraction": 0.25},
        {"loss": 1.2, "fraction": 0.5},
        {"loss": 1.001, "fraction": 0.75},
    ]
    assert max_prunable_fraction(curve, 0.01) == 0.25


def test_effective_rank():
    assert effective_rank([1.0, 0, 0]) == pytest.approx(1.0)
    assert effective_rank([2.0, 2.0, 2.0, 2.0]) == pytest.approx(4.0)
