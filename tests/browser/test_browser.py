"""The app in Debian Chromium through Playwright, against a live ``streamlit run app.py``."""
from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect
from streamlit_page import idle

from annotations.infra.workspace import Workspace

pytestmark = [pytest.mark.browser, pytest.mark.slow]
expect.set_options(timeout=60_000)


def go(pg, page_name: str) -> None:
    pg.get_by_role("link", name=page_name).click()
    expect(pg.get_by_role("heading", name=page_name)).to_be_visible()
    idle(pg)


def test_triplets_click_keyboard_undo(app_server, page, screenshot, add_account, sign_in):
    name = add_account(app_server.workspace, "Dr Browser")
    sign_in(page, app_server.url, name)
    go(page, "Triplet judgments")
    progress = page.get_by_text(re.compile(rf"^{name}: \d+ of"))

    def expect_count(n: int) -> None:
        expect(progress).to_contain_text(f"{name}: {n} of")
        idle(page)

    expect_count(0)
    for n, label in enumerate(["More like left", "More like right", "Skip"], start=1):
        page.get_by_role("button", name=re.compile(label)).click()
        expect_count(n)
    page.keyboard.press("ArrowLeft")
    expect_count(4)
    page.keyboard.press("ArrowRight")
    expect_count(5)
    page.get_by_role("button", name=re.compile("Undo last")).click()
    expect_count(4)
    screenshot(page, "triplets")

    ws = Workspace(app_server.workspace)
    rows = ws.store.triplets(source=f"expert:{name}")
    assert len(rows) == 4
    assert sorted(r["choice"] for r in rows) == ["j", "j", "k", "skip"]  # the undone "→" (k) is gone
    assert all(r["latency_ms"] is not None and r["latency_ms"] > 0 for r in rows)


def test_draw_polygon_wound_and_describe(app_server, page, screenshot, add_account, sign_in):
    sign_in(page, app_server.url, add_account(app_server.workspace, "Dr Outline"))
    go(page, "Wound masks")
    ws = Workspace(app_server.workspace)
    photo = ws.store.images()[0]["image_id"]
    before = {w["wound_index"] for w in ws.store.wounds(photo)}
    svg = page.locator(".oe svg")  # the outline editor (components/outline_editor)
    expect(svg.locator("image")).to_be_attached()
    idle(page)
    # an empty corner of the photo, away from the phantom's wounds
    pts = [(0.80, 0.78), (0.95, 0.78), (0.95, 0.95), (0.80, 0.95)]
    free = ws.load_mask(photo)
    h, w = free.shape
    assert all(free[int(y * (h - 1)), int(x * (w - 1))] == 0 for x, y in pts)
    page.locator(".oe .bar button", has_text="Draw new").click()
    svg.scroll_into_view_if_needed()
    for x, y in pts + [pts[0]]:  # clicking the first vertex again closes the polygon
        page.mouse.click(*svg.evaluate(
            "(svg, [x, y]) => { const p = svg.createSVGPoint(); p.x = x; p.y = y;"
            " const q = p.matrixTransform(svg.getScreenCTM()); return [q.x, q.y]; }", [x * w, y * h]))
    page.locator(".oe .bar button", has_text="Save outline").click()
    new_index = max(before, default=0) + 1
    # the wound list (not the one-shot "Saved wound" flash, which a second rerun may clear)
    expect(page.get_by_text(re.compile(rf"^Wound {new_index} · [\d,]+ px"))).to_be_visible()
    description = "Test wound: fibrin-covered base, hyperkeratotic border."
    area = page.get_by_role("textbox", name="Description").nth(len(before))
    area.fill(description)
    page.get_by_role("heading", name="Wound masks").click()  # leaving the field saves it
    n = len(before) + 1  # a rerun may show the stale count beside the new one for a moment: wait for the new one
    expect(page.get_by_text(f"{n} of {n} wounds described")).to_be_visible()
    screenshot(page, "wound_masks")

    wound = next(w for w in ws.store.wounds(photo) if w["wound_index"] == new_index)
    assert wound["description"] == description
    x0, y0, x1, y1 = wound["bbox"]
    assert 0.75 * w < x0 < 0.85 * w and x1 > 0.9 * w and 0.73 * h < y0 < 0.83 * h and y1 > 0.9 * h
    assert wound["area"] == int((ws.load_mask(photo) == new_index).sum()) > 0.01 * w * h


def test_explorer_umap_and_retrieval(app_server, page, screenshot, add_account, sign_in):
    sign_in(page, app_server.url, add_account(app_server.workspace, "Dr Explore", "researcher"))
    go(page, "Explore")
    expect(page.locator('[data-testid="stVegaLiteChart"] .marks').first).to_be_visible(timeout=240_000)
    expect(page.get_by_text(re.compile(r"(UMAP|Classical MDS \(UMAP being computed\)) of run \d+"))).to_be_visible()
    expect(page.get_by_text("Most similar")).to_be_visible()
    expect(page.get_by_text("Most dissimilar")).to_be_visible()
    expect(page.get_by_text(re.compile(r"· d = 0\.\d\d")).first).to_be_visible()
    screenshot(page, "explore")
    # a click on a point of the map shows that photo (Vega's SVG names each point's tooltip fields in its aria-label)
    point = page.locator('[data-testid="stVegaLiteChart"] .mark-symbol path').nth(7)
    label = re.search(r"point: ([^;]+)", point.get_attribute("aria-label") or "").group(1)
    assert label != page.get_by_test_id("stSelectbox").filter(has_text="Photo").locator("input").input_value()
    point.click(force=True)
    expect(page.get_by_text(re.compile(rf"^{re.escape(label)} · patient"))).to_be_visible()


def test_report_page(app_server, page, screenshot, add_account, sign_in):
    sign_in(page, app_server.url, add_account(app_server.workspace, "Dr Report", "viewer"))
    go(page, "Report")
    expect(page.get_by_text("Agreement with the expert's triplets")).to_be_visible()
    expect(page.get_by_role("button", name="Download report.csv")).to_be_visible()
    expect(page.get_by_test_id("stDataFrame").first).to_be_visible()
    expect(page.locator(".js-plotly-plot").first).to_contain_text("balanced agreement")
    # a supervised run shows its stored strict out-of-fold figure (TEST-ONLY numbers), never its in-sample one
    chart = page.locator(".js-plotly-plot").first
    expect(chart).to_contain_text("strict out of fold")
    chart.scroll_into_view_if_needed()
    screenshot(page, "report")
    # the committed real-data benchmark (results/real_vision.json), collapsed below this workspace's sections:
    # strict, anchor-unseen and cross-half rows, each cell one estimate over the pooled seeds with its patient CI
    page.get_by_text("Real wounds: the repository's vision benchmark").click()
    heading = page.get_by_text("Real wounds: vision benchmark")
    heading.scroll_into_view_if_needed()
    expect(page.get_by_text("Cross-half transfer").first).to_be_visible()
    expect(page.get_by_text("(1 seed)")).to_have_count(0)
    screenshot(page, "report_real_vision")
