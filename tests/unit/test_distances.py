"""The one pairwise-distance function: arrays through scipy, tensors through torch on their device."""
from __future__ import annotations

import numpy as np
import torch

from core.eval.distances import pairwise_euclidean


def test_arrays_and_tensors_agree_with_the_definition() -> None:
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(7, 5)), rng.normal(size=(3, 5))
    brute = np.array([[np.linalg.norm(a - b) for b in y] for a in x])
    assert np.allclose(pairwise_euclidean(x, y), brute)
    assert np.allclose(pairwise_euclidean(x, y, squared=True), brute ** 2)
    d = pairwise_euclidean(x)
    assert d.shape == (7, 7) and np.all(np.diag(d) == 0) and np.allclose(d, d.T)
    t = pairwise_euclidean(torch.from_numpy(x), torch.from_numpy(y))
    assert isinstance(t, torch.Tensor) and t.dtype == torch.float64 and np.allclose(t.numpy(), brute)
    tx = torch.from_numpy(x).requires_grad_(True)
    own = pairwise_euclidean(tx)
    assert torch.all(torch.diagonal(own) == 0) and np.allclose(own.detach().numpy(), d)
    sq = pairwise_euclidean(tx, squared=True)
    sq.sum().backward()  # differentiable: the SOE fit's gradients flow through it
    assert np.allclose(sq.detach().numpy(), d ** 2) and tx.grad is not None
