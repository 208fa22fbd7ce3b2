"""VICReg / InfoNCE / triplet losses of TriDerm-V on hand-computed examples."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from core.losses import InfoNCELoss, TripletLoss, VICRegLoss, covariance_loss, invariance_loss, variance_loss

Z1 = torch.tensor([[0.0, 0.0], [1.0, 1.0]])
Z2 = torch.tensor([[0.0, 1.0], [1.0, 0.0]])


def test_vicreg_terms_and_total_by_hand():
    # s: squared differences 0, 1, 0, 1 → mean 0.5
    assert invariance_loss(Z1, Z2).item() == pytest.approx(0.5)
    # every dimension of both views holds {0, 1}: unbiased var 0.5 → ReLU(1 − sqrt(0.5 + 1e-4))
    v = 1.0 - math.sqrt(0.5 + 1e-4)
    assert variance_loss(Z1).item() == pytest.approx(v)
    assert variance_loss(Z2).item() == pytest.approx(v)
    # covariance [[.5, ±.5], [±.5, .5]]: off-diagonal squares 0.25 + 0.25, / D = 2 → 0.25 per view
    assert covariance_loss(Z1).item() == pytest.approx(0.25)
    assert covariance_loss(Z2).item() == pytest.approx(0.25)
    expected = 25 * 0.5 + 25 * v + 1 * (0.25 + 0.25)
    assert VICRegLoss()(Z1, Z2).item() == pytest.approx(expected, rel=1e-6)
    assert VICRegLoss(lambda_=1, mu=0, nu=0)(Z1, Z2).item() == pytest.approx(0.5)


def test_vicreg_variance_term_penalises_collapse():
    collapsed = torch.ones(8, 4)
    assert variance_loss(collapsed).item() == pytest.approx(1.0 - math.sqrt(1e-4))
    spread = torch.randn(256, 4, generator=torch.Generator().manual_seed(0)) * 3
    assert variance_loss(spread).item() == 0.0


def test_vicreg_rejects_single_sample():
    with pytest.raises(ValueError, match="N ≥ 2"):
        VICRegLoss()(torch.zeros(1, 3), torch.zeros(1, 3))


def test_info_nce_matches_manual_cross_entropy():
    g = torch.Generator().manual_seed(1)
    z1, z2 = torch.randn(5, 8, generator=g), torch.randn(5, 8, generator=g)
    a, b = F.normalize(z1, dim=1), F.normalize(z2, dim=1)
    logits = a @ b.T / 0.1
    manual_ab = -torch.log_softmax(logits, 1).diagonal().mean()
    manual_ba = -torch.log_softmax(logits.T, 1).diagonal().mean()
    assert InfoNCELoss(0.1)(z1, z2).item() == pytest.approx(0.5 * (manual_ab + manual_ba).item(), rel=1e-5)
    aligned = torch.eye(5, 8) * 10
    assert InfoNCELoss(0.1)(aligned, aligned).item() < 1e-3


def test_triplet_batch_hard_by_hand():
    z1 = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    z2 = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    # positives at distance 0, negatives at sqrt(2) > margin → zero loss
    assert TripletLoss(margin=0.2)(z1, z2).item() == 0.0
    # with margin 2: each term ReLU(0 − sqrt 2 + 2)
    assert TripletLoss(margin=2.0)(z1, z2).item() == pytest.approx(2 - math.sqrt(2), rel=1e-6)
    # swapped positives: d(a,p) = sqrt 2, hardest negative 0 → sqrt 2 + 0.2
    assert TripletLoss(margin=0.2)(z1, z2.flip(0)).item() == pytest.approx(math.sqrt(2) + 0.2, rel=1e-6)


def test_expert_triplet_loss_by_hand():
    from core.losses import ExpertTripletLoss

    z = torch.tensor([[3.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    t = torch.tensor([[0, 1, 2], [0, 2, 1]])
    # unit vectors (1, 0), (0, 1), (1, 1)/√2: squared chords d01 = 2, d02 = 2 − √2;
    # [0, 1, 2] costs 0.1 + 2 − (2 − √2), [0, 2, 1] is satisfied by more than the margin
    assert ExpertTripletLoss()(z, t).item() == pytest.approx((0.1 + math.sqrt(2)) / 2, rel=1e-6)
    assert ExpertTripletLoss(margin=0.5)(z, t[:1]).item() == pytest.approx(0.5 + math.sqrt(2), rel=1e-6)
    # raw squared distances d01 = 13, d02 = 5
    assert ExpertTripletLoss(normalize=False)(z, t).item() == pytest.approx((0.1 + 13 - 5) / 2, rel=1e-6)
    assert ExpertTripletLoss(margin=0.0, normalize=False)(z, t[1:]).item() == 0.0
    with pytest.raises(ValueError, match="margin must be ≥ 0"):
        ExpertTripletLoss(margin=-0.1)


def test_expert_triplet_loss_gradient_is_the_same_on_every_call_on_two_threads():
    """Photos repeat across a batch of triplets; their gradient sums must not follow the threads' order
    (with ``z[i]`` indexing 20 calls gave 20 different gradients, so a seeded fine-tune differed run to run)."""
    from core.losses import ExpertTripletLoss
    from core.runtime import torch_threads

    gen = torch.Generator().manual_seed(0)
    z0, t = torch.randn(53, 1280, generator=gen), torch.randint(53, (256, 3), generator=gen)
    grads = []
    with torch_threads(2):
        for _ in range(20):
            z = z0.clone().requires_grad_(True)
            ExpertTripletLoss()(z - z.mean(0), t).backward()
            grads.append(z.grad)
    assert all(torch.equal(g, grads[0]) for g in grads[1:])


def test_info_nce_default_temperature_and_validation():
    g = torch.Generator().manual_seed(2)
    z1, z2 = torch.randn(4, 3, generator=g), torch.randn(4, 3, generator=g)
    assert InfoNCELoss()(z1, z2).item() == pytest.approx(InfoNCELoss(0.1)(z1, z2).item())
    assert InfoNCELoss(0.5)(z1, z2).item() != pytest.approx(InfoNCELoss(0.1)(z1, z2).item())
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match="temperature must be > 0"):
            InfoNCELoss(bad)
