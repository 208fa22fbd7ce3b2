"""A clinic's working day on the outline page, in Chromium at 1366×768 (issue 54): suggestions on an
outlined photo propose no rim around its outlines, the worklist's shortcut and buttons walk the photos,
an outline drawn and its photo marked done, a wound deleted after a confirmation and restored by Undo,
and a reload stays on the photo — the photo and every message in view throughout."""
from __future__ import annotations

import re
import time

import numpy as np
import pytest
from PIL import Image
from playwright.sync_api import expect
from scipy import ndimage
from streamlit_page import idle, wait_for_cookie
from wound_photos import draw, open_wound_masks, settled, tool, wound_photo

from annotations.accounts import accounts
from annotations.infra.workspace import Workspace
from annotations.io.dataset import import_dataset

expect.set_options(timeout=120_000)
pytestmark = [pytest.mark.browser, pytest.mark.slow]

USER, PASSWORD = "Dr Worklist", "worklist-pass-1234"
LAPTOP = {"width": 1366, "height": 768}


def default_components(img: np.ndarray) -> list[np.ndarray]:
    """The wounds the shipped default segmenter sees on ``img`` (what 'Suggest outlines' starts from)."""
    from core.segmentation import load_default
    from core.segmentation.interactive import wound_components

    seg = load_default("cpu")
    return wound_components(seg.probability(Image.fromarray(img)), 25, threshold=seg.threshold)


@pytest.fixture
def day(tmp_path, start_app):
    """Four photos: a-01 outlined 3 px inside each wound the default model sees (so the model finds them
    again a little larger: the rim case), a-02 outlined, a-03 and a-04 not outlined; an annotator."""
    data = tmp_path / "data"
    (data / "images").mkdir(parents=True)
    (data / "masks").mkdir()
    img, _ = wound_photo(0, [(60, 60, 140, 130), (190, 110, 270, 190)])
    found = default_components(img)
    assert found, "the default segmenter sees neither drawn wound"
    labels = np.zeros(img.shape[:2], np.uint8)
    for n, comp in enumerate(found, start=1):
        labels[ndimage.binary_erosion(comp, iterations=3)] = n
    Image.fromarray(img).save(data / "images" / "a-01.png")
    Image.fromarray(labels).save(data / "masks" / "a-01.png")
    img, labels = wound_photo(1, [(100, 70, 200, 160)])
    Image.fromarray(img).save(data / "images" / "a-02.png")
    Image.fromarray(labels).save(data / "masks" / "a-02.png")
    for n, name in enumerate(("a-03", "a-04"), start=2):
        Image.fromarray(wound_photo(n, [(40 + 30 * n, 50, 150 + 30 * n, 150)])[0]).save(data / "images" / f"{name}.png")
    ws = Workspace(tmp_path / "ws")
    import_dataset(ws, data)
    accounts.add_account(ws.store, USER, "annotator", PASSWORD, actor="test")
    return ws, start_app(ws.root, tmp_path / "streamlit.log"), len(found)


def in_view(pg, locator) -> None:
    """``locator`` lies wholly inside the 1366×768 window, without scrolling."""
    assert pg.evaluate("window.scrollY") == 0
    box = locator.bounding_box()
    assert box is not None and box["y"] >= 0 and box["y"] + box["height"] <= LAPTOP["height"], box


def photo_in_view(pg) -> None:
    in_view(pg, pg.locator(".oe svg image"))


def test_a_working_day_on_the_outline_page(day, chromium, screenshot):
    ws, server, found = day
    context = chromium.new_context(viewport=LAPTOP)
    page = context.new_page()
    page.set_default_timeout(120_000)
    started = time.monotonic()
    open_wound_masks(page, server.url, USER, PASSWORD)
    heading = lambda image_id: page.get_by_role("heading", name=f"Wounds of {image_id}")  # noqa: E731
    expect(heading("a-01")).to_be_visible()
    expect(page).to_have_url(re.compile(r"[?&]photo=a-01\b"))
    photo_in_view(page)

    # suggestions on an outlined photo: the wounds found again are skipped, no rim is proposed
    with settled(page, "suggesting on a-01"):
        page.get_by_role("button", name="Suggest outlines").click()
        message = page.get_by_text(re.compile(r"found no new wound on this photo; draw or click to outline\. "
                                              rf"{found} wound\(s\) it found on or beside the existing outlines are not "
                                              r"suggested again"))
        expect(message).to_be_visible()
        in_view(page, message)  # checked at once: a later rerun may clear the one-shot message
    expect(page.locator(".oe path.candidate")).to_have_count(0)
    photo_in_view(page)

    # the worklist: the Next shortcut, then the next photo without an outline
    with settled(page, "pressing n (Next)"):
        page.keyboard.press("n")
        expect(heading("a-02")).to_be_visible()
    with settled(page, "Next not outlined"):
        page.get_by_role("button", name="Next not outlined").click()
        expect(heading("a-03")).to_be_visible()
    expect(page).to_have_url(re.compile(r"[?&]photo=a-03\b"))

    # outline a wound, describe it, mark the photo done
    draw(page, [(110, 60), (200, 60), (200, 140), (110, 140)])
    with settled(page, "saving the drawn outline"):
        tool(page, "Save outline").click()
        saved = page.get_by_text("Saved wound 1 of a-03 (drawn)")
        expect(saved).to_be_visible()
        in_view(page, saved)
    photo_in_view(page)
    with settled(page, "describing wound 1"):
        page.get_by_label("Description").fill("slough at the upper edge")
        page.get_by_label("Description").press("Tab")
    assert ws.store.wound("a-03", 1)["description"] == "slough at the upper edge"
    with settled(page, "marking a-03 done"):
        page.get_by_role("button", name="Mark done").click()
        expect(page.get_by_text("Marked a-03 done.")).to_be_visible()
    assert ws.store.done_photos()["a-03"]["actor"] == USER
    before, mask = ws.store.wound("a-03", 1), ws.load_mask("a-03").copy()

    # delete asks first (in view), then Undo puts the wound back exactly
    with settled(page, "asking to delete wound 1"):
        page.get_by_role("button", name="Delete wound 1").click()
        question = page.get_by_text("Delete wound 1: its outline, description and metadata?")
        expect(question).to_be_visible()
    in_view(page, question)
    assert ws.store.wound("a-03", 1) is not None
    with settled(page, "confirming the deletion"):
        page.get_by_role("button", name="Yes, delete wound 1").click()
        expect(page.get_by_text("Deleted wound 1 of a-03")).to_be_visible()
    assert ws.store.wound("a-03", 1) is None
    expect(page.locator('.oe [data-label="1"]')).to_have_count(0)
    undo = page.get_by_role("button", name="Undo delete of wound 1")
    in_view(page, undo)
    with settled(page, "undoing the deletion"):
        undo.click()
        restored = page.get_by_text("Restored wound 1 of a-03")
        expect(restored).to_be_visible()
        in_view(page, restored)
    photo_in_view(page)
    after = ws.store.wound("a-03", 1)
    assert {k: after[k] for k in ("area", "bbox", "description", "metadata")} == {
        k: before[k] for k in ("area", "bbox", "description", "metadata")}
    assert (ws.load_mask("a-03") == mask).all()
    expect(page.get_by_label("Description")).to_have_value("slough at the upper edge")
    expect(page.locator('.oe [data-label="1"]')).to_have_count(1)
    screenshot(page, "worklist_1366x768")

    # a reload stays on the photo, which is still marked done
    wait_for_cookie(page)
    page.reload()  # a new session and websocket: wait for its first run to finish
    expect(heading("a-03")).to_be_visible()
    idle(page)
    expect(page.get_by_role("combobox", name="Photo")).to_have_value("a-03")
    expect(page.get_by_role("button", name="Not done")).to_be_visible()
    photo_in_view(page)
    context.close()
    print(f"working day on the outline page: {time.monotonic() - started:.1f} s")

