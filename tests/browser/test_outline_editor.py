"""The outline editor in Chromium: zoom and pan, vertex editing with undo/redo, drawing, the
minimum wound area, invalid outlines, the overlap decision, the photo kept after saving, and every
imported metadata field in its own box."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from playwright.sync_api import expect
from wound_photos import choose_photo, draw, open_wound_masks, settled, to_screen, tool, wound_photo

from annotations.accounts import accounts
from annotations.infra.workspace import Workspace
from annotations.io.dataset import import_dataset

expect.set_options(timeout=60_000)
pytestmark = [pytest.mark.browser, pytest.mark.slow]

USER, PASSWORD = "Dr Outline", "outline-pass-1234"
WOUNDS_CSV = ("image_id,wound_index,description,anatomical_site,size_cm,exudate\n"
              "leg-01,1,fibrin base,left shin,3.5,moderate\n"
              "leg-01,2,,right calf,2,\n")


def make_workspace(root: Path, data: Path, min_area: int | None = None) -> Workspace:
    """Two photos: leg-01 with two outlined wounds (and metadata), leg-02 without outlines."""
    (data / "images").mkdir(parents=True)
    (data / "masks").mkdir()
    img, labels = wound_photo(0, [(60, 60, 140, 130), (190, 110, 270, 190)])
    Image.fromarray(img).save(data / "images" / "leg-01.png")
    Image.fromarray(labels).save(data / "masks" / "leg-01.png")
    Image.fromarray(wound_photo(1, [(100, 70, 200, 160)])[0]).save(data / "images" / "leg-02.png")
    (data / "wounds.csv").write_text(WOUNDS_CSV)
    ws = Workspace(root)
    import_dataset(ws, data)
    if min_area is not None:
        ws.store.set_meta("min_wound_area", min_area)
    accounts.add_account(ws.store, USER, "annotator", PASSWORD, actor="test")
    return ws


def image_width(pg) -> float:
    return pg.locator(".oe svg image").bounding_box()["width"]


@pytest.fixture
def app(tmp_path, start_app):
    def start(min_area: int | None = None):
        ws = make_workspace(tmp_path / "ws", tmp_path / "data", min_area)
        return ws, start_app(ws.root, tmp_path / "streamlit.log")
    return start


def test_zoom_vertex_edit_undo_and_photo_kept(app, page, screenshot):
    ws, server = app()
    open_wound_masks(page, server.url, USER, PASSWORD)
    # every imported metadata field in its own box
    expect(page.get_by_role("textbox", name="Anatomical site").first).to_have_value("left shin")
    expect(page.get_by_role("textbox", name="Size (cm)").first).to_have_value("3.5")
    expect(page.get_by_role("textbox", name="Exudate").first).to_have_value("moderate")
    expect(page.get_by_role("textbox", name="Anatomical site").nth(1)).to_have_value("right calf")

    # zoom: the photo is drawn larger, the readout follows; panning moves the view
    fit_width = image_width(page)
    tool(page, "+").click()
    tool(page, "+").click()
    expect(page.locator(".oe .zoom")).to_have_text("Zoom 225%")
    assert image_width(page) == pytest.approx(2.25 * fit_width, rel=0.02)
    view = page.locator(".oe svg").get_attribute("viewBox")
    x0, y0 = to_screen(page, 160, 150)  # skin, between the wounds: dragging it pans
    page.mouse.move(x0, y0)
    page.mouse.down()
    page.mouse.move(x0 + 60, y0 + 30, steps=4)
    page.mouse.up()
    assert page.locator(".oe svg").get_attribute("viewBox") != view
    tool(page, "Fit").click()
    tool(page, "+").click()  # 150%

    # vertex editing: select wound 1, drag a vertex, undo, redo, save
    area_before = ws.store.wounds("leg-01")[0]["area"]
    page.mouse.click(*to_screen(page, 100, 95))
    vertex = page.locator('.oe circle.vertex[data-key="w1"]')
    assert vertex.count() >= 3
    v0 = vertex.nth(0)
    start = (float(v0.get_attribute("cx")), float(v0.get_attribute("cy")))
    page.mouse.move(*to_screen(page, *start))
    page.mouse.down()
    page.mouse.move(*to_screen(page, start[0] - 12, start[1] - 12), steps=5)
    page.mouse.up()
    moved = (float(v0.get_attribute("cx")), float(v0.get_attribute("cy")))
    assert moved[0] == pytest.approx(start[0] - 12, abs=1) and moved[1] == pytest.approx(start[1] - 12, abs=1)
    tool(page, "Undo").click()
    assert (float(v0.get_attribute("cx")), float(v0.get_attribute("cy"))) == pytest.approx(start)
    tool(page, "Redo").click()
    assert (float(v0.get_attribute("cx")), float(v0.get_attribute("cy"))) == pytest.approx(moved)
    # a vertex added on an edge (double-click), one deleted (Alt+click); both undoable
    n = vertex.count()
    pts = [(float(vertex.nth(i).get_attribute("cx")), float(vertex.nth(i).get_attribute("cy"))) for i in range(n)]
    gap = max(range(n), key=lambda i: np.hypot(*np.subtract(pts[i], pts[(i + 1) % n])))  # the longest edge
    page.mouse.dblclick(*to_screen(page, *np.add(pts[gap], pts[(gap + 1) % n]) / 2))
    expect(vertex).to_have_count(n + 1)
    vertex.nth(4).click(modifiers=["Alt"])
    expect(vertex).to_have_count(n)
    tool(page, "Undo").click()
    expect(vertex).to_have_count(n + 1)
    with settled(page, "saving wound 1"):
        tool(page, "Save outline").click()
        expect(page.get_by_text("Saved wound 1 of leg-01")).to_be_visible()
    # the mouse wheel zooms about the pointer: wound 1 stays under it
    tool(page, "Fit").click()
    at = to_screen(page, 100, 95)
    page.mouse.move(*at)
    for _ in range(3):
        page.mouse.wheel(0, -100)
    expect(page.locator(".oe .zoom")).to_have_text("Zoom 195%")
    assert to_screen(page, 100, 95) == pytest.approx(at, abs=1)
    page.mouse.click(*at)
    expect(vertex.first).to_be_visible()
    screenshot(page, "outline_editor")
    wound = ws.store.wounds("leg-01")[0]
    assert wound["area"] > area_before  # the vertex was pulled outwards
    assert wound["area"] == int((ws.load_mask("leg-01") == 1).sum())

    # a new outline on the second photo: the page stays on that photo after saving
    choose_photo(page, "leg-02")
    draw(page, [(40, 40), (90, 40), (90, 80), (40, 80)])
    tool(page, "Save outline").click()
    expect(page.get_by_text("Saved wound 1 of leg-02 (drawn)")).to_be_visible()
    expect(page.get_by_role("heading", name="Wounds of leg-02")).to_be_visible()
    expect(page.get_by_role("combobox", name="Photo")).to_have_value("leg-02")
    (saved,) = ws.store.wounds("leg-02")
    assert saved["bbox"] == [40, 40, 90, 80] and saved["area"] == 50 * 40
    assert saved["metadata"]["origin"] == "drawn"
    assert {r["actor"] for r in ws.store.revisions("wounds") if r["actor"] != "import"} == {USER}


def test_min_area_invalid_outlines_and_overlap_decision(app, page):
    ws, server = app(min_area=400)
    open_wound_masks(page, server.url, USER, PASSWORD)
    before = ws.load_mask("leg-01").copy()

    draw(page, [(20, 20), (32, 20), (20, 32)])  # ~80 px, under the 400 px minimum
    with settled(page, "saving a too small outline"):
        tool(page, "Save outline").click()
        expect(page.get_by_text(re.compile(r"less than this workspace's minimum wound area of 400 px"))).to_be_visible()
    tool(page, "Undo").click()  # the refused outline is still there to fix: undo its closing
    expect(page.locator(".oe .hint")).to_have_text("Undone.")
    page.keyboard.press("Escape")

    draw(page, [(10, 150), (60, 200), (60, 150), (10, 200)])  # a bow tie: its edges cross
    with settled(page, "saving a crossing outline"):
        tool(page, "Save outline").click()
        expect(page.get_by_text(re.compile(r"The outline crosses itself"))).to_be_visible()

    tool(page, "Draw new").click()  # two points and Enter: refused in the editor itself
    for x, y in [(150, 20), (170, 30)]:
        page.mouse.click(*to_screen(page, x, y))
    page.locator(".oe svg").press("Enter")
    expect(page.locator(".oe .hint")).to_have_text("An outline needs at least 3 vertices; this one has 2.")
    page.keyboard.press("Escape")
    assert len(ws.store.wounds("leg-01")) == 2 and (ws.load_mask("leg-01") == before).all()

    # overlapping wound 1: shown, and the clinician decides who keeps the shared pixels
    draw(page, [(120, 70), (170, 70), (170, 110), (120, 110)])
    tool(page, "Save outline").click()
    expect(page.get_by_text(re.compile(r"The new outline overlaps wound 1 \([\d,]+ px\)"))).to_be_visible()
    expect(page.locator('.oe [data-role="overlap"]')).to_be_attached()
    assert len(ws.store.wounds("leg-01")) == 2  # nothing written before the decision
    page.get_by_text("Wound 1 keeps them").click()
    page.get_by_role("button", name="Save with these choices").click()
    expect(page.get_by_text(re.compile(r"^Saved wound 3 of leg-01"))).to_be_visible()
    after = ws.load_mask("leg-01")
    assert ((after == 1) == (before == 1)).all()  # wound 1 kept every pixel
    square = np.zeros_like(before, dtype=bool)
    square[70:110, 120:170] = True
    assert ((after == 3) == (square & (before != 1))).all()
    assert {w["wound_index"]: w["area"] for w in ws.store.wounds("leg-01")}[3] == int((square & (before != 1)).sum())
