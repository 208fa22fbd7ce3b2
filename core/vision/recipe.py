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
#: ``python -m core.train_triderm --mode``: what each mode learns and what it added, measured on azh-dev's new
#: patients (strict: all three photos of a triplet unseen by training, paired over 57 patients;
#: ``python -m benchmarks.real_vision``, docs/RESULTS.md "Real wounds"); ``auto`` is the job's default
MODES = {
    "auto": "fine-tune when the workspace has expert triplets over outlined photos and its outlined photos come "
            f"from at least {SUPERVISED_CV} patients (the folds it is first scored on; the best mode measured on new "
            "patients), else frozen",
    "frozen": "no training: a photo is the mean of its wounds' backbone tokens, centred on the study's photos, "
              "unit length. azh-dev strict 63.0 %: the baseline the other modes are measured against",
    "self-supervised": "TriDerm-V: attention pooling + predictor trained with VICReg on augmented views, no labels "
                       "(the TriDerm paper's method; --paper-recipe for its settings). azh-dev strict 62.0 %: "
                       "-0.5 pp over frozen (p = 0.77), adds nothing measured",
    "supervised": "an ensemble of metric heads trained on the workspace's expert triplets, "
                  "scored on patient-disjoint folds first (--cv). azh-dev strict 68.0 %: +5.8 pp over frozen "
                  "(p = 0.0015); a plain linear metric reached 67.3 % (+5.5 pp)",
    "fine-tune": "the backbone's last stage and head fine-tuned on the workspace's expert triplets (ordinal hinge, "
                 "augmented views; each photo embedded as the mean over its inference view and its cached augmented "
                 "views, --no-test-views for the inference view alone), scored on patient-disjoint folds first "
                 "(--cv). azh-dev strict 74.5 %: +12.3 pp over frozen (p = 4.5e-09), +6.8 pp over the linear metric "
                 "(p = 0.001), +6.5 pp over the supervised mode (p = 4.6e-06); minutes on a CPU. --members 3 (an "
                 "ensemble of 3 seeds, fit time × 3) reached 76.0 % (real_vision_directions)",
}
#: the training objectives (``--loss``; :data:`core.vision.triderm.LOSSES` maps them to the losses)
LOSS_NAMES = ("contrastive", "triplet", "vicreg")
#: Photos per shard file of the feature cache (:meth:`core.vision.features.FeatureCache.extract`).
SHARD_PHOTOS = 32
