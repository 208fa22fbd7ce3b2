"""The vision job's training options as frozen dataclasses, in a module without torch: the job's ``--help``
(one option per field, :func:`core.cli.add_config_options`) and the Train page read them from here.

:class:`TriDermConfig` is TriDerm-V's recipe (the self-supervised and supervised modes): :data:`DEFAULT` is the
real-data default, :data:`PAPER_RECIPE` the TriDerm paper's (§3.2). :class:`FineTuneConfig` is the fine-tune
mode's. A bad value raises one :class:`ValueError` naming the field and the value; a run record stores
``dataclasses.asdict(cfg)`` (the field names are the keys of earlier records). :data:`MODE_READS` says which
fields each ``--mode`` reads.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from core.cli import check_options, option
from core.vision.recipe import LITE0_DEFAULT_LAYER, LITE0_LAYERS, LOSS_NAMES, NORMALIZE, OFFLINE_DEFAULT, SUPERVISED_CV

POOLINGS = ("attention", "mean")


@dataclass(frozen=True)
class TriDermConfig:
    """One TriDerm-V training recipe (METHODS.md §1); the defaults are the real-data default."""

    backbone: str = option(OFFLINE_DEFAULT, "backbone registry name")
    layer: str | None = option(None, f"backbone layer ({OFFLINE_DEFAULT}: {', '.join(LITE0_LAYERS)}; "
                                     f"default {LITE0_DEFAULT_LAYER})")
    pooling: str = option("attention", "how a wound's tokens are pooled", choices=POOLINGS)
    loss: str = option("vicreg", "self-supervised objective on two views of a wound", choices=tuple(sorted(LOSS_NAMES)))
    epochs: int = option(50, "training epochs", minimum=1)
    batch_size: int = option(32, "wounds per step", minimum=2)
    lr: float = option(1e-2, "learning rate", positive=True)
    weight_decay: float = option(1e-5, "AdamW weight decay", minimum=0)
    views: int = option(16, "cached augmented views per photo (≥ 2; ≥ 1 with --no-cache)", minimum=1)
    seed: int = option(0, "random seed")
    no_cache: bool = option(False, "augment + run the backbone every step (slow)")
    dim: int = option(128, "dimension of the predictor's output", minimum=1)
    hidden: int = option(128, "hidden width of the attention pooling's scorer", minimum=1)
    min_steps: int = option(0, "train at least this many optimiser steps", minimum=0)
    normalize: str = option("center-l2", "embedding distances: center-l2 (centre, unit length) or none (raw "
                                         "Euclidean)", choices=NORMALIZE)
    supervise: str | None = option(
        None, "learn from the workspace's expert triplets (set by --mode supervised): a metric head (pooling, "
              "standardisation, linear map) trained with the ordinal hinge over the augmented views",
        choices=("triplets",))
    cv: int = option(0, "supervised and fine-tune modes: first score K patient-disjoint folds; the run's figure is the "
                        "strict one (triplets whose three photos were all unseen by training, CI over patients). "
                        f"Those modes score {SUPERVISED_CV} unless told; 0 to skip", minimum=0, metavar="K")
    supervise_steps: int = option(300, "optimiser steps of the metric head", minimum=1)
    supervise_dim: int = option(64, "dimension of the metric space", minimum=1)
    supervise_lr: float = option(1e-2, "learning rate of the metric head", positive=True)
    supervise_weight_decay: float = option(1e-2, "weight decay of the metric head", minimum=0)
    supervise_pooling: str = option("mean", "pooling of the metric head", choices=POOLINGS)
    supervise_augment: bool = option(True, "train the metric head on augmented views (else the inference view)")
    supervise_heads: int = option(5, "independently trained metric heads whose squared distances add (an "
                                     "ensemble)", minimum=1)
    cv_repeats: int = option(3, "random patient splits the K folds are repeated over (with K folds only ~1/K² "
                                "of the triplets are strict)", minimum=1, metavar="R")

    def __post_init__(self) -> None:
        check_options(self)
        if self.views < 2 and not self.no_cache:
            raise ValueError(f"views must be ≥ 2 (≥ 1 with no_cache), got {self.views!r}")
        if self.cv and (self.supervise is None or self.cv < 2):
            raise ValueError(f"cv needs supervise='triplets' and at least 2 folds, got cv={self.cv!r} "
                             f"with supervise={self.supervise!r}")

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> TriDermConfig:
        """The recipe of a stored run (``head.pt``'s config or a run record): the fields it holds, the
        defaults for the rest, except ``supervise_heads``: 1 (runs saved before the ensemble had one head)."""
        known = {f.name for f in fields(cls)}
        return cls(**{"supervise_heads": 1, **{k: v for k, v in record.items() if k in known}})


#: the real-data default (benchmarks/real_vision.py): a 128-d predictor (VICReg's covariance term is
#: estimated from batches of 32, so a 512-d output is mostly noise) and distances between centred,
#: unit-length embeddings
DEFAULT = TriDermConfig()
#: the TriDerm paper's recipe (§3.2): attention pooling, VICReg, 50 epochs, batch 32, lr 1e-2, dim 512
PAPER_RECIPE = replace(DEFAULT, dim=512, normalize="none")




@dataclass(frozen=True)
class FineTuneConfig:
    """The fine-tune mode's training of the backbone's last stage + head (:mod:`core.vision.finetune`)."""

    steps: int = option(60, "optimiser steps of the last stage + head (each shows every training photo once)",
                        minimum=1)
    lr: float = option(3e-4, "AdamW learning rate of the last stage + head", positive=True)
    margin: float = option(0.1, "margin of the ordinal hinge on unit-length embeddings", minimum=0)
    batch_triplets: int = option(256, "expert triplets per step", minimum=1)
    test_views: bool = option(True, "embed each photo as the mean over its inference view and its cached augmented "
                                    "views (test-time views; --no-test-views: the inference view alone)")
    members: int = option(1, "tails fine-tuned with their own seeds (seed + 1000·m), their unit embeddings "
                             "concatenated: an ensemble, fit time × members", minimum=1)
    seed: int = option(0, "random seed")

    def __post_init__(self) -> None:
        check_options(self)


#: What each mode of ``python -m core.train_triderm`` reads: the config dataclass(es) and the fields of each its
#: options set (the fine-tune mode takes its views and folds from :class:`TriDermConfig`). The job refuses any
#: other option (it would change nothing in that mode), and the Train page sends only these.
_SUPERVISED_ONLY = frozenset(f.name for f in fields(TriDermConfig)
                             if f.name.startswith("supervise") or f.name in ("cv", "cv_repeats"))
MODE_READS: dict[str, dict[type, frozenset[str]]] = {
    "frozen": {TriDermConfig: frozenset({"backbone", "layer"})},
    "self-supervised": {TriDermConfig: frozenset(f.name for f in fields(TriDermConfig)) - _SUPERVISED_ONLY},
    "supervised": {TriDermConfig: frozenset(f.name for f in fields(TriDermConfig)) - {"supervise"}},
    "fine-tune": {FineTuneConfig: frozenset(f.name for f in fields(FineTuneConfig)),
                  TriDermConfig: frozenset({"views", "cv", "cv_repeats"})},
}
#: the modes ``--mode auto`` chooses between (:func:`core.vision.triderm.auto_mode`)
AUTO_MODES = ("fine-tune", "frozen")
#: The options (config fields) each mode reads; ``auto``: those every mode it may choose reads (none need be
#: refused once it has chosen).
MODE_OPTIONS: dict[str, frozenset[str]] = {mode: frozenset().union(*reads.values())
                                           for mode, reads in MODE_READS.items()}
MODE_OPTIONS["auto"] = frozenset.intersection(*(MODE_OPTIONS[m] for m in AUTO_MODES))
#: the modes ``--paper-recipe`` applies to (TriDerm-V's recipe)
PAPER_RECIPE_MODES = ("self-supervised", "supervised")


def base_config(kind: type, mode: str, paper_recipe: bool = False) -> Any:
    """The config of class ``kind`` that ``mode`` starts from before its options: TriDerm-V's real-data default
    (or the ``paper_recipe``), learning from the triplets with :data:`~core.vision.recipe.SUPERVISED_CV` folds in
    the supervised and fine-tune modes; the fine-tune mode's defaults."""
    if kind is FineTuneConfig:
        return FineTuneConfig()
    recipe = PAPER_RECIPE if paper_recipe else DEFAULT
    return replace(recipe, supervise="triplets", cv=SUPERVISED_CV) if mode in ("supervised", "fine-tune") else recipe


def mode_defaults(mode: str, paper_recipe: bool = False) -> dict[str, Any]:
    """The value of each option ``mode`` reads when it is not given (:func:`base_config`)."""
    return {name: getattr(base_config(kind, mode, paper_recipe), name)
            for kind, reads in MODE_READS.get(mode, {}).items() for name in reads}
