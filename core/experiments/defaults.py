"""The contrastive benchmark's names and options that ``python -m core.bench_contrastive --help`` shows, in a module
without torch or scikit-learn; :mod:`core.experiments.contrastive` uses these (and re-exports them).
:class:`ContrastiveConfig` is the job's options (:func:`core.cli.add_config_options`)."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from core.cli import check_options, option
from core.concepts.defaults import OFFLINE_DEFAULT

VARIANTS = ("clip", "siglip", "image_frozen", "text_frozen", "image_partial", "text_partial",
            "clip_unimodal", "clip_masked", "flip")
#: the benchmark's folder under the workspace's runs/
OUT_DIR = "bench_contrastive"


@dataclass(frozen=True)
class ContrastiveConfig:
    """One run of the benchmark: every variant's shared settings, the seeds and the variants; ``None``: the
    ``quick`` or full default (:meth:`settled`)."""

    quick: bool = option(False, "1 seed, 2 epochs, 96 px crops")
    model: str = option(OFFLINE_DEFAULT, "image–text model")
    n_seeds: int | None = option(None, "number of seeds 0 … N−1 (default 5; quick 1)", minimum=1, metavar="N")
    epochs: int | None = option(None, "epochs (default 8; quick 2)", minimum=1)
    crop_size: int | None = option(None, "crop side in px (default 160; quick 96)", minimum=32, metavar="PX")
    batch_size: int = option(32, "batch size", minimum=2)
    lr: float = option(1e-3, "learning rate of the projection heads", positive=True)
    tower_lr: float = option(1e-4, "learning rate of the unlocked tower blocks", positive=True)
    partial_image: int = option(2, "image_partial: top L image blocks unlocked", minimum=1, metavar="L")
    partial_text: int = option(3, "text_partial: top L text layers unlocked", minimum=1, metavar="L")
    lam: float = option(0.5, "clip_unimodal, clip_masked: λ of λ·L_clip + (1−λ)·L_uni, in [0, 1]", minimum=0,
                        metavar="λ", spelling="--lambda")
    patch_dropout: float = option(0.5, "flip: fraction of ViT patches dropped, in [0, 1)", minimum=0)
    holdout: float = option(0.3, "held-out fraction (patient-grouped), in (0, 1)", positive=True)
    target: str = option("fitzpatrick", "metadata column for the linear probe")
    variants: str = option(",".join(VARIANTS), "comma-separated subset")
    fresh: bool = option(False, "ignore cached cells")

    def __post_init__(self) -> None:
        check_options(self)
        if self.holdout >= 1:
            raise ValueError(f"holdout must be in (0, 1), got {self.holdout!r}")
        if self.lam > 1:
            raise ValueError(f"lam must be in [0, 1], got {self.lam!r}")
        if self.patch_dropout >= 1:
            raise ValueError(f"patch_dropout must be in [0, 1), got {self.patch_dropout!r}")
        bad = [v for v in self.names if v not in VARIANTS]
        if bad or not self.names:
            raise ValueError(f"variants: unknown variant(s) {bad or self.variants!r}; choose from {VARIANTS}")

    @property
    def names(self) -> list[str]:
        """The variants to run, in the order given."""
        return [v.strip() for v in self.variants.split(",") if v.strip()]

    def settled(self) -> ContrastiveConfig:
        """The config with the ``quick``-dependent defaults filled in."""
        filled: dict[str, Any] = {name: quick if self.quick else full for name, (quick, full) in QUICK.items()
                                  if getattr(self, name) is None}
        return replace(self, **filled)

    def settings(self) -> dict[str, Any]:
        """The settings every cell is trained with (:data:`SETTINGS`; the key of a cached cell)."""
        return {k: getattr(self, k) for k in SETTINGS}


#: the (quick, full) defaults of the options whose default ``--quick`` changes
QUICK = {"n_seeds": (1, 5), "epochs": (2, 8), "crop_size": (96, 160)}
#: the settings shared by every cell (:meth:`ContrastiveConfig.settings`)
SETTINGS = ("model", "epochs", "crop_size", "batch_size", "lr", "tower_lr", "partial_image", "partial_text", "lam",
            "patch_dropout", "holdout", "target")
#: the options only some variants read: option → those variants
VARIANT_OPTIONS = {"partial_image": ("image_partial",), "partial_text": ("text_partial",),
                   "lam": ("clip_unimodal", "clip_masked"), "patch_dropout": ("flip",)}
