"""Zoom that magnifies the wound (issue 54), in Chromium at 1366×768: three photos with one small wound each
(24 px of a 320-px photo, one at the photo's right edge); each triplet tile shows its wound at least 150 px
wide, and the zoom opens fitted to the wound (≥ 150 px, larger than the tile), 4× closer on a click, and pans."""
from __future__ import annotations

import io
import re

import numpy as np
import pytest
from conftest import PASSWORD
from PIL import Image
from playwright.sync_api import expect
from streamlit_page import idle, image_shown
from wound_photos import open_wound_masks, to_screen, wound_photo

from annotations.infra.workspace import Workspace
from annotations.io.dataset import import_dataset

expect.set_options(timeout=120_000)
pytestmark = [pytest.mark.browser, pytest.mark.slow]

LAPTOP = {"width": 1366, "height": 768}
#: One small wound per photo (ellipse boxes in a 320×240 photo): two inside, one touching the right edge.
WOUNDS = {"z-01": (150, 110, 173, 129), "z-02": (60, 40, 83, 59), "z-03": (296, 150, 319, 169)}


def wound_width(shot: bytes) -> int:
    """Screen pixels across the wound (dark red fill and its red outline) in a screenshot of one picture."""
    rgb = np.asarray(Image.open(io.BytesIO(shot)).convert("RGB"), dtype=np.int32)
    red = (rgb[..., 0] > 110) & (rgb[..., 1] < 100) & (rgb[..., 2] < 120)
    cols = np.nonzero(red.sum(0) >= 3)[0]
    return int(cols.max() - cols.min() + 1) if len(cols) else 0


def view_box(caption: str) -> tuple[int, int, int, int]:
    """(left, top, right, bottom) of the photo pixels a zoom caption says it shows ("… x0–x1 × y0–y1")."""
    x0, x1, y0, y1 = (int(v) for v in re.search(r"photo pixels (\d+)–(\d+) × (\d+)–(\d+)", caption).groups())
    return x0, y0, x1, y1


@pytest.fixture
def small_wounds(tmp_path, start_app, add_account):
    """A workspace of the three photos of :data:`WOUNDS`, outlined; its server and an annotator."""
    data = tmp_path / "data"
    (data / "images").mkdir(parents=True)
    (data / "masks").mkdir()
    for seed, (name, box) in enumerate(WOUNDS.items()):
        img, labels = wound_photo(seed, [box])
        Image.fromarray(img).save(data / "images" / f"{name}.png")
        Image.fromarray(labels).save(data / "masks" / f"{name}.png")
    ws = Workspace(tmp_path / "ws")
    import_dataset(ws, data)
    ws.store.close()
    return start_app(ws.root, tmp_path / "streamlit.log"), add_account(ws.root, "Dr Zoom")


def test_small_wounds_fill_the_tiles_and_the_zoom_magnifies_them(small_wounds, chromium, sign_in, screenshot):
    server, name = small_wounds
    context = chromium.new_context(viewport=LAPTOP)
    pg = context.new_page()
    pg.set_default_timeout(120_000)
    sign_in(pg, server.url, name)
    pg.goto(f"{server.url}/Triplets")
    expect(pg.get_by_text(re.compile(rf"^{name}: 0 of"))).to_be_visible()
    idle(pg)
    tiles = '[data-testid="stMain"] [data-testid="stImage"] img'
    image_shown(pg, tiles, 3)
    widths = [wound_width(pg.locator(tiles).nth(n).screenshot()) for n in range(3)]
    assert all(w >= 150 for w in widths), widths  # a 24-px wound of a 320-px photo, each tile ~430 px wide
    screenshot(pg, "triplets_small_wounds")
    pg.keyboard.press("w")  # zoom the query photo
    dialog = pg.get_by_role("dialog")
    expect(dialog.get_by_text(re.compile(r"^Query · z-0\d · wounds · photo pixels"))).to_be_visible()
    image_shown(pg, '[role="dialog"] [data-testid="stImage"] img')
    picture = dialog.get_by_test_id("stImage").locator("img")
    box = picture.bounding_box()
    assert box["y"] >= 0 and box["y"] + box["height"] <= LAPTOP["height"], box  # fits the laptop screen
    fitted = wound_width(picture.screenshot())
    assert fitted >= 150 and fitted > max(widths), (fitted, widths)
    screenshot(pg, "triplets_zoom_wound")
    caption = dialog.get_by_text(re.compile(r"photo pixels"))
    before = caption.inner_text()
    dialog.get_by_role("radio", name="4×").or_(dialog.get_by_role("button", name="4×")).first.click()
    expect(caption).to_contain_text("4× · photo pixels")
    image_shown(pg, '[role="dialog"] [data-testid="stImage"] img')
    idle(pg)
    four = caption.inner_text()
    fit, close = view_box(before), view_box(four)
    assert 32 <= close[2] - close[0] < fit[2] - fit[0]  # closer, down to a 32×24-px window
    assert wound_width(picture.screenshot()) > fitted
    dialog.get_by_role("button", name="Left").click()
    expect(caption).not_to_have_text(four)
    moved = view_box(caption.inner_text())
    assert moved[0] < close[0] and moved[2] - moved[0] == close[2] - close[0], (close, moved)  # half a window left
    pg.keyboard.press("Escape")
    expect(dialog).to_have_count(0)
    context.close()


def test_the_outline_editor_fits_the_wound_on_w(small_wounds, chromium):
    server, name = small_wounds
    context = chromium.new_context(viewport=LAPTOP)
    pg = context.new_page()
    open_wound_masks(pg, server.url, name, PASSWORD, "z-03")  # the wound at the right edge
    expect(pg.locator(".oe .zoom")).to_have_text("Zoom 100%")
    pg.locator(".oe svg").focus()
    pg.keyboard.press("w")
    zoom = int(re.fullmatch(r"Zoom (\d+)%", pg.locator(".oe .zoom").inner_text()).group(1))
    assert zoom >= 800, zoom  # a 23-px wound of a 320-px photo, with a quarter of its width on each side
    stage = pg.locator(".oe svg").bounding_box()
    left, top = to_screen(pg, 296, 150)
    right, bottom = to_screen(pg, 319, 169)
    assert stage["x"] <= left < right <= stage["x"] + stage["width"] and stage["y"] <= top < bottom <= stage["y"] + stage["height"]
    assert right - left >= 150, (left, right)  # the wound's width on screen
    context.close()
