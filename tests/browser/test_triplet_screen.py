"""The triplet screen at 1366×768 and the admin review page, in Chromium."""
from __future__ import annotations

import io
import re

import numpy as np
import pytest
from PIL import Image, ImageOps
from playwright.sync_api import expect
from streamlit_page import idle, image_shown

from annotations.infra.workspace import Workspace
from app.images import outline_overlay

expect.set_options(timeout=60_000)
FRAME = (960, 720)  # the Triplets page's letterbox of each photo (pages/2_Triplets.py)
pytestmark = [pytest.mark.browser, pytest.mark.slow]


def framed(photo: Image.Image, size: tuple[int, int]) -> np.ndarray:
    """``photo`` in the Triplets page's letterbox frame, resized to ``size`` (RGB int array)."""
    fitted = ImageOps.contain(photo.convert("RGB"), FRAME)
    frame = Image.new("RGB", FRAME, (242, 245, 247))
    frame.paste(fitted, ((FRAME[0] - fitted.width) // 2, (FRAME[1] - fitted.height) // 2))
    return np.asarray(frame.resize(size), dtype=np.int32)


def test_triplet_photos_large_outlined_and_zoomable(app_server, chromium, add_account, sign_in, screenshot):
    name = add_account(app_server.workspace, "Dr Screen")
    context = chromium.new_context(viewport={"width": 1366, "height": 768})
    pg = context.new_page()
    sign_in(pg, app_server.url, name)
    pg.goto(f"{app_server.url}/Triplets")
    expect(pg.get_by_text(re.compile(rf"^{name}: 0 of"))).to_be_visible()
    idle(pg)
    photos = pg.get_by_test_id("stMain").get_by_test_id("stImage").locator("img")
    expect(photos).to_have_count(3)
    screenshot(pg, "triplets_1366x768")  # the default view: each photo cropped around its wounds
    expect(pg.get_by_text("Shown: cropped around the outlined wounds")).to_be_visible()
    pg.keyboard.press("f")  # one key to the whole photo
    expect(pg.get_by_text("Shown: the whole photo")).to_be_visible()
    idle(pg)
    image_shown(pg, '[data-testid="stMain"] [data-testid="stImage"] img', 3)  # the whole photos, loaded
    boxes = [photos.nth(i).bounding_box() for i in range(3)]
    assert all(b["width"] >= 420 for b in boxes), boxes  # anchor and both references
    assert boxes[0]["x"] < boxes[1]["x"] < boxes[2]["x"] and max(b["x"] + b["width"] for b in boxes) <= 1366
    ws = Workspace(app_server.workspace)
    ids = [pg.get_by_role("button", name=re.compile(f"Zoom {role} · ")).inner_text().split("· ")[1].split()[0]
           for role in ("left", "query", "right")]
    for n, image_id in enumerate(ids):  # each photo with outlined wounds carries their outline colours
        shown = photos.nth(n).screenshot()
        if ws.store.wounds(image_id):
            # the shown photo is far closer, on the contour pixels, to the photo with its outlines drawn
            # than to the plain photo (both in the page's letterbox, at the size shown)
            size = Image.open(io.BytesIO(shown)).size
            photo, labels = ws.load_image(image_id), ws.load_mask(image_id)
            plain, drawn = framed(photo, size), framed(outline_overlay(photo, labels), size)
            seen = np.asarray(Image.open(io.BytesIO(shown)).convert("RGB"), dtype=np.int32)
            contour = np.abs(drawn - plain).sum(-1) > 60
            assert contour.sum() > 20, image_id
            to_drawn, to_plain = (np.abs(seen - x).sum(-1)[contour].mean() for x in (drawn, plain))
            assert to_drawn < 0.5 * to_plain, (image_id, to_drawn, to_plain)
    pg.keyboard.press("w")  # zoom the query photo
    dialog = pg.get_by_role("dialog")
    expect(dialog).to_be_visible()
    expect(dialog.get_by_text(f"Query · {ids[1]}")).to_be_visible()
    image_shown(pg, '[role="dialog"] img')  # its box is 0 px high until the photo's bytes arrive
    box = dialog.locator("img").first.bounding_box()
    assert box["width"] > 500 and box["y"] >= 0 and box["y"] + box["height"] <= 768, box  # fits a laptop screen
    screenshot(pg, "triplets_zoom")
    pg.keyboard.press("Escape")
    expect(dialog).to_have_count(0)
    pg.keyboard.press("ArrowLeft")
    expect(pg.get_by_text(re.compile(rf"^{name}: 1 of"))).to_be_visible()
    assert [r["choice"] for r in ws.store.triplets(source=f"expert:{name}")] == ["j"]
    assert pg.get_by_text("Cohen").count() == 0 and pg.get_by_text("consistency").count() == 0
    context.close()


def test_review_page_excludes_a_practice_annotator(app_server, chromium, add_account, sign_in, screenshot):
    ws = Workspace(app_server.workspace)
    expert = ws.store.expert_triplets()[:8]
    for n, row in enumerate(expert):  # a practice account sharing the expert's triplets, disagreeing on some
        ws.store.add_triplet(row["anchor"], row["ref_j"], row["ref_k"], row["choice"] if n % 3 else
                             ("k" if row["choice"] == "j" else "j"), "expert:Practice Run")
    before = len(ws.store.expert_triplets())
    name = add_account(app_server.workspace, "Dr Admin", "admin")
    context = chromium.new_context(viewport={"width": 1366, "height": 900})
    pg = context.new_page()
    sign_in(pg, app_server.url, name)
    pg.get_by_role("link", name="Review").click()
    expect(pg.get_by_role("heading", name="Review")).to_be_visible()
    idle(pg)
    expect(pg.get_by_test_id("stDataFrame").first).to_be_visible()
    pg.get_by_role("tab", name="Agreement", exact=True).click()
    expect(pg.get_by_text("Cohen's κ between annotators")).to_be_visible()
    pg.get_by_role("tab", name="Disagreements", exact=True).click()
    expect(pg.get_by_text(re.compile(r"\d+ shared triplets answered differently"))).to_be_visible()
    pg.get_by_role("tab", name="Annotators", exact=True).click()
    screenshot(pg, "review")
    pg.get_by_role("textbox", name="Reason").fill("draft, not submitted")  # typing, then the sidebar at once
    pg.get_by_role("link", name="Report").click()
    expect(pg.get_by_role("heading", name="Report")).to_be_visible()
    pg.get_by_role("link", name="Review").click()
    expect(pg.get_by_role("heading", name="Review")).to_be_visible()
    idle(pg)
    pg.get_by_test_id("stSelectbox").filter(has_text="Annotator").click()
    pg.get_by_role("option", name="Practice Run").click()
    idle(pg)
    pg.get_by_role("textbox", name="Reason").fill("practice account")
    pg.get_by_role("button", name="Exclude", exact=True).click()
    expect(pg.get_by_text("Excluded by Dr Admin: practice account")).to_be_visible()
    assert len(ws.store.expert_triplets()) == before - len(expert)
    assert len(ws.store.expert_triplets(include_excluded=True)) == before
    pg.get_by_role("tab", name="Audit trail", exact=True).click()
    expect(pg.get_by_test_id("stMultiSelect").get_by_text("Accounts")).to_be_visible()
    assert ws.store.revisions("exclusions")[-1]["actor"] == name
    context.close()
