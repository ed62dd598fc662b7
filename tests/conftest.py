import pytest
import torch

torch.set_default_dtype(torch.float64)


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(0)
