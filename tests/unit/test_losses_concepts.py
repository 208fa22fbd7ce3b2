"""MAKE, ConceptCLIP and unimodal losses: reductions to CLIP and hand-computed values."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from core.losses.conceptclip import ConceptCLIPLoss, rc_align, region_concept_score, sigmoid_it_align
from core.losses.make import MAKELoss, clip_infonce, diagnosis_weights, knowledge_enhanced_visual
from core.losses.unimodal import CLIPUnimodalLoss, nt_xent


def _unit(*shape: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return F.normalize(torch.randn(*shape, generator=g), dim=-1)


def test_clip_infonce_hand_computed() -> None:
    img = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    txt = torch.tensor([[1.0, 0.0], [0.6, 0.8]])
    s = 2.0
    # logits = s * [[1, 0.6], [0, 0.8]]
    logits = s * torch.tensor([[1.0, 0.6], [0.0, 0.8]])
    i2t = -(torch.log_softmax(logits, 1)[0, 0] + torch.log_softmax(logits, 1)[1, 1]) / 2
    t2i = -(torch.log_softmax(logits.T, 1)[0, 0] + torch.log_softmax(logits.T, 1)[1, 1]) / 2
    assert clip_infonce(img, txt, s).item() == pytest.approx(((i2t + t2i) / 2).item(), abs=1e-6)


def test_make_k0_unit_weights_is_clip() -> None:
    n, p, d = 6, 5, 8
    img, txt, patches = _unit(n, d, seed=1), _unit(n, d, seed=2), _unit(n, p, d, seed=3)
    scale = torch.tensor(7.0)
    empty = torch.zeros(n, 0, d)
    loss = MAKELoss(lam=0.7)(img, patches, txt, empty, empty, torch.zeros(n, 0, dtype=torch.bool), scale)
    assert loss.item() == pytest.approx(clip_infonce(img, txt, scale).item(), abs=1e-6)
    # aspect texts identical to the raw caption and no sub-captions: still CLIP
    same = txt[:, None].expand(n, 2, d)
    loss2 = MAKELoss(lam=0.7, use_weights=False)(img, patches, txt, same, empty, torch.zeros(n, 0, dtype=torch.bool), scale)
    assert loss2.item() == pytest.approx(clip_infonce(img, txt, scale).item(), abs=1e-6)


def test_make_subcaptions_change_loss_and_masked_slots_are_ignored() -> None:
    n, p, d, k = 5, 4, 8, 3
    img, txt, patches = _unit(n, d, seed=4), _unit(n, d, seed=5), _unit(n, p, d, seed=6)
    subs, aspects = _unit(n, k, d, seed=7), _unit(n, 2, d, seed=8)
    mask = torch.ones(n, k, dtype=torch.bool)
    mask[0, 1:] = False
    scale = torch.tensor(5.0)
    base = MAKELoss(lam=0.7)(img, patches, txt, aspects, subs, mask, scale)
    # changing a masked-out sub-caption must not change the loss
    subs2 = subs.clone()
    subs2[0, 2] = _unit(d, seed=99)
    assert MAKELoss(lam=0.7)(img, patches, txt, aspects, subs2, mask, scale).item() == pytest.approx(base.item(), abs=1e-6)
    assert base.item() != pytest.approx(clip_infonce(img, txt, scale).item(), abs=1e-3)
    assert torch.isfinite(base)


def test_make_lambda_weighs_the_summed_terms_as_eq8() -> None:
    """Eq. 8 weighs the *sums* of eqs. 3–4 and 6: L = (Σ mkcl + λ Σ slra) / #pairs, λ = 0.7.
    Hand computation on a 2-image toy with one sub-caption for image 0 and none for image 1."""
    img = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    raw = torch.tensor([[0.6, 0.8], [0.0, 1.0]])
    subs = torch.tensor([[[0.8, 0.6]], [[1.0, 0.0]]])  # image 1's sub-caption is masked out
    mask = torch.tensor([[True], [False]])
    patches = torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[0.0, 1.0], [1.0, 0.0]]])
    s = 2.0
    def lse(*v):
        return math.log(sum(math.exp(x) for x in v))
    # raw slot: logits s·img·rawᵀ = 2·[[0.6, 0], [0.8, 1]]
    raw_pairs = 0.5 * ((lse(1.2, 0.0) - 1.2) + (lse(1.2, 1.6) - 1.2)) + 0.5 * ((lse(1.6, 2.0) - 2.0) + (lse(0.0, 2.0) - 2.0))
    # sub slot, only image 0 valid: i2t over the valid text only (→ 0), t2i over both images
    sub_pair = 0.5 * (0.0 + (lse(1.6, 1.2) - 1.6))
    # e^k: z_0 = max(raw_0·v, 0) = [0.6, 0.8] → e_0 ∝ [0.6, 0.8]; z_1 = [1, 0] → e_1 = [0, 1]
    slra_0 = lse(2 * (0.8 * 0.6 + 0.6 * 0.8), 2 * 0.6) - 2 * 0.96
    expected = (raw_pairs + sub_pair + 0.7 * slra_0) / 3  # 3 valid image–text pairs
    empty = torch.zeros(2, 0, 2)
    got = MAKELoss(lam=0.7, use_weights=False)(img, patches, raw, empty, subs, mask, torch.tensor(s))
    assert got.item() == pytest.approx(expected, abs=1e-5)
    # averaging each term over its own count would weigh slra by 0.7 · 3/1 instead of 0.7
    assert got.item() != pytest.approx((raw_pairs + sub_pair) / 3 + 0.7 * slra_0, abs=1e-3)


def test_diagnosis_weights_max_normalised() -> None:
    dis = torch.tensor([[1.0, 0.0]])
    subs = torch.tensor([[[1.0, 0.0], [0.5, 0.866], [-1.0, 0.0]]])
    w = diagnosis_weights(dis, subs, torch.ones(1, 3, dtype=torch.bool))
    assert torch.allclose(w, torch.tensor([[1.0, 0.5, 0.0]]))


def test_knowledge_enhanced_visual_weights_relevant_patches() -> None:
    raw = torch.tensor([[1.0, 0.0]])
    patches = torch.tensor([[[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0]]])  # only patch 0 has z > 0
    assert torch.allclose(knowledge_enhanced_visual(patches, raw), torch.tensor([[1.0, 0.0]]), atol=1e-5)


def test_sigmoid_it_align_hand_computed_2x2() -> None:
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    y = torch.tensor([[0.8, 0.6], [0.0, 1.0]])
    t, b = 10.0, -5.0
    dots = [[0.8, 0.0], [0.6, 1.0]]  # x_m · y_n
    def sig(v):
        return 1.0 / (1.0 + math.exp(-v))
    total = 0.0
    for m in range(2):
        for n in range(2):
            z = 1.0 if m == n else -1.0
            total += math.log(sig(z * (t * dots[m][n] + b)))
    expected = -total / 2
    assert sigmoid_it_align(x, y, t, b).item() == pytest.approx(expected, rel=1e-6)


def test_rc_align_picks_planted_patch() -> None:
    d, p = 4, 6
    concept = F.normalize(torch.tensor([1.0, 0.0, 0.0, 0.0]), dim=0)
    patches = _unit(2, p, d, seed=11) * 0.3
    patches[:, :, 0] = -0.5  # every patch dissimilar to the concept...
    patches = F.normalize(patches, dim=-1)
    patches[0, 3] = concept  # ...except the planted patch 3 of image 0
    patches.requires_grad_(True)
    concepts = torch.stack([concept[None], concept[None]])  # each text has this one concept
    cmask = torch.ones(2, 1, dtype=torch.bool)
    t, b = 10.0, -2.0
    s = region_concept_score(patches, concepts, cmask, t, b)
    assert s[0, 0].item() == pytest.approx(F.logsigmoid(torch.tensor(t * 1.0 + b)).item(), abs=1e-6)
    loss = rc_align(patches, concepts, cmask, t, b)
    loss.backward()
    g = patches.grad[0].norm(dim=-1)
    assert g.argmax().item() == 3 and (g[torch.arange(p) != 3] == 0).all()


def test_conceptclip_alpha0_is_it_align() -> None:
    img, txt, patches, conc = _unit(3, 4, seed=1), _unit(3, 4, seed=2), _unit(3, 5, 4, seed=3), _unit(3, 2, 4, seed=4)
    sc, bi = (torch.tensor(10.0), torch.tensor(10.0)), (torch.tensor(-10.0), torch.tensor(-10.0))
    m = torch.ones(3, 2, dtype=torch.bool)
    assert ConceptCLIPLoss(alpha=0.0)(img, txt, patches, conc, m, sc, bi).item() == pytest.approx(
        sigmoid_it_align(img, txt, sc[0], bi[0]).item())
    assert ConceptCLIPLoss(alpha=0.5)(img, txt, patches, conc, m, sc, bi).item() > sigmoid_it_align(img, txt, sc[0], bi[0]).item()


def test_unimodal_lambda1_is_clip_and_nt_xent_prefers_aligned_views() -> None:
    img, txt = _unit(4, 8, seed=1), _unit(4, 8, seed=2)
    v1, v2 = _unit(4, 8, seed=3), _unit(4, 8, seed=4)
    s = torch.tensor(5.0)
    assert CLIPUnimodalLoss(8, lam=1.0)(img, txt, s, v1, v2).item() == pytest.approx(clip_infonce(img, txt, s).item(), abs=1e-7)
    assert nt_xent(v1, v1 + 0.01 * v2).item() < nt_xent(v1, v2).item()


def test_unimodal_term_goes_through_its_own_projector() -> None:
    torch.manual_seed(0)
    loss_fn = CLIPUnimodalLoss(in_dim=6, lam=0.25, out_dim=3)
    img, txt, s = _unit(4, 8, seed=1), _unit(4, 8, seed=2), torch.tensor(5.0)
    f1, f2 = torch.randn(4, 6), torch.randn(4, 6)
    g = loss_fn.projector
    expected = 0.25 * clip_infonce(img, txt, s) + 0.75 * nt_xent(g(f1), g(f2), 0.1)
    loss = loss_fn(img, txt, s, f1, f2)
    assert loss.item() == pytest.approx(expected.item(), abs=1e-6)
    loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in g.parameters())


def test_siglip_loss_is_it_align_with_its_scale_and_bias() -> None:
    from core.losses.conceptclip import SigLIPLoss

    g = torch.Generator().manual_seed(3)
    x, y = (torch.nn.functional.normalize(torch.randn(3, 4, generator=g), dim=1) for _ in range(2))
    t, b = torch.tensor(5.0), torch.tensor(-2.0)
    assert SigLIPLoss()(x, y, t, b).item() == pytest.approx(sigmoid_it_align(x, y, t, b).item(), rel=1e-6)
    assert SigLIPLoss()(x, y, t, b).item() != pytest.approx(sigmoid_it_align(x, y, b, t).item(), rel=1e-3)
