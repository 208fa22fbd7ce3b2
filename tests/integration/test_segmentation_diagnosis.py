"""The issue-48 diagnosis (benchmarks/segmentation_diagnosis.py) runs every part on a tiny SYNTHETIC set."""
from __future__ import annotations

import json

import pytest


def test_the_mask_ceiling_keeps_a_large_wound_whole():
    """A wound of whole stride-4 cells survives the target and its upsampling exactly (area ratio 1)."""
    import numpy as np
    import torch

    from benchmarks.segmentation import predict_mask
    from benchmarks.segmentation_diagnosis import CEILING_EPS, photo_row, upsample
    from core.segmentation.training import _target

    mask = np.zeros((512, 512), bool)
    mask[100:300, 120:360] = True
    logit = torch.logit(_target(mask, (128, 128)).float(), eps=CEILING_EPS)
    for mode in ("logits", "probabilities"):
        row = photo_row(predict_mask(upsample(logit, mask.shape, ("identity",), mode)), mask)
        assert row["dice"] > 0.99 and row["ratio"] == pytest.approx(1.0, abs=0.01)


@pytest.mark.slow
def test_every_part_on_a_tiny_set(tmp_path, tiny_phantom):
    from benchmarks.segmentation_diagnosis import main
    data = tiny_phantom(0, 8, 4, 12, 10)
    common = ["--fuseg", str(data), "--medetec", str(data), "--work", str(tmp_path), "--quiet"]
    for part in ("features", "default"):
        assert main([*common, "--part", part]) == 0
    assert main([*common, "--part", "train", "--epochs", "1", "--dice-weight", "0"]) == 0
    assert main([*common, "--part", "report"]) == 0
    per_photo = json.loads((tmp_path / "report.json").read_text(encoding="utf-8"))
    assert {"ceiling", "logits-default-fuseg", "logits-default-medetec", "logits-folds2-e1-dice0-fuseg"} <= set(
        per_photo)
    held_out = per_photo["logits-folds2-e1-dice0-fuseg"]
    assert len(held_out["logits/2/0.5"]) == len(per_photo["logits-default-fuseg"]["logits/2/0.5"])  # every photo once
    assert len(held_out["losses"]) == 2 and all(len(loss) == 1 for loss in held_out["losses"])
    assert "Calibration" in (tmp_path / "report.md").read_text(encoding="utf-8")
