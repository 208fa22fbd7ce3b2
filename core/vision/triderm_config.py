"""TriDerm-V's training options as one frozen dataclass, in a module without torch: the job's
``--help`` (one option per field) and the Train page read the defaults from here.

:data:`DEFAULT` is the real-data default, :data:`PAPER_RECIPE` the TriDerm paper's (§3.2). A bad
value raises one :class:`ValueError` naming the field and the value; a run record stores
``dataclasses.asdict(cfg)`` (the field names are the keys of earlier records).
"""
from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, get_type_hints

from core.vision.recipe import LITE0_DEFAULT_LAYER, LITE0_LAYERS, LOSS_NAMES, NORMALIZE, OFFLINE_DEFAULT, SUPERVISED_CV

POOLINGS = ("attention", "mean")


def option(default: Any, help: str, *, choices: tuple[Any, ...] | None = None, minimum: float | None = None,
           positive: bool = False) -> Any:
    """A field with its ``--help`` text and its range: ``choices``, a ``minimum`` (inclusive) or ``positive``."""
    return field(default=default, metadata={"help": help, "choices": choices, "minimum": minimum,
                                            "positive": positive})


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
        None, "learn from the workspace's expert triplets (the supervised mode): a metric head (pooling, "
              "standardisation, linear map) trained with the ordinal hinge over the augmented views; what it "
              "adds, measured: --mode", choices=("triplets",))
    cv: int = option(0, "with --supervise: first score K patient-disjoint folds; the run's figure is the strict one "
                        "(triplets whose three photos were all unseen by training, CI over patients). The job "
                        f"scores {SUPERVISED_CV} with --supervise unless told; 0 to skip", minimum=0)
    supervise_steps: int = option(300, "optimiser steps of the metric head", minimum=1)
    supervise_dim: int = option(64, "dimension of the metric space", minimum=1)
    supervise_lr: float = option(1e-2, "learning rate of the metric head", positive=True)
    supervise_weight_decay: float = option(1e-2, "weight decay of the metric head", minimum=0)
    supervise_pooling: str = option("mean", "pooling of the metric head", choices=POOLINGS)
    supervise_augment: bool = option(True, "train the metric head on augmented views (else the inference view)")
    supervise_heads: int = option(5, "independently trained metric heads whose squared distances add (an "
                                     "ensemble)", minimum=1)
    cv_repeats: int = option(3, "random patient splits the K folds are repeated over (with K folds only ~1/K² "
                                "of the triplets are strict)", minimum=1)

    def __post_init__(self) -> None:
        hints = get_type_hints(type(self))
        for f in fields(self):
            given, meta = getattr(self, f.name), f.metadata
            value = _typed(f.name, given, hints[f.name])
            object.__setattr__(self, f.name, value)
            if value is None:
                continue
            if meta["choices"] is not None and value not in meta["choices"]:
                raise ValueError(f"{f.name} must be one of {list(meta['choices'])}, got {given!r}")
            if meta["minimum"] is not None and value < meta["minimum"]:
                raise ValueError(f"{f.name} must be ≥ {meta['minimum']}, got {given!r}")
            if meta["positive"] and value <= 0:
                raise ValueError(f"{f.name} must be > 0, got {given!r}")
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


def _typed(name: str, value: Any, hint: Any) -> Any:
    """``value`` as the field's type (an integral number → ``int``, a real one → ``float``), or one
    :class:`ValueError` naming the field."""
    allowed = getattr(hint, "__args__", (hint,))
    if value is None and type(None) in allowed:
        return None
    if bool in allowed:
        if isinstance(value, bool):
            return value
    elif int in allowed:
        if isinstance(value, numbers.Integral) and not isinstance(value, bool):
            return int(value)
    elif float in allowed:
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            return float(value)
    elif isinstance(value, str):
        return value
    kind = " or ".join("None" if t is type(None) else t.__name__ for t in allowed)
    raise ValueError(f"{name} must be {kind}, got {value!r}")


#: the real-data default (benchmarks/real_vision.py): a 128-d predictor (VICReg's covariance term is
#: estimated from batches of 32, so a 512-d output is mostly noise) and distances between centred,
#: unit-length embeddings
DEFAULT = TriDermConfig()
#: the TriDerm paper's recipe (§3.2): attention pooling, VICReg, 50 epochs, batch 32, lr 1e-2, dim 512
PAPER_RECIPE = replace(DEFAULT, dim=512, normalize="none")


#: The :class:`TriDermConfig` options each mode of ``python -m core.train_triderm`` reads; the job refuses any other
#: (they would change nothing in that mode), and the Train page sends only these.
_SUPERVISED_ONLY = frozenset(f.name for f in fields(TriDermConfig)
                             if f.name.startswith("supervise") or f.name in ("cv", "cv_repeats"))
MODE_OPTIONS: dict[str, frozenset[str]] = {
    "frozen": frozenset({"backbone", "layer"}),
    "fine-tune": frozenset({"backbone", "layer", "views", "cv", "cv_repeats", "seed"}),
    "self-supervised": frozenset(f.name for f in fields(TriDermConfig)) - _SUPERVISED_ONLY,
    "supervised": frozenset(f.name for f in fields(TriDermConfig)),
}
#: What ``--mode auto`` may be given: the options of both modes it chooses between.
MODE_OPTIONS["auto"] = MODE_OPTIONS["frozen"] & MODE_OPTIONS["fine-tune"]
