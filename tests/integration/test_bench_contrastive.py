"""Contrastive benchmark: Recall@K, frozen towers stay bit-identical, λ = 1 unimodal is CLIP,
FLIP drops ViT patches in training only."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from core.concepts.dual_encoder import DualEncoder, ImageTower, MiniLMTower, load_vlm
from core.concepts.training import TrainConfig, Trainer, WoundPairs, build_text_inputs
from core.concepts.vocabulary import ConceptTagger, load_vocab
from core.experiments.contrastive import recall_at_k, skip_reason, variant_config
from core.experiments.defaults import ContrastiveConfig

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


def test_paired_difference_vs_baseline() -> None:
    from core.experiments.contrastive import METRICS, paired_vs_baseline

    base = [dict.fromkeys(METRICS, 0.1 * s) | {"seed": s} for s in range(4)]
    better = [dict.fromkeys(METRICS, 0.1 * s + 0.2 + 0.01 * (-1) ** s) | {"seed": s} for s in range(4)]
    noisy = [dict.fromkeys(METRICS, 0.1 * s + 0.2 * (-1) ** s) | {"seed": s} for s in range(4)]
    out = paired_vs_baseline({"clip": base, "better": better, "noisy": noisy})
    assert set(out) == {"better", "noisy"}
    mean, sd, sig = out["better"]["i2t_R@1"]
    assert mean == pytest.approx(0.2) and sd == pytest.approx(np.std([0.21, 0.19, 0.21, 0.19], ddof=1)) and sig
    assert out["noisy"]["i2t_R@1"][0] == pytest.approx(0.0) and not out["noisy"]["i2t_R@1"][2]


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


def _args(**kw) -> ContrastiveConfig:
    base = dict(epochs=1, batch_size=4, lr=1e-2, tower_lr=1e-2, partial_image=2, partial_text=3, lam=0.5,
                patch_dropout=0.5)
    return ContrastiveConfig(**{**base, **kw})


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


@pytest.mark.parametrize("views", ["augment", "mask"])
def test_unimodal_term_uses_its_own_projector_not_the_clip_head(setup, views: str) -> None:
    model, pairs, texts, init = setup
    model.load_state_dict(init)
    trainer = Trainer(model, pairs, texts, TrainConfig(objective="clip", unimodal=views, unimodal_lambda=0.0,
                                                       epochs=1, batch=4, seed=0))
    in_opt = {id(p) for group in trainer.opt.param_groups for p in group["params"]}
    assert all(id(p) in in_opt for p in trainer.uni.projector.parameters())
    assert not {id(p) for p in trainer.uni.projector.parameters()} & {id(p) for p in model.image_head.parameters()}
    model.zero_grad(set_to_none=True)
    trainer.loss(torch.arange(len(pairs))).backward()  # λ = 0: the unimodal term alone
    assert all(p.grad is None or not p.grad.any() for p in model.image_head.parameters())
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in trainer.uni.projector.parameters())


def test_flip_skipped_on_cnn(setup) -> None:
    assert "CNN" in skip_reason("flip", setup[0]) and skip_reason("clip", setup[0]) is None


@pytest.fixture(scope="module")
def vit_model() -> DualEncoder:
    """A tiny randomly initialised open_clip ViT image tower (4×4 patches at 64 px) + MiniLM."""
    import open_clip

    from core.vision.backbones import _open_clip_backbone

    torch.manual_seed(0)
    clip = open_clip.model.CLIP(
        embed_dim=16, vision_cfg=open_clip.model.CLIPVisionCfg(layers=2, width=64, head_width=32, patch_size=16,
                                                               image_size=64),
        text_cfg=open_clip.model.CLIPTextCfg(layers=1, width=32, heads=2, context_length=8, vocab_size=64))
    backbone = _open_clip_backbone(clip, "tiny-vit", "open_clip:tiny", torch.device("cpu"))
    return DualEncoder(ImageTower(backbone), MiniLMTower(), dim=16)


def test_flip_drops_patches_in_training_only(vit_model: DualEncoder) -> None:
    tower, x = vit_model.image, torch.randn(3, 3, 64, 64)
    tower.set_patch_dropout(0.5)
    vit_model.train()
    with torch.no_grad():
        a, b = tower.forward_levels(x, 0, tower.n_levels), tower.forward_levels(x, 0, tower.n_levels)
    assert a.shape == (3, 1 + 8, 64) and not torch.equal(a, b)  # pooled + 8 of 16 patches, a fresh draw each call
    assert tower.encode(a, tower.n_levels)[2] == (1, 8)
    vit_model.eval()
    with torch.no_grad():
        full = tower.forward_levels(x, 0, tower.n_levels)
    assert full.shape == (3, 1 + 16, 64) and torch.equal(full, tower.forward_levels(x, 0, tower.n_levels))
    tower.set_patch_dropout(0.0)
    vit_model.train()
    with torch.no_grad():
        assert tower.forward_levels(x, 0, tower.n_levels).shape == (3, 1 + 16, 64)
    vit_model.eval()


def test_flip_variant_trains_a_vit_tower(setup, vit_model: DualEncoder) -> None:
    _, pairs, texts, _ = setup
    assert skip_reason("flip", vit_model) is None
    cfg = variant_config("flip", _args(), seed=0)
    assert cfg.patch_dropout == 0.5 and cfg.image_unlock == -1
    before = _snapshot(vit_model.image)
    trainer = Trainer(vit_model, pairs, texts, cfg)
    history = trainer.fit(np.arange(len(pairs)), progress=False)
    assert np.isfinite(history).all() and not _same(before, vit_model.image.state_dict())
    g, patches, grid = trainer.embed()
    assert grid == (4, 4) and patches.shape[:2] == (len(pairs), 16) and g.shape == (len(pairs), 16)


def test_patch_dropout_rejected_where_it_cannot_apply(setup) -> None:
    model, _pairs, _texts, _ = setup
    with pytest.raises(ValueError, match="CNN"):
        model.image.set_patch_dropout(0.5)
    with pytest.raises(ValueError, match="trainable image tower"):
        TrainConfig(objective="clip", patch_dropout=0.5, image_unlock=0).validate()
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        TrainConfig(objective="clip", patch_dropout=1.0, image_unlock=-1).validate()


def test_cli_runs_writes_the_table_and_reuses_cells(demo_workspace, capsys) -> None:
    from core.bench_contrastive import main
    from core.experiments.contrastive import OUT_DIR

    argv = ["--workspace", str(demo_workspace.root), "--quick", "--epochs", "1", "--crop-size", "64",
            "--variants", "clip,flip"]
    assert main(argv) == 0
    out = demo_workspace.runs_dir / OUT_DIR
    table = (out / "table.md").read_text()
    assert "SYNTHETIC" in table and "| clip | " in table and "flip | skipped: FLIP patch dropout" in table
    assert "Paired difference vs clip" not in table  # one variant trained: nothing to pair
    assert {p.name for p in out.iterdir()} >= {"table.csv", "results.json", "chart.json", "chart.html", "cells"}
    run = demo_workspace.store.runs(kind="bench-contrastive")[0]
    assert run["status"] == "done" and run["config"]["n_seeds"] == 1 and run["git_sha"] is not None
    capsys.readouterr()
    assert main(argv) == 0  # the finished cell is reused, not retrained
    assert "[cached] clip seed 0" in capsys.readouterr().out


@pytest.mark.parametrize("flag, message", [(["--target", "shoe_size"], "--target 'shoe_size'"),
                                           (["--variants", "clip,bogus"], "unknown variant"),
                                           (["--holdout", "1.5"], "--holdout must be in (0, 1)"),
                                           (["--model", "nope"], "unknown image–text model 'nope'"),
                                           (["--partial-image", "9"], "--partial-image 9: lite0-minilm has 5 blocks")])
def test_cli_bad_input_one_clear_error_no_run(demo_workspace, capsys, flag: list[str], message: str) -> None:
    from core.bench_contrastive import main

    with pytest.raises(SystemExit) as e:
        main(["--workspace", str(demo_workspace.root), "--quick", *flag])
    assert e.value.code == 2 and message in capsys.readouterr().err
    assert demo_workspace.store.runs(kind="bench-contrastive") == []
    assert not (demo_workspace.runs_dir / "bench_contrastive").exists()
