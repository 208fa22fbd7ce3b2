"""The shipped default segmenter keeps the expert's wound area on a small fixed set of real photos (fuseg-dev and
Medetec, from ../shared/data; skipped where absent): a drift guard for the weights in core/segmentation/default/.
Both sets trained the default, so this is not its held-out score (benchmarks.segmentation_default is)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from annotations.infra.workspace import DEFAULT_MIN_WOUND_AREA
from annotations.io.readers import mask_to_labels

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
#: Photos of each set by file name: the first ones holding a wound, fixed here so the set never moves.
PHOTOS = {"fuseg-dev": tuple(f"fuseg-val-{i:04d}" for i in range(1, 7)),
          "medetec": ("foot-ulcer-0001", "foot-ulcer-0003", "foot-ulcer-0004", "foot-ulcer-0005")}
#: The accepted band of the median predicted / expert area (issue 48).
BAND = (0.8, 1.25)


def fixed_photos() -> list[tuple[Path, Path]]:
    """(photo, mask) of :data:`PHOTOS`; skips the test when a set is absent."""
    out = []
    for name, stems in PHOTOS.items():
        root = SHARED / name
        if not (root / "images").is_dir():
            pytest.skip(f"the {name} photos are not at {root}")
        for stem in stems:
            found = sorted((root / "images").glob(f"{stem}.*"))
            assert found, f"{root / 'images'}: no photo {stem}"
            out.append((found[0], root / "masks" / f"{stem}.png"))
    return out


def test_the_shipped_segmenter_keeps_the_experts_area_on_fixed_real_photos():
    from core.segmentation import load_default
    from core.segmentation.interactive import wound_components

    photos = fixed_photos()
    seg = load_default("cpu")
    ratios = {}
    for photo, mask in photos:
        with Image.open(photo) as im, Image.open(mask) as m:
            truth = mask_to_labels(np.asarray(m)) > 0
            comps = wound_components(seg.probability(im.convert("RGB")), DEFAULT_MIN_WOUND_AREA,
                                     threshold=seg.threshold)
        assert truth.any(), f"{mask}: no wound (the fixed set must hold wounds)"
        ratios[photo.name] = sum(int(c.sum()) for c in comps) / int(truth.sum())
    median = float(np.median(list(ratios.values())))
    assert BAND[0] <= median <= BAND[1], (f"the default's predicted / expert area drifted to a median of {median:.2f} "
                                          f"(band {BAND}): " + ", ".join(f"{k} {v:.2f}" for k, v in ratios.items()))
