"""The concept models' names that the jobs' ``--help`` shows, in a module without torch:
``python -m core.train_concepts --help`` answers without loading it. :mod:`core.concepts.dual_encoder` and
:mod:`core.concepts.training` use these (and re-export them)."""
from __future__ import annotations

#: the offline image–text model (EfficientNet-Lite0 + MiniLM)
OFFLINE_DEFAULT = "lite0-minilm"
#: the training objectives (``--objective``)
OBJECTIVES = ("clip", "siglip", "make", "conceptclip")
