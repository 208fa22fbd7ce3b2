"""A new workspace in Chromium: "Suggest outlines" on a photo never outlined proposes the default segmenter's
outlines (the model shipped with the package; no segmenter run in the workspace)."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from playwright.sync_api import expect
from wound_photos import open_wound_masks, settled

from annotations.accounts import accounts
from annotations.infra.workspace import Workspace
from annotations.io.dataset import import_dataset
from annotations.io.readers import mask_to_labels

expect.set_options(timeout=120_000)
pytestmark = [pytest.mark.browser, pytest.mark.slow]

MEDETEC = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "medetec"
USER, PASSWORD = "Dr New", "new-clinic-pass-1234"


def seen_by_default(limit: int = 12) -> str:
    """The first Medetec photo (by name) on which the default segmenter's outline meets the expert's wound."""
    from core.segmentation import load_default
    from core.segmentation.metrics import dice

    seg = load_default("cpu")
    for path in sorted((MEDETEC / "images").glob("*.png"))[:limit]:
        with Image.open(path) as im, Image.open(MEDETEC / "masks" / path.name) as m:
            truth = mask_to_labels(np.asarray(m)) > 0
            if dice(seg.probability(im) >= seg.threshold, truth) >= 0.5:
                return path.stem
    pytest.fail(f"the default segmenter meets no wound on the first {limit} Medetec photos")


@pytest.fixture
def new_clinic(tmp_path, start_app):
    """A new workspace holding one real photo (imported without its mask) and an annotator account."""
    if not (MEDETEC / "images").is_dir():
        pytest.skip(f"the Medetec photos are not at {MEDETEC}")
    photo = seen_by_default()
    (tmp_path / "data" / "images").mkdir(parents=True)
    shutil.copy(MEDETEC / "images" / f"{photo}.png", tmp_path / "data" / "images")
    ws = Workspace(tmp_path / "ws")
    import_dataset(ws, tmp_path / "data")
    accounts.add_account(ws.store, USER, "annotator", PASSWORD, actor="test")
    return ws, photo, start_app(ws.root, tmp_path / "streamlit.log")


def test_a_new_workspace_suggests_outlines_from_the_default_model(new_clinic, page):
    from core.segmentation import load_segmenter, suggest_outlines

    ws, photo, server = new_clinic
    assert ws.store.runs(kind="segmenter") == [] and not ws.store.wounds(photo)  # nothing trained, never outlined
    model = load_segmenter(ws)
    expected = suggest_outlines(ws, photo, model)
    assert model.source == "default" and expected

    open_wound_masks(page, server.url, USER, PASSWORD, photo)
    with settled(page, "Suggest outlines"):
        page.get_by_role("button", name="Suggest outlines").click()
        expect(page.get_by_text(f"{len(expected)} suggested outline(s) by the default wound model")).to_be_visible()
        expect(page.locator(".oe path.candidate")).to_have_count(len(expected))
    assert not ws.store.wounds(photo)  # proposals only: nothing stored until accepted
