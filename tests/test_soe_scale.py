"""SOE at registry scale: the per-triplet gradient and the sampled-step path."""
from __future__ import annotations

import numpy as np
import torch

from core.text import soe as soe_module
from core.text.soe import SOE, hinge_sq_loss_and_grad, hinge_sq_loss_and_grad_sparse, triplet_margins


def planted(n: int, m: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 2))
    t = np.array([rng.choice(n, 3, replace=False) for _ in range(m)])
    flip = triplet_margins(x, t) < 0
    t[flip, 1], t[flip, 2] = t[flip, 2], t[flip, 1].copy()
    return x, t


def test_sparse_gradient_equals_the_dense_one():
    g = torch.Generator().manual_seed(0)
    n = 12
    x = torch.randn(n, 3, generator=g, dtype=torch.float64)
    t = torch.as_tensor(planted(n, 200, 1)[1])
    w = torch.rand(200, generator=g, dtype=torch.float64)
    dense = hinge_sq_loss_and_grad(x, t[:, 0] * n + t[:, 1], t[:, 0] * n + t[:, 2], w, 0.3)
    sparse = hinge_sq_loss_and_grad_sparse(x, t, w, 0.3)
    assert torch.allclose(dense[0], sparse[0]) and torch.allclose(dense[1], sparse[1])
    xr = x.clone().requires_grad_(True)
    (w * soe_module.hinge_sq(xr, t[:, 0], t[:, 1], t[:, 2], 0.3)).sum().backward()
    assert torch.allclose(xr.grad, sparse[1])


def test_large_inputs_take_sampled_steps_and_still_fit(monkeypatch):
    _, t = planted(40, 3000, 2)
    monkeypatch.setattr(soe_module, "LARGE_TRIPLETS", 1000)
    monkeypatch.setattr(soe_module, "LARGE_BATCH", 500)
    monkeypatch.setattr(soe_module, "DENSE_MAX_OBJECTS", 10)
    seen = []
    sparse = soe_module.hinge_sq_loss_and_grad_sparse
    monkeypatch.setattr(soe_module, "hinge_sq_loss_and_grad_sparse",
                        lambda x, rows, w, margin: seen.append(len(rows)) or sparse(x, rows, w, margin))
    est = SOE(n_components=2, epochs=150, n_objects=40, random_state=0, device="cpu").fit(t)
    assert seen == [500] * 150 and len(est.loss_curve_) == 150
    assert est.score(t) > 0.9
    again = SOE(n_components=2, epochs=150, n_objects=40, random_state=0, device="cpu").fit(t)
    assert np.array_equal(est.embedding_, again.embedding_)  # seeded on the device's own generator
