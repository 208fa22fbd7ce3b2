"""The concept models' names and the concepts job's options, in a module without torch:
``python -m core.train_concepts --help`` answers without loading it. :mod:`core.concepts.dual_encoder` and
:mod:`core.concepts.training` use the names (and re-export them); :class:`ConceptsConfig` is the job's options
(:func:`core.cli.add_config_options`), its fields the keys of the run record's config."""
from __future__ import annotations

from dataclasses import dataclass

from core.cli import check_options, option

#: the offline image–text model (EfficientNet-Lite0 + MiniLM)
OFFLINE_DEFAULT = "lite0-minilm"
#: the training objectives (``--objective``)
OBJECTIVES = ("clip", "siglip", "make", "conceptclip")


@dataclass(frozen=True)
class ConceptsConfig:
    """One ``concepts`` run: the objective, model, training, data split and concept scoring; the defaults are the
    job's."""

    objective: str = option("make", "training objective", choices=OBJECTIVES)
    model: str = option(OFFLINE_DEFAULT, f"image–text model ({OFFLINE_DEFAULT} offline, dermlip online)")
    epochs: int = option(30, "training epochs", minimum=1)
    batch_size: int = option(32, "batch size", minimum=2)
    lr: float = option(1e-3, "learning rate of the projection heads", positive=True)
    tower_lr: float = option(1e-4, "learning rate of the unlocked tower blocks", positive=True)
    unlock: int = option(0, "unlock the top N blocks of both towers (−1 = all)", minimum=-1, metavar="N")
    unlock_image: int | None = option(None, "override --unlock for the image tower", minimum=-1, metavar="N")
    unlock_text: int | None = option(None, "override --unlock for the text tower", minimum=-1, metavar="N")
    crop_size: int = option(160, "crop side in px", positive=True, metavar="PX")
    holdout: float = option(0.3, "held-out fraction (patient-grouped), in (0, 1)", positive=True)
    groups: str = option("wound", "concept vocabulary groups, comma-separated")
    target: str = option("body_region", "metadata column for the concept bottleneck")
    beta: float = option(0.5, "local/global fusion weight, in [0, 1]", minimum=0)
    seed: int = option(0, "random seed")
    untrained: bool = option(False, "evaluate the untrained heads (no training: --epochs, --batch-size, --lr, "
                                    "--tower-lr and the --unlock options are refused)")

    def __post_init__(self) -> None:
        check_options(self)
        if self.holdout >= 1:
            raise ValueError(f"holdout must be in (0, 1), got {self.holdout!r}")
        if self.beta > 1:
            raise ValueError(f"beta must be in [0, 1], got {self.beta!r}")


#: the options an ``--untrained`` run does not read (it trains nothing)
TRAINING_OPTIONS = frozenset({"epochs", "batch_size", "lr", "tower_lr", "unlock", "unlock_image", "unlock_text"})
