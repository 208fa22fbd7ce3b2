"""The segmenter's settings that the jobs' command lines show (``--help``), in a module without torch:
``python -m core.segment --help`` and ``python -m core.train_segmenter --help`` answer without loading it."""
from __future__ import annotations

from annotations import runs

RUN_KIND = runs.SEGMENTER
#: wound probability above which a pixel is wound, for a checkpoint that names none (a default trained by
#: ``--pretrain`` stores the threshold its inner split chose, a workspace run keeps its start's)
THRESHOLD = 0.5
#: Thresholds an inner split chooses from (``--pretrain``): the mean Dice per held-out photo decides.
THRESHOLD_GRID = (0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7)
#: A new network's output bias starts at this wound probability (RetinaNet's prior initialisation: about the share
#: of wound cells in a wound photo). Left at PyTorch's draw (p ≈ 0.5) the background stayed at p 0.2–0.35 after
#: training and the default outlined a band 1–3 cells wide around every wound (results/segmentation_search.md).
HEAD_PRIOR = 0.01
#: Default training length of a workspace run (fine-tuning the default on tens of photos): passes over the
#: training photos (one random view each).
EPOCHS = 40
#: Training length of the default (``--pretrain``, about 230 photos, ≈ 700 steps): the fuseg-dev fold networks'
#: training loss was flat over the last 6 of 24 epochs (results/segmentation_search.md); 6 stopped while it fell.
PRETRAIN_EPOCHS = 24
#: Share of the default's photos (whole file-name series) its inner split holds out to choose the threshold.
INNER_FRACTION = 0.2
