"""Dual encoder: level-wise (cached) forward equals the full forward; freezing; offline dermlip."""
from __future__ import annotations

import pytest
import torch

from core.concepts.dual_encoder import OFFLINE_DEFAULT, VLMUnavailable, load_vlm

pytestmark = pytest.mark.slow  # loads MiniLM + EfficientNet (> 20 s on 2 busy cores)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return load_vlm(device="cpu", pretrained=False, dim=32)


def test_text_levels_match_full_bert(model) -> None:
    tok = model.text.tokenize(["no fibrin here", "deep ulcer with fibrin and crust"])
    with torch.no_grad():
        full = model.text.bert(input_ids=tok.input_ids, attention_mask=tok.attention_mask).last_hidden_state
        mid = model.text_levels(tok, tok.attention_mask, 0, 4)
        top = model.text_levels(mid, tok.attention_mask, 4, model.text.n_levels)
    m = tok.attention_mask.bool()
    assert torch.allclose(full[m], top[m], atol=1e-5)
    g, toks = model.encode_text_from(mid, tok.attention_mask, 4)
    g0, _ = model.encode_text_from(tok, tok.attention_mask, 0, tokens=False)
    assert torch.allclose(g, g0, atol=1e-5) and toks.shape == (2, tok.input_ids.shape[1], 32)
    assert torch.allclose(g.norm(dim=-1), torch.ones(2))


def test_image_levels_match_backbone(model) -> None:
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        ref = model.image.backbone(x)
        h = model.image_levels(x, 0, 2)
        out = model.image_levels(h, 2, model.image.n_levels)
        g, patches, grid = model.encode_image_from(h, 2)
    # the frozen call runs the batch norms folded into the convolutions: the same arithmetic up to float rounding
    assert torch.allclose(ref, out, rtol=1e-4, atol=1e-4)
    assert grid == (4, 4) and patches.shape == (2, 16, 32) and g.shape == (2, 32)


def test_set_trainable_and_frozen_levels(model) -> None:
    model.set_trainable(2, 1)
    assert model.frozen_levels() == (model.image.n_levels - 2, model.text.n_levels - 1)
    trainable = {id(p) for p in model.tower_parameters()}
    assert all(id(p) in trainable for p in model.image.blocks[-1].parameters())
    assert not any(id(p) in trainable for p in model.image.blocks[0].parameters())
    assert all(id(p) in trainable for p in model.text.layers()[-1].parameters())
    assert not any(id(p) in trainable for p in model.text.stem_parameters())
    model.set_trainable(-1, 0)
    assert model.frozen_levels() == (0, model.text.n_levels)
    with pytest.raises(ValueError, match="unlock"):
        model.set_trainable(99, 0)
    model.set_trainable(0, 0)
    assert model.tower_parameters() == []


def test_dermlip_fails_fast_offline(monkeypatch) -> None:
    import core.vision.backbones as bb

    monkeypatch.setattr(bb, "_hub_reachable", lambda *a, **k: False)
    monkeypatch.setenv("HF_HUB_CACHE", "/nonexistent-triderm-cache")
    with pytest.raises(VLMUnavailable, match=OFFLINE_DEFAULT):
        load_vlm("dermlip", device="cpu")
    with pytest.raises(ValueError, match="unknown"):
        load_vlm("nope", device="cpu")


def _tiny_open_clip():
    """A tiny randomly initialised open_clip CLIP (ViT 4×4 patches at 64 px, 1-layer text
    transformer with the real BPE vocabulary) built offline, and its tokenizer."""
    import open_clip

    torch.manual_seed(0)
    clip = open_clip.model.CLIP(
        embed_dim=16, vision_cfg=open_clip.model.CLIPVisionCfg(layers=2, width=64, head_width=32, patch_size=16,
                                                               image_size=64),
        text_cfg=open_clip.model.CLIPTextCfg(layers=1, width=32, heads=2, context_length=77, vocab_size=49408))
    return clip.eval(), open_clip.get_tokenizer("ViT-B-16")


def test_open_clip_global_embeddings_are_encode_image_and_encode_text() -> None:
    import torch.nn.functional as F

    from core.concepts.dual_encoder import open_clip_encoder
    from core.vision.backbones import _open_clip_backbone

    clip, tokenizer = _tiny_open_clip()
    x = torch.randn(3, 3, 64, 64)
    texts = ["deep ulcer with yellow fibrin", "crust", "granulating wound bed, no slough"]
    with torch.no_grad():
        ref_img = F.normalize(clip.encode_image(x), dim=-1)
        ref_txt = F.normalize(clip.encode_text(tokenizer(texts)), dim=-1)
    model = open_clip_encoder(_open_clip_backbone(clip, "tiny", "open_clip:tiny", torch.device("cpu")),
                              tokenizer, name="tiny").eval()
    tok = model.text.tokenize(texts)
    with torch.no_grad():
        g_img, patches, grid = model.encode_image_from(x, 0)
        g_txt, _tokens = model.encode_text_from(tok, tok.attention_mask, 0)
        patch_tokens = model.image.encode(x, 0)[1]  # before the projection (attention input)
    assert torch.allclose(g_img, ref_img, atol=1e-5) and torch.allclose(g_txt, ref_txt, atol=1e-5)
    assert grid == (4, 4) and patches.shape == (3, 16, 16) and patch_tokens.shape == (3, 16, 64)
    assert torch.allclose(patches, F.normalize(patch_tokens @ model.image.proj, dim=-1), atol=1e-5)
    # the global embedding is the pooled token, not the mean of the patch tokens
    assert not torch.allclose(g_img, F.normalize(patch_tokens.mean(1) @ model.image.proj, dim=-1), atol=1e-2)


def test_an_image_tower_runs_lite0_block_by_block_and_refuses_another_timm_model_by_name() -> None:
    from core.concepts.dual_encoder import ImageTower
    from core.vision.backbones import load_backbone

    tower = ImageTower(load_backbone("efficientnet-lite0", device="cpu", pretrained=False))
    assert tower.is_cnn and tower.forward_levels(torch.zeros(1, 3, 64, 64), 0, tower.n_levels).ndim == 4
    with pytest.raises(ValueError, match=r"timm:resnet18.*EfficientNet-Lite0"):
        ImageTower(load_backbone("timm:resnet18", device="cpu", pretrained=False))
