"""Wound tokens, the feature cache / token bank, and ragged attention pooling."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from scipy import ndimage

from annotations.infra.workspace import Workspace
from core.vision.backbones import load_backbone
from core.vision.features import FeatureCache, PhotoFeatures, TokenBank, token_mask, wound_fractions, wound_tokens
from core.vision.pooling import AttentionPooling, MeanPooling, WoundHead, segment_softmax


def test_fractions_equal_area_pooling_and_small_wounds_get_one_token():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 4, (224, 224))
    frac = wound_fractions(labels, [1, 3], (14, 14))
    onehot = torch.stack([torch.from_numpy(labels == i).float() for i in (1, 3)])
    assert torch.allclose(frac, F.avg_pool2d(onehot[None], 16)[0])
    labels = np.zeros((224, 224), np.int64)
    labels[0:64, 0:64] = 1  # exactly 4×4 cells
    labels[100:103, 200:202] = 2  # 6 pixels: no cell is half covered
    labels[150, 17:19] = 2  # ... and a 2-pixel second piece: the best cell is the first one
    toks = wound_tokens(labels, [1, 2, 5], (14, 14))
    assert sorted(toks[0].tolist()) == [r * 14 + c for r in range(4) for c in range(4)]
    assert toks[1].tolist() == [6 * 14 + 12]
    assert toks[2].numel() == 0  # absent wound
    assert token_mask(torch.full((1, 2, 2), 0.5)).all()


@pytest.mark.parametrize("shape", [(3, 224, 224), (230, 197)])
def test_fractions_count_every_pixel_in_its_cell_exactly(shape):
    """Equal blocks (an augmented view, a batch) and uneven bins (a full-size mask) against a pixel-by-pixel count."""
    labels = np.random.default_rng(1).integers(0, 4, shape).astype(np.int32)
    gh, gw = 7, 7
    hm, wm = shape[-2:]
    cell = (np.arange(hm)[:, None] * gh // hm) * gw + (np.arange(wm)[None] * gw // wm)
    flat = labels.reshape(-1, hm, wm)
    want = np.stack([[np.bincount(cell[lab == i], minlength=gh * gw) for i in (1, 3)] for lab in flat])
    area = np.bincount(cell.ravel(), minlength=gh * gw)
    want = torch.from_numpy((want.astype(np.float32) / area.astype(np.float32)).reshape(*shape[:-2], 2, gh, gw))
    assert torch.equal(wound_fractions(labels, [1, 3], (gh, gw)), want)


def test_attention_weights_nonnegative_sum_to_one_per_wound_and_zero_outside():
    g = torch.Generator().manual_seed(0)
    c, h, w = 8, 6, 6
    labels = np.zeros((96, 96), np.int64)
    labels[0:40, 0:40] = 1
    labels[60:96, 50:90] = 2
    labels[45, 45] = 3  # one pixel
    frac = wound_fractions(labels, [1, 2, 3], (h, w))
    photo = PhotoFeatures([1, 2, 3], torch.randn(2, c, h, w, generator=g).half(), frac[None].repeat(2, 1, 1, 1).half(),
                          torch.randn(c, h, w, generator=g).half(), frac)
    bank = TokenBank({"p": photo}, [("p", 1), ("p", 2), ("p", 3)])
    pool = AttentionPooling(c, 16)
    with torch.no_grad():
        pooled, weights = pool(bank.eval_tokens, bank.eval_segment, 3)
    assert (weights >= 0).all()
    sums = torch.zeros(3).index_add_(0, bank.eval_segment, weights)
    assert torch.allclose(sums, torch.ones(3))
    masks = token_mask(frac)
    for e in range(3):
        dense = torch.zeros(h, w)
        sel = bank.eval_segment == e
        dense[bank.eval_pos[sel, 0], bank.eval_pos[sel, 1]] = weights[sel]
        assert (dense[~masks[e]] == 0).all()  # no attention outside the wound
        assert (dense[masks[e]] > 0).all()
        manual = (weights[sel, None] * bank.eval_tokens[sel]).sum(0)
        assert torch.allclose(pooled[e], manual, atol=1e-6)
    assert (bank.eval_segment == 2).sum() == 1  # the one-pixel wound still has a token
    mean, _ = MeanPooling()(bank.eval_tokens, bank.eval_segment, 3)
    assert torch.allclose(mean[0], bank.eval_tokens[bank.eval_segment == 0].mean(0), atol=1e-6)
    head = WoundHead(c, dim=12, pooling="attention")
    z, _ = head(bank.eval_tokens, bank.eval_segment, 3)
    assert z.shape == (3, 12)


def test_segment_softmax_matches_dense_softmax():
    logits = torch.tensor([1.0, 2.0, 3.0, -1.0, 1000.0])
    seg = torch.tensor([0, 0, 0, 1, 1])
    out = segment_softmax(logits, seg, 2)
    assert torch.allclose(out[:3], torch.softmax(logits[:3], 0))
    assert torch.allclose(out[3:], torch.softmax(logits[3:], 0))


def test_token_bank_gather_and_view_sampling():
    g = torch.Generator().manual_seed(0)
    frac = torch.zeros(3, 2, 4, 4)
    frac[:, 0, 0, :2] = 1.0          # wound 0: 2 tokens in every view
    frac[0, 1, 3, 3] = 1.0           # wound 1: only in view 0
    photo = PhotoFeatures([1, 2], torch.randn(3, 5, 4, 4, generator=g).half(), frac.half(),
                          torch.randn(5, 4, 4, generator=g).half(), frac[0])
    bank = TokenBank({"p": photo}, [("p", 1), ("p", 2)])
    assert bank.length.tolist() == [[2, 2, 2], [1, 0, 0]]
    tokens, seg = bank.gather(torch.tensor([1, 0]), torch.tensor([0, 2]))
    assert seg.tolist() == [0, 1, 1]
    assert torch.equal(tokens[0], photo.views[0, :, 3, 3].float())
    assert torch.equal(tokens[1:], photo.views[2, :, 0, :2].T.float())
    v1, v2 = bank.sample_views(torch.tensor([0, 1] * 20), g)
    assert (v1[::2] != v2[::2]).all()          # two different views when there are several
    assert (v1[1::2] == 0).all() and (v2[1::2] == 0).all()  # the only valid view


@pytest.fixture(scope="module")
def tiny_ws(tiny_phantom_workspace) -> Workspace:
    return tiny_phantom_workspace(3, 4, 2, 6, 10)


def test_feature_cache_is_reused_and_extended(tiny_ws):
    bb = load_backbone("efficientnet-lite0@stage5", device="cpu", pretrained=False)
    calls = []
    forward = bb._features.forward
    bb._features.forward = lambda x: calls.append(len(x)) or forward(x)
    cache = FeatureCache(tiny_ws, bb)
    image_id = tiny_ws.store.images()[0]["image_id"]
    first = cache.photo(image_id, 2)
    assert first.views.shape[:2] == (2, 112) and first.views.dtype == torch.float16
    assert calls == [1, 2]  # inference view, then the two augmented views
    again = cache.photo(image_id, 2)
    assert calls == [1, 2] and torch.equal(again.views, first.views)
    more = cache.photo(image_id, 3)
    assert calls == [1, 2, 1] and torch.equal(more.views[:2], first.views)
    assert [views for _, views in cache.index().values()] == [3]  # one photo in the merged index, 3 views
    fresh = cache.photo(image_id, 3, use_cache=False)  # recomputed: same deterministic views
    assert torch.allclose(fresh.views.float(), more.views.float(), atol=1e-2)


def test_cache_keys_change_with_layer_weights_and_seed(tiny_ws):
    stage5 = load_backbone("efficientnet-lite0@stage5", device="cpu")
    full = load_backbone("efficientnet-lite0@full", device="cpu")
    roots = {FeatureCache(tiny_ws, stage5).root, FeatureCache(tiny_ws, full).root,
             FeatureCache(tiny_ws, stage5, seed=1).root,
             FeatureCache(tiny_ws, load_backbone("efficientnet-lite0@stage5", device="cpu", pretrained=False)).root}
    assert len(roots) == 4
    assert FeatureCache(tiny_ws, stage5).root == FeatureCache(tiny_ws, stage5).root  # stable for the same inputs
    image_id = tiny_ws.store.images()[0]["image_id"]
    a = FeatureCache(tiny_ws, stage5).photo(image_id, 2)
    b = FeatureCache(tiny_ws, full).photo(image_id, 2)  # never the stage-5 file
    assert a.views.shape[1] == 112 and b.views.shape[1] == 1280
    seed1 = FeatureCache(tiny_ws, stage5, seed=1).photo(image_id, 2)
    assert not torch.equal(seed1.views, a.views)  # the run seed draws other views
    assert torch.equal(seed1.eval_feat, a.eval_feat)  # the un-augmented view is the same


def test_tokens_for_all_medetec_wounds(medetec_dir: Path):
    total = 0
    for path in sorted((medetec_dir / "images").glob("*.png")):
        mask = np.asarray(Image.open(medetec_dir / "masks" / path.name))
        binary = (mask.max(axis=2) if mask.ndim == 3 else mask) > 0
        labels, n = ndimage.label(binary)
        toks = wound_tokens(labels, range(1, n + 1), (14, 14))
        assert all(t.numel() >= 1 for t in toks), path.name
        total += n
    assert total == 60


def test_wound_head_pooling_choice_defaults_and_output():
    torch.manual_seed(0)
    tokens, segment = torch.randn(7, 6), torch.tensor([0, 0, 1, 1, 1, 2, 2])
    mean_head = WoundHead(6, dim=5, pooling="mean")
    z, w = mean_head(tokens, segment, 3)
    assert isinstance(mean_head.pool, MeanPooling)
    assert torch.allclose(w, torch.tensor([1 / 2] * 2 + [1 / 3] * 3 + [1 / 2] * 2))
    # the predictor ends in a LayerNorm (default affine 1, 0): every wound row has mean 0 and variance 1
    assert torch.allclose(z.mean(1), torch.zeros(3), atol=1e-5) and torch.allclose(z.var(1, unbiased=False),
                                                                                   torch.ones(3), atol=1e-3)
    head = WoundHead(6)  # attention pooling, 512-d output, 128 hidden units by default
    z, w = head(tokens, segment, 3)
    assert z.shape == (3, 512) and head.pool.score[0].out_features == 128
    assert torch.allclose(torch.zeros(3).index_add_(0, segment, w), torch.ones(3), atol=1e-6)
    with pytest.raises(ValueError, match=r"^pooling must be 'attention' or 'mean', got 'max'$"):
        WoundHead(6, pooling="max")


def test_attention_scores_are_nonlinear_in_the_tokens():
    """The scorer is Linear → tanh → Linear: scaling the tokens does not just scale the logits."""
    torch.manual_seed(1)
    pool = AttentionPooling(4, hidden=8)
    x = torch.randn(5, 4)
    s1, s3 = pool.score(x).squeeze(-1), pool.score(3 * x).squeeze(-1)
    bias = pool.score(torch.zeros(1, 4)).squeeze()
    assert not torch.allclose(s3 - bias, 3 * (s1 - bias), atol=1e-4)
