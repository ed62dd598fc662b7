"""Trained points: an attention layer audited at given weights on the inputs its LayerNorm gives it."""

import pytest
import torch

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
    for layer in (0, 1):
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
    r = audit_point(m, tokens, 1)
    assert r["unidentified"] - r["generic"] == collapsed_query_dims(cfg, rank, hyperplane_inputs=True) > 0
    c = audit_point(m, tokens, 1, method="certify")  # the certificate refuses a special point
    assert not c["at_generic"] and c["note"].startswith("not certified")
