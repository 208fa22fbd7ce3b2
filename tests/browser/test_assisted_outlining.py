"""Assisted outlining in Chromium: the trained segmenter's suggestions accepted, edited and rejected
(stored masks and origins checked), and click-to-outline on a real Medetec photo."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from playwright.sync_api import expect
from scipy import ndimage
from wound_photos import open_wound_masks, settled, to_screen, tool, wound_photo

from annotations.accounts import accounts, session
from annotations.infra.workspace import Workspace
from annotations.io.dataset import import_dataset

expect.set_options(timeout=120_000)
pytestmark = [pytest.mark.browser, pytest.mark.slow]

MEDETEC = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "medetec"
USER, PASSWORD = "Dr Assist", "assist-pass-1234"


def candidate_mask(pg, key: str, shape: tuple[int, int]) -> np.ndarray:
    """The proposal ``key`` as drawn in the editor, rasterised like a saved outline."""
    polys = []
    for d in pg.locator(f'.oe path.candidate[data-key="{key}"]').evaluate_all("els => els.map(e => e.getAttribute('d'))"):
        for ring in d.strip("MZ").split("ZM"):
            polys.append([tuple(map(float, p.split(","))) for p in ring.split("L")])
    return session.rasterise_outlines(polys, shape)


@pytest.fixture
def suggest_app(tmp_path, start_app):
    """Six photos with masks, a segmenter trained on them (a real, short training run), and one new
    photo with three wounds and no outline; an annotator account."""
    from core.segmentation.defaults import SegmenterConfig
    from core.segmentation.training import train_segmenter

    data = tmp_path / "data"
    (data / "images").mkdir(parents=True)
    (data / "masks").mkdir()
    rng = np.random.default_rng(1)
    for i in range(6):
        blobs = []
        for _ in range(int(rng.integers(1, 4))):
            x, y = int(rng.integers(20, 240)), int(rng.integers(20, 160))
            blobs.append((x, y, x + int(rng.integers(30, 70)), y + int(rng.integers(30, 60))))
        img, labels = wound_photo(i, blobs)
        Image.fromarray(img).save(data / "images" / f"train-{i}.png")
        Image.fromarray(labels).save(data / "masks" / f"train-{i}.png")
    img, truth = wound_photo(99, [(30, 40, 100, 100), (150, 30, 220, 90), (110, 140, 200, 210)])
    Image.fromarray(img).save(data / "images" / "new-01.png")
    ws = Workspace(tmp_path / "ws")
    import_dataset(ws, data)
    train_segmenter(ws, config=SegmenterConfig(epochs=15, val_fraction=0), progress=False)
    accounts.add_account(ws.store, USER, "annotator", PASSWORD, actor="test")
    return ws, truth, start_app(ws.root, tmp_path / "streamlit.log")


def test_suggest_accept_edit_reject(suggest_app, page):
    from core.segmentation import load_segmenter, suggest_outlines

    ws, _, server = suggest_app
    proposed = suggest_outlines(ws, "new-01", load_segmenter(ws))
    assert len(proposed) == 3  # the trained model sees the three wounds
    open_wound_masks(page, server.url, USER, PASSWORD, "new-01")
    with settled(page, "Suggest outlines"):
        page.get_by_role("button", name="Suggest outlines").click()
        expect(page.get_by_text("3 suggested outline(s)")).to_be_visible()
        expect(page.locator(".oe path.candidate")).to_have_count(3)

    # accept the first (selected on arrival) as it is
    with settled(page, "accepting the first suggestion"):
        tool(page, "Accept suggestion").click()
        expect(page.get_by_text("Saved wound 1 of new-01 (suggested)")).to_be_visible()
        expect(page.locator(".oe path.candidate")).to_have_count(2)

    # edit the next one: pull a vertex outwards, then accept
    vertex = page.locator('.oe circle.vertex[data-key="c2"]').first
    x, y = float(vertex.get_attribute("cx")), float(vertex.get_attribute("cy"))
    cy, cx = ndimage.center_of_mass(proposed[1])
    dx, dy = np.sign(x - cx) * 8, np.sign(y - cy) * 8
    page.mouse.move(*to_screen(page, x, y))
    page.mouse.down()
    page.mouse.move(*to_screen(page, x + dx, y + dy), steps=5)
    page.mouse.up()
    with settled(page, "accepting the edited suggestion"):
        tool(page, "Accept suggestion").click()
        expect(page.get_by_text("Saved wound 2 of new-01 (edited)")).to_be_visible()
        expect(page.locator(".oe path.candidate")).to_have_count(1)

    # reject the last
    with settled(page, "rejecting the last suggestion"):
        tool(page, "Reject suggestion").click()
        expect(page.locator(".oe path.candidate")).to_have_count(0)

    labels = ws.load_mask("new-01")
    wounds = {w["wound_index"]: w for w in ws.store.wounds("new-01")}
    assert {i: w["metadata"]["origin"] for i, w in wounds.items()} == {1: "suggested", 2: "edited"}
    assert ((labels == 1) == proposed[0]).all()  # accepted unchanged: the model's own pixels
    edited = labels == 2
    assert edited.sum() > proposed[1].sum() and (edited & proposed[1]).sum() / proposed[1].sum() > 0.97
    assert not (labels > 0)[proposed[2]].any()  # the rejected wound stays unoutlined
    assert wounds[1]["area"] == int(proposed[0].sum()) and wounds[2]["area"] == int(edited.sum())
    assert {r["actor"] for r in ws.store.revisions("wounds") if r["actor"] != "import"} == {USER}


@pytest.fixture
def medetec_app(tmp_path, start_app):
    if not (MEDETEC / "images").is_dir():
        pytest.skip(f"the Medetec photos are not at {MEDETEC}")
    ws = Workspace(tmp_path / "ws")
    import_dataset(ws, MEDETEC)
    accounts.add_account(ws.store, USER, "annotator", PASSWORD, actor="test")
    return ws, start_app(ws.root, tmp_path / "streamlit.log")


def test_click_to_outline_on_medetec(medetec_app, page):
    ws, server = medetec_app
    photo = "foot-ulcer-0001"
    truth = ws.load_mask(photo) > 0
    for w in ws.store.wounds(photo):  # the photo as it arrives in a clinic: not outlined yet
        session.delete_wound(ws, photo, w["wound_index"], actor="test")
    largest = ndimage.label(truth)[0]
    largest = largest == np.bincount(largest.ravel()[largest.ravel() > 0]).argmax()
    depth = ndimage.distance_transform_edt(largest)
    y, x = np.unravel_index(depth.argmax(), depth.shape)  # the wound's innermost pixel

    open_wound_masks(page, server.url, USER, PASSWORD, photo)
    # the online choice without its package or checkpoint: one clear message, nothing proposed
    sam_path = page.get_by_role("textbox", name="Segment Anything checkpoint (.pth)")
    with settled(page, "choosing Segment Anything"):
        page.get_by_text("Segment Anything", exact=True).click()
        expect(sam_path).to_be_visible()
    sam_path.fill("/nonexistent/sam_vit_b.pth")
    with settled(page, "entering the checkpoint path"):
        sam_path.press("Enter")
    tool(page, "Click to outline").click()
    with settled(page, "clicking with Segment Anything"):
        page.mouse.click(*to_screen(page, x + 0.5, y + 0.5))
        expect(page.get_by_text(re.compile(r"Segment Anything (needs the 'segment-anything' package|checkpoint not "
                                           r"found: /nonexistent/sam_vit_b\.pth)"))).to_be_visible()
    assert page.locator(".oe path.candidate").count() == 0
    with settled(page, "choosing the wound model"):
        page.get_by_text("Wound model", exact=True).click()

    with settled(page, "clicking inside the wound"):
        page.mouse.click(*to_screen(page, x + 0.5, y + 0.5))
        expect(page.locator('.oe path.candidate[data-key="cclick"]')).to_have_count(1)
    first = candidate_mask(page, "cclick", truth.shape)
    # no segmenter is trained in this workspace: the default one (GrabCut where it sees no wound under the
    # click) proposes a region around the click that is mostly the expert's wound and no speck of it (how much
    # of the wound it covers is the segmenter benchmark's business, not this test's: the default retrained in
    # stop 43 covers 35 % of this wound, all of its proposal inside it)
    assert first[y, x] and (first & truth).sum() / first.sum() > 0.5 and first.sum() > 0.2 * largest.sum()

    # a second click, on a part of the proposal outside the expert's wound, removes it; a proposal inside the
    # wound is split at its point farthest from the first click, 3 px inside it (a click on its rim may land
    # a pixel outside the proposal on screen)
    spill = first & ~ndimage.binary_dilation(largest, iterations=2)
    far = ndimage.distance_transform_edt(~largest)
    if not spill.any():
        spill = ndimage.binary_erosion(first, iterations=3)
        far = np.hypot(*(np.mgrid[:truth.shape[0], :truth.shape[1]] - np.array([y, x])[:, None, None]))
    ey, ex = np.unravel_index(np.where(spill, far, -1).argmax(), far.shape)
    with settled(page, "clicking outside the wound"):
        page.mouse.click(*to_screen(page, ex + 0.5, ey + 0.5))
        expect(page.locator(".oe circle.click-pt")).to_have_count(2)
    second = candidate_mask(page, "cclick", truth.shape)
    assert second[y, x] and not second[ey, ex] and second.sum() < first.sum()

    tool(page, "Accept suggestion").click()
    expect(page.get_by_text(re.compile(rf"Saved wound \d+ of {photo} \(suggested\)"))).to_be_visible()
    (wound,) = ws.store.wounds(photo)
    assert wound["metadata"]["origin"] == "suggested"
    assert wound["area"] == int((ws.load_mask(photo) == wound["wound_index"]).sum()) > 0
