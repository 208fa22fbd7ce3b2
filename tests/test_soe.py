"""SOE: planted-embedding recovery, exact gradient, determinism, input validation."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from core.text.soe import SOE, hinge_sq, hinge_sq_loss_and_grad, triplet_margins


def planted_triplets(n: int = 30, dim: int = 4, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """All (anchor, pair) triplets of ``n`` random points, oriented by the true distances."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, dim))
    t = np.array([(i, j, k) for i in range(n) for j, k in itertools.combinations([o for o in range(n) if o != i], 2)])
    far = triplet_margins(x, t) < 0
    t[far, 1], t[far, 2] = t[far, 2], t[far, 1].copy()
    return x, t


def test_recovers_planted_embedding() -> None:
    x, t = planted_triplets()
    rng = np.random.default_rng(1)
    perm = rng.permutation(len(t))
    train, held = t[perm[: len(t) // 2]], t[perm[len(t) // 2:]]
    soe = SOE(n_components=4, n_objects=30, random_state=0).fit(train)
    assert soe.embedding_.shape == (30, 4)
    assert soe.score(train) >= 0.95
    assert soe.score(held) >= 0.95
    assert soe.loss_curve_[-1] < soe.loss_curve_[0]


def test_paper_protocol_runs_minibatch_and_orders_triplets() -> None:
    _, t = planted_triplets(n=15)
    soe = SOE.paper_protocol(n_objects=15, random_state=0, epochs=10).fit(t)
    assert soe.get_params()["margin"] == 0.0 and soe.batch_size == 2048
    assert len(soe.loss_curve_) == 10
    assert soe.score(t) > 0.6


def test_manual_gradient_matches_autograd() -> None:
    _, t = planted_triplets(n=12)
    tt = torch.as_tensor(t)
    n = 12
    x = torch.randn(n, 3, dtype=torch.float64, requires_grad=True)
    w = torch.rand(len(t), dtype=torch.float64)
    (w * hinge_sq(x, tt[:, 0], tt[:, 1], tt[:, 2], 0.2)).sum().backward()
    loss, grad = hinge_sq_loss_and_grad(x.detach(), tt[:, 0] * n + tt[:, 1], tt[:, 0] * n + tt[:, 2], w, 0.2)
    assert torch.allclose(grad, x.grad, atol=1e-10)
    assert float(loss) == pytest.approx(float((w * hinge_sq(x.detach(), tt[:, 0], tt[:, 1], tt[:, 2], 0.2)).sum()))


def test_deterministic_per_seed() -> None:
    _, t = planted_triplets(n=12)
    a = SOE(n_objects=12, random_state=3, epochs=20).fit(t).embedding_
    b = SOE(n_objects=12, random_state=3, epochs=20).fit(t).embedding_
    c = SOE(n_objects=12, random_state=4, epochs=20).fit(t).embedding_
    assert np.array_equal(a, b)
    assert not np.allclose(a, c)


def test_anchor_balanced_weights_sparse_anchor() -> None:
    """An anchor with few triplets still gets them satisfied when anchors weigh the same."""
    _, t = planted_triplets(n=12)
    rare = t[t[:, 0] == 0][:3]
    t = np.concatenate([t[t[:, 0] != 0], rare])
    soe = SOE(n_objects=12, random_state=0).fit(t)
    assert soe.score(rare) == 1.0


def test_transform_and_warm_start() -> None:
    _, t = planted_triplets(n=10)
    soe = SOE(n_objects=10, random_state=0, epochs=5).fit(t)
    assert np.array_equal(soe.transform([2, 0]), soe.embedding_[[2, 0]])
    warm = SOE(n_objects=10, random_state=0, epochs=1, lr=1e-9).fit(t, init=soe.embedding_)
    assert np.allclose(warm.embedding_, soe.embedding_, atol=1e-5)


@pytest.mark.parametrize(
    "triplets, n, msg",
    [
        ([[0, 1]], 5, "shape"),
        ([[0, 1, 9]], 5, "n_objects=5"),
        ([[0, 0, 1]], 5, "repeats"),
        ([[0, -1, 2]], 5, "negative"),
        ([[0.5, 1, 2]], 5, "integer"),
        (np.zeros((0, 3), int), 5, "empty"),
    ],
)
def test_validation_errors(triplets, n, msg) -> None:
    with pytest.raises(ValueError, match=msg):
        SOE(n_objects=n).fit(triplets)


def test_bad_params_and_unfitted() -> None:
    with pytest.raises(ValueError, match="margin"):
        SOE(margin=-1, n_objects=3).fit([[0, 1, 2]])
    with pytest.raises(ValueError, match="batch_size"):
        SOE(batch_size=0, n_objects=3).fit([[0, 1, 2]])
    with pytest.raises(ValueError, match="not fitted"):
        SOE().score([[0, 1, 2]])
