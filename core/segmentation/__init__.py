"""Assisted wound outlining: a wound segmenter and the click/suggestion tools built on it.

The model follows the semantic branch of Panoptic FPN (Kirillov et al., CVPR 2019) over the offline
EfficientNet-Lite0 (timm ``tf_efficientnet_lite0`` with ``features_only``, ImageNet weights of the
embedded package): strides 4–32 feed a light top-down FPN decoder (Lin et al., CVPR 2017) that
gives a wound probability map. The stem and stages up to stride 16 stay frozen (their features are
cached once per photo and view); the stride-32 stages (three quarters of the encoder's weights) and
the decoder train, with binary cross-entropy + soft Dice (Milletari et al. 2016), on the four flips
of each photo (the default adds one close-up of the wound per photo); predictions average the logits of
the photo and its horizontal flip at two input sizes (512 and 640 px). A default segmenter trained on
public foot-ulcer photos ships with the package (``default/segmenter.safetensors``, model card
``default/MODEL_CARD.md``): a new workspace's suggestions and clicks use it, and a workspace's own run
fine-tunes its decoder's head.

- :mod:`.model` — :class:`Segmenter` (frozen encoder + tuned stages and decoder), checkpoints, the default.
- :mod:`.training` — training samples (workspace masks, dataset folders), feature cache, fitting,
  the ``segmenter`` run (``python -m core.train_segmenter``).
- :mod:`.interactive` — outline suggestions, click-to-outline (model, GrabCut fallback) and the
  online Segment Anything choice (:class:`SamClicker`).
- :mod:`.metrics` — Dice, IoU, boundary F-score, per-wound matching and the simulated edit effort.
- :mod:`.labelstudio` — the segmenter as a Label Studio ML backend (``python -m core.ml_backend``).
- :mod:`.defaults` — the settings the jobs' ``--help`` shows (threshold, epochs), without torch.

The names below load their module (and torch) on first use, so ``core.segmentation.defaults`` and
``core.segmentation.metrics`` import without it.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {"SamClicker": "interactive", "SamUnavailable": "interactive", "outline_from_click": "interactive",
            "suggest_outlines": "interactive", "suggest_outlines_by": "interactive", "Segmenter": "model", "SegmenterError": "model",
            "load_default": "model", "load_segmenter": "model"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """``core.segmentation.<name>`` of :data:`__all__`, imported from its module on first use."""
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
