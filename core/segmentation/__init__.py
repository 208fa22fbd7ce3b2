"""Assisted wound outlining: a wound segmenter and the click/suggestion tools built on it.

The model follows the semantic branch of Panoptic FPN (Kirillov et al., CVPR 2019) over the offline
EfficientNet-Lite0 (timm ``tf_efficientnet_lite0`` with ``features_only``, ImageNet weights of the
embedded package): strides 4–32 feed a light top-down FPN decoder (Lin et al., CVPR 2017) that
gives a wound probability map. The stem and stages up to stride 16 stay frozen (their features are
cached once per photo and view); the stride-32 stages (three quarters of the encoder's weights) and
the decoder train, with binary cross-entropy + soft Dice (Milletari et al. 2016), on the four flips
and strong random views (rotation, scale, aspect, colour, blur) of each photo; predictions average
the photo's four flips. A default segmenter trained on public foot-ulcer photos ships with the
package (``default/segmenter.safetensors``, model card ``default/MODEL_CARD.md``): a new workspace's
suggestions and clicks use it, and a workspace's own run fine-tunes it.

- :mod:`.model` — :class:`Segmenter` (frozen encoder + tuned stages and decoder), checkpoints, the default.
- :mod:`.training` — training samples (workspace masks, dataset folders), feature cache, fitting,
  the ``segmenter`` run (``python -m core.train_segmenter``).
- :mod:`.interactive` — outline suggestions, click-to-outline (model, GrabCut fallback) and the
  online Segment Anything choice (:class:`SamClicker`).
- :mod:`.metrics` — Dice, IoU, boundary F-score, per-wound matching and the simulated edit effort.
"""
from core.segmentation.interactive import SamClicker, SamUnavailable, outline_from_click, suggest_outlines
from core.segmentation.model import Segmenter, SegmenterError, load_default, load_segmenter

__all__ = ["SamClicker", "SamUnavailable", "Segmenter", "SegmenterError", "load_default", "load_segmenter",
           "outline_from_click", "suggest_outlines"]
