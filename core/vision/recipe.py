"""TriDerm-V's option names and the backbone names the jobs' ``--help`` shows, in a module without torch:
``python -m core.train_triderm --help`` (and ``embed``, ``extract_features``) answer without loading it.
:mod:`core.vision.triderm` and :mod:`core.vision.backbones` use these (and re-export them); the recipe itself
is :class:`core.vision.triderm_config.TriDermConfig`."""
from __future__ import annotations

OFFLINE_DEFAULT = "efficientnet-lite0"
#: layer → (stages of ``blocks`` run, whether ``conv_head``/``bn2`` follow); all at output stride 16
LITE0_LAYERS: dict[str, tuple[int, bool]] = {"full": (7, True), "stage7": (7, False), "stage6": (6, False),
                                             "stage5": (5, False)}
LITE0_DEFAULT_LAYER = "full"

NORMALIZE = ("center-l2", "none")
#: ``--cv`` folds of the supervised mode: few, large folds (with K folds only ~1/K² of the triplets
#: have all three photos in one fold, the strict set), repeated over ``cv_repeats`` random splits
SUPERVISED_CV = 2
#: the training objectives (``--loss``; :data:`core.vision.triderm.LOSSES` maps them to the losses)
LOSS_NAMES = ("contrastive", "triplet", "vicreg")
#: Photos per shard file of the feature cache (:meth:`core.vision.features.FeatureCache.extract`).
SHARD_PHOTOS = 32
