"""SLIMP's training options as one frozen dataclass, in a module without torch: ``python -m core.train_slimp``'s
options are generated from it (:func:`core.cli.add_config_options`) and a run record stores it.

A bad value raises one :class:`ValueError` naming the field and the value. :data:`TRAIN_KEYS` are the fields a
checkpoint keeps (its ``"args"``), so that ``--resume`` trains on exactly as before; the run record's config holds
every field (the names are the keys of earlier records).
"""
from __future__ import annotations

from dataclasses import dataclass

from core.cli import check_options, option


@dataclass(frozen=True)
class SlimpConfig:
    """One SLIMP training run (METHODS.md §2); the defaults are the job's."""

    backbone: str = option("efficientnet-lite0@stage5",
                           "backbone registry name with its layer (core.vision.backbones)")
    epochs: int = option(30, "training epochs", minimum=1)
    batch_size: int = option(8, "B: patients per global batch (≥ 2 per process)", minimum=2)
    max_wounds: int = option(8, "N_max: wounds sampled per patient and epoch", minimum=1)
    lr: float = option(1e-4, "learning rate", positive=True)
    lam: float = option(0.9, "λ, weight of the inner loss, in [0, 1]", minimum=0, metavar="λ", spelling="--lambda")
    temperature: float = option(0.07, "initial temperature (learnable)", positive=True)
    dim: int = option(128, "embedding dimension", minimum=1)
    crop_size: int | None = option(None, "crop side in px (default: backbone size; 128 with --continual)",
                                   positive=True, metavar="PX")
    seed: int = option(0, "random seed")
    continual: bool = option(False, "train only the image stem and the tabular input embeddings")
    init: str | None = option(None, "SLIMP checkpoint (path or run id) to start from")
    target: str | None = option(None, "categorical wound/photo/patient column for the linear probe and kNN")
    no_wound_meta: bool = option(False, "ablation: no wound-metadata encoder")
    no_patient_meta: bool = option(False, "ablation: no patient encoder (flat SLIMP)")
    ablation: bool = option(False, "probe w / w+h / w+h+x (paper Table 4 pattern); needs --target")
    permutations: int = option(100, "label permutations (within the same folds) for the probes' chance level "
                                    "(≥ 100; read with --target)", minimum=100)

    def __post_init__(self) -> None:
        check_options(self)
        if self.lam > 1:
            raise ValueError(f"lam must be in [0, 1], got {self.lam!r}")
        if self.no_wound_meta and self.no_patient_meta:
            raise ValueError("no_wound_meta and --no-patient-meta together leave nothing to contrast the images with")


#: the settings a checkpoint keeps (its ``"args"``), so that ``--resume`` trains on exactly as before
TRAIN_KEYS = ("backbone", "batch_size", "max_wounds", "lr", "lam", "temperature", "dim", "crop_size", "seed",
              "continual", "init", "target", "no_wound_meta", "no_patient_meta")
