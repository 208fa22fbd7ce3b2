"""Backbone names: canonical library spellings (timm:, open_clip:, hf-hub:) with the home-made names as aliases,
and the offline hub path going through huggingface_hub's cache-only API."""
from __future__ import annotations

import socket

import pytest
import torch

from core.vision import backbones
from core.vision.backbones import (
    ALIASES,
    DERMLIP_HUB,
    LITE0_TIMM,
    BackboneUnavailable,
    canonical_name,
    list_backbones,
    load_backbone,
)


@pytest.mark.parametrize(("name", "canonical"), [
    ("efficientnet-lite0", "timm:tf_efficientnet_lite0"),
    ("efficientnet-lite0@stage5", "timm:tf_efficientnet_lite0@stage5"),
    ("timm:tf_efficientnet_lite0", "timm:tf_efficientnet_lite0"),
    ("dermlip", "hf-hub:redlessone/DermLIP_ViT-B-16"),
    ("open_clip:hf-hub:redlessone/DermLIP_ViT-B-16", "hf-hub:redlessone/DermLIP_ViT-B-16"),
    ("open_clip:ViT-B-16:laion2b_s34b_b88k", "open_clip:ViT-B-16:laion2b_s34b_b88k"),
    ("runs/3/bb.pt", "runs/3/bb.pt"),
])
def test_canonical_name(name, canonical):
    assert canonical_name(name) == canonical


def test_every_alias_and_its_canonical_name_are_listed():
    listed = list_backbones()
    assert all(alias in listed and target in listed for alias, target in ALIASES.items())
    assert ALIASES == {"efficientnet-lite0": LITE0_TIMM, "dermlip": DERMLIP_HUB}


def test_alias_and_canonical_name_build_the_same_backbone():
    a = load_backbone("efficientnet-lite0@stage6", device="cpu")
    b = load_backbone("timm:tf_efficientnet_lite0", layer="stage6", device="cpu")
    assert a.name == b.name == "efficientnet-lite0@stage6" and a.key == b.key  # one feature cache for both
    x = torch.randn(1, 3, 224, 224)
    assert torch.equal(a(x), b(x))


def test_a_timm_tag_names_timm_hub_weights_not_the_embedded_ones():
    """``timm:tf_efficientnet_lite0`` is the embedded package's weights; with a tag, timm's own (hub) weights."""
    a = load_backbone("timm:tf_efficientnet_lite0.in1k", device="cpu", pretrained=False)
    assert a.name == "timm:tf_efficientnet_lite0.in1k:random@full" and a.arch == "efficientnet-lite0"
    assert (a.channels, a.grid()) == (1280, (14, 14))


@pytest.mark.parametrize("name", ["dermlip", DERMLIP_HUB, "hf-hub:example-org/not-cached-clip"])
def test_hub_names_offline_use_the_cache_only_api(monkeypatch, name):
    """Offline, a hub name is looked up with local_files_only=True (no socket) and not-cached is one clear error."""
    from huggingface_hub import snapshot_download

    calls = []

    def cache_only(repo_id, **kw):
        calls.append((repo_id, kw.get("local_files_only")))
        return snapshot_download(repo_id, **kw)

    monkeypatch.setattr("huggingface_hub.snapshot_download", cache_only)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: pytest.fail("network attempted"))
    monkeypatch.setattr(backbones, "_hub_reachable", lambda *a, **k: pytest.fail("hub probed while offline"))
    with pytest.raises(BackboneUnavailable, match=r"not cached.*--backbone efficientnet-lite0"):
        load_backbone(name, device="cpu")
    assert calls == [(canonical_name(name).removeprefix("hf-hub:"), True)]
