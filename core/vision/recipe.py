"""TriDerm-V's recipe and the backbone names the jobs' ``--help`` shows, in a module without torch:
``python -m core.train_triderm --help`` (and ``embed``, ``extract_features``) answer without loading it.
:mod:`core.vision.triderm` and :mod:`core.vision.backbones` use these (and re-export them)."""
from __future__ import annotations

from typing import Any

OFFLINE_DEFAULT = "efficientnet-lite0"
#: layer → (stages of ``blocks`` run, whether ``conv_head``/``bn2`` follow); all at output stride 16
LITE0_LAYERS: dict[str, tuple[int, bool]] = {"full": (7, True), "stage7": (7, False), "stage6": (6, False),
                                             "stage5": (5, False)}
LITE0_DEFAULT_LAYER = "full"

#: the TriDerm paper's recipe (§3.2): attention pooling, VICReg, 50 epochs, batch 32, lr 1e-2, dim 512
PAPER_RECIPE: dict[str, Any] = {
    "backbone": OFFLINE_DEFAULT, "layer": None, "pooling": "attention", "loss": "vicreg", "epochs": 50,
    "batch_size": 32, "lr": 1e-2, "weight_decay": 1e-5, "views": 16, "seed": 0, "no_cache": False, "dim": 512,
    "hidden": 128, "min_steps": 0, "normalize": "none", "supervise": None, "cv": 0,
    "supervise_steps": 300, "supervise_dim": 64, "supervise_lr": 1e-2, "supervise_weight_decay": 1e-2,
    "supervise_pooling": "mean", "supervise_augment": True, "supervise_heads": 5, "cv_repeats": 3,
}
#: the real-data default (benchmarks/real_vision.py): a 128-d predictor (VICReg's covariance term is
#: estimated from batches of 32, so a 512-d output is mostly noise) and distances between
#: centred, unit-length embeddings
DEFAULTS: dict[str, Any] = {**PAPER_RECIPE, "dim": 128, "normalize": "center-l2"}
NORMALIZE = ("center-l2", "none")
#: ``--cv`` folds of the supervised mode: few, large folds (with K folds only ~1/K² of the triplets
#: have all three photos in one fold, the strict set), repeated over ``cv_repeats`` random splits
SUPERVISED_CV = 2
#: the training objectives (``--loss``; :data:`core.vision.triderm.LOSSES` maps them to the losses)
LOSS_NAMES = ("contrastive", "triplet", "vicreg")
#: Photos per shard file of the feature cache (:meth:`core.vision.features.FeatureCache.extract`).
SHARD_PHOTOS = 32
