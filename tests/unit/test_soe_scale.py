"""SOE at registry scale: the per-triplet gradient and the sampled-step path."""
from __future__ import annotations

import numpy as np
import pytest
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
    chunked = hinge_sq_loss_and_grad_sparse(x, t, w, 0.3, chunk=7)  # 200 = 28 chunks of 7 + one of 4
    assert torch.allclose(chunked[0], sparse[0]) and torch.allclose(chunked[1], sparse[1])
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


def test_both_gradient_paths_fit_the_same_embedding_and_auto_picks_by_size(monkeypatch):
    _, t = planted(30, 2000, 2)
    fits = {g: SOE(n_components=2, epochs=60, n_objects=30, random_state=0, device="cpu", gradient=g).fit(t)
            for g in ("dense", "sparse")}
    # float32 sums in another order: Adam's normalised steps let the rounding grow, not the loss differ
    np.testing.assert_allclose(fits["dense"].embedding_, fits["sparse"].embedding_, atol=0.05)
    assert abs(fits["dense"].score(t) - fits["sparse"].score(t)) < 0.01 and fits["dense"].score(t) > 0.9
    seen = []
    sparse = soe_module.hinge_sq_loss_and_grad_sparse
    monkeypatch.setattr(soe_module, "hinge_sq_loss_and_grad_sparse",
                        lambda x, rows, w, margin: seen.append(len(rows)) or sparse(x, rows, w, margin))
    SOE(n_components=2, epochs=3, n_objects=30, random_state=0, device="cpu").fit(t)
    assert seen == []  # 30 objects ≤ DENSE_MAX_OBJECTS: the n×n path
    monkeypatch.setattr(soe_module, "DENSE_MAX_OBJECTS", 29)
    SOE(n_components=2, epochs=3, n_objects=30, random_state=0, device="cpu").fit(t)
    assert seen == [len(t)] * 3
    with pytest.raises(ValueError, match="gradient must be one of"):
        SOE(gradient="fast").fit(t)
