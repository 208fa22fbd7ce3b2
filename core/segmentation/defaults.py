"""The segmenter's settings that the jobs' command lines show (``--help``), in a module without torch:
``python -m core.segment --help`` and ``python -m core.train_segmenter --help`` answer without loading it."""
from __future__ import annotations

RUN_KIND = "segmenter"
#: wound probability above which a pixel is wound
THRESHOLD = 0.5
#: Default training length of a workspace run (fine-tuning the default on tens of photos): passes over the
#: training photos (one random view each).
EPOCHS = 40
#: Training length of the default (``--pretrain``, about 200 photos).
PRETRAIN_EPOCHS = 6
