"""Phantoms of any size: the expected agreement is estimated on a sample above a size, not enumerated."""
from __future__ import annotations

import numpy as np

from core.phantoms import expert
from core.phantoms.expert import PhantomTruth, all_triplets, uniform_triplets


def test_uniform_triplets_are_distinct_and_uniform():
    t = uniform_triplets(np.random.default_rng(0), 5, 120_000)
    assert ((t[:, 0] != t[:, 1]) & (t[:, 0] != t[:, 2]) & (t[:, 1] != t[:, 2])).all()
    _, counts = np.unique(t, axis=0, return_counts=True)
    assert len(counts) == 60 and counts.min() > 0.9 * 2000 and counts.max() < 1.1 * 2000  # 5·4·3 ordered, 2,000 each


def test_expected_agreement_is_sampled_above_the_exact_size(monkeypatch):
    latent = np.random.default_rng(1).standard_normal((30, 3))
    truth = PhantomTruth([f"p{i}" for i in range(30)], latent, 0.5, 0.1, 0, [])
    exact = truth.expected_agreement()
    assert exact == truth.expected_agreement(all_triplets(30))
    monkeypatch.setattr(expert, "EXACT_AGREEMENT_MAX", 10)
    monkeypatch.setattr(expert, "all_triplets", lambda n: (_ for _ in ()).throw(AssertionError("enumerated")))
    assert abs(truth.expected_agreement() - exact) < 0.005
