"""Contrastive benchmark: Recall@K, frozen towers stay bit-identical, λ = 1 unimodal is CLIP."""
from __future__ import annotations

import argparse

import numpy as np
import pytest
import torch

from core.bench_contrastive import recall_at_k, skip_reason, variant_config
from core.concepts import ConceptTagger, load_vocab
from core.train_concepts import TrainConfig, Trainer, WoundPairs, build_text_inputs
from core.vlm import load_vlm

pytestmark = pytest.mark.slow

DESCRIPTIONS = [
    "Deep ulcer, thick yellow fibrin, no crust.", "Superficial erosion with small dark crusts.",
    "Granulating wound bed, mild erythema.", "Hyperkeratotic border, some fibrin.",
    "Shallow wound, no fibrin, fibrotic margins.", "Deep cavity, extensive hemorrhagic crusts.",
    "Beefy red granulation throughout.", "Scarred border, patchy slough.",
]


def test_recall_at_k_hand_computed() -> None:
    sim = np.array([[0.9, 0.1, 0.2],
                    [0.8, 0.5, 0.1],   # the match (0.5) is beaten by 0.8 → rank 2
                    [0.1, 0.4, 0.3]])  # beaten by 0.4 → rank 2
    assert recall_at_k(sim, (1, 2, 3)) == {1: pytest.approx(1 / 3), 2: 1.0, 3: 1.0}
    with pytest.raises(ValueError):
        recall_at_k(np.zeros((2, 3)))


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    model = load_vlm(device="cpu", pretrained=False, dim=16)
    rng = np.random.default_rng(0)
    n = len(DESCRIPTIONS)
    pairs = WoundPairs(keys=[(f"p{i}", 1) for i in range(n)], image_ids=[f"p{i}" for i in range(n)],
                       patient_ids=[f"pt{i}" for i in range(n)], descriptions=DESCRIPTIONS,
                       metadata=[{} for _ in range(n)],
                       crops=rng.integers(0, 255, (n, 64, 64, 3), dtype=np.uint8), boxes=np.zeros((n, 4), int))
    texts = build_text_inputs(pairs, ConceptTagger(load_vocab()))
    init = {k: v.clone() for k, v in model.state_dict().items()}
    return model, pairs, texts, init


def _args(**kw) -> argparse.Namespace:
    base = dict(epochs=1, batch=4, lr=1e-2, tower_lr=1e-2, partial_image=2, partial_text=3, lam=0.5)
    return argparse.Namespace(**{**base, **kw})


def _snapshot(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _same(a: dict, b: dict) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("variant", ["image_frozen", "text_frozen", "image_partial", "text_partial"])
def test_frozen_parameters_bit_identical_after_a_step(setup, variant: str) -> None:
    model, pairs, texts, init = setup
    model.load_state_dict(init)
    cfg = variant_config(variant, _args(), seed=0)
    trainer = Trainer(model, pairs, texts, cfg)
    img_blocks = [_snapshot(b) for b in model.image.blocks]
    img_stem = [p.detach().clone() for p in model.image.stem_parameters()]
    txt_layers = [_snapshot(layer) for layer in model.text.layers()]
    txt_stem = [p.detach().clone() for p in model.text.stem_parameters()]
    trainer.fit(np.arange(len(pairs)), progress=False)
    img_same = [_same(s, b.state_dict()) for s, b in zip(img_blocks, model.image.blocks)]
    txt_same = [_same(s, layer.state_dict()) for s, layer in zip(txt_layers, model.text.layers())]
    img_stem_same = all(torch.equal(a, b) for a, b in zip(img_stem, model.image.stem_parameters()))
    txt_stem_same = all(torch.equal(a, b) for a, b in zip(txt_stem, model.text.stem_parameters()))
    if variant == "image_frozen":
        assert all(img_same) and img_stem_same and not txt_same[-1] and not txt_stem_same
    elif variant == "text_frozen":
        assert all(txt_same) and txt_stem_same and not img_same[-1] and not img_stem_same
    elif variant == "image_partial":
        assert all(img_same[:-2]) and img_stem_same and not any(img_same[-2:])
    else:
        assert all(txt_same[:-3]) and txt_stem_same and not any(txt_same[-3:])


def test_unimodal_lambda_one_equals_clip(setup) -> None:
    model, pairs, texts, init = setup
    model.load_state_dict(init)
    idx = torch.arange(len(pairs))
    base = dict(epochs=1, batch=4, image_unlock=0, text_unlock=0, seed=0)
    clip = Trainer(model, pairs, texts, TrainConfig(objective="clip", **base))
    uni = Trainer(model, pairs, texts, TrainConfig(objective="clip", unimodal="augment", unimodal_lambda=1.0, **base))
    uni_half = Trainer(model, pairs, texts, TrainConfig(objective="clip", unimodal="augment", unimodal_lambda=0.5, **base))
    with torch.no_grad():
        assert uni.loss(idx).item() == pytest.approx(clip.loss(idx).item(), abs=1e-6)
        assert uni_half.loss(idx).item() != pytest.approx(clip.loss(idx).item(), abs=1e-4)


def test_flip_skipped_on_cnn(setup) -> None:
    assert "CNN" in skip_reason("flip", setup[0]) and skip_reason("clip", setup[0]) is None
