"""Assisted wound outlining: a wound segmenter and the click/suggestion tools built on it.

The model follows the semantic branch of Panoptic FPN (Kirillov et al., CVPR 2019) over a frozen
encoder: the offline EfficientNet-Lite0 (the same frozen backbone TriDerm-V tokens come from, §2.2;
timm ``tf_efficientnet_lite0`` with ``features_only``, ImageNet weights of the embedded package)
gives strides 4–32; a light top-down FPN decoder (Lin et al., CVPR 2017) fuses them into a wound
probability map. Only the decoder is trained (binary cross-entropy + soft Dice, Milletari et al.
2016), on the workspace's masks, from backbone features cached once per photo and view (the four
flips and random scale/aspect/colour views); predictions average the photo and its horizontal flip.

- :mod:`.model` — :class:`Segmenter` (frozen encoder + decoder), checkpoints.
- :mod:`.training` — training samples (workspace masks, dataset folders), feature cache, fitting,
  the ``segmenter`` run (``python -m core.train_segmenter``).
- :mod:`.interactive` — outline suggestions, click-to-outline (model, GrabCut fallback) and the
  online Segment Anything choice (:class:`SamClicker`).
- :mod:`.metrics` — Dice, IoU, boundary F-score, per-wound matching and the simulated edit effort.
"""
from core.segmentation.interactive import SamClicker, SamUnavailable, outline_from_click, suggest_outlines
from core.segmentation.model import Segmenter, SegmenterError, load_segmenter

__all__ = ["SamClicker", "SamUnavailable", "Segmenter", "SegmenterError", "load_segmenter", "outline_from_click",
           "suggest_outlines"]
