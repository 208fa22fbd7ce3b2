"""The pages a clinician and a researcher use, on a 1366×768 laptop screen, in Chromium: the outline
editor's toolbar on one row and the whole photo above the fold, its message beside the action, Explore's attention map, the Report (screenshots for the docs)."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from playwright.sync_api import expect
from streamlit_page import idle

from annotations.infra.workspace import Workspace

expect.set_options(timeout=120_000)
pytestmark = [pytest.mark.browser, pytest.mark.slow]
LAPTOP = {"width": 1366, "height": 768}


def toolbar_rows(pg) -> int:
    """How many rows the outline editor's toolbar takes (its items' vertical centres, 6-px tolerance)."""
    centres = sorted(box["y"] + box["height"] / 2 for box in
                     (item.bounding_box() for item in pg.locator(".oe .bar > *").all()) if box)
    return 1 + sum(b - a > 6 for a, b in itertools.pairwise(centres))


def add_attention_run(root) -> int:
    """A TEST-ONLY vision run with random embeddings and one attention token per wound (clearly labelled)."""
    from core.runtime import save_embeddings

    ws = Workspace(root)
    ids = [im["image_id"] for im in ws.store.images()]
    keys = [(w["image_id"], w["wound_index"]) for w in ws.store.wounds()]
    rng = np.random.default_rng(2)
    run_id = ws.store.start_run("vision-triderm", {"modality": "vision", "test_only": True},
                                name="TEST-ONLY attention")
    wound_emb = rng.normal(size=(len(keys), 6))
    image_emb = np.stack([wound_emb[[n for n, k in enumerate(keys) if k[0] == i]].mean(0) for i in ids])
    tokens = np.repeat(np.arange(len(keys)), 4)
    pos = np.tile([[1, 1], [1, 2], [2, 1], [2, 2]], (len(keys), 1))
    save_embeddings(ws, run_id, ids, image_emb=image_emb, wound_keys=keys, wound_emb=wound_emb,
                    token_wound=tokens, token_pos=pos, token_weight=rng.random(len(tokens)).astype(np.float32),
                    grid=np.array([4, 4]))
    ws.store.finish_run(run_id)
    ws.store.close()
    return run_id


def test_laptop_screens_editor_message_attention_map_and_report(app_server, chromium, add_account, sign_in,
                                                                screenshot):
    name = add_account(app_server.workspace, "Dr Laptop", "admin")
    context = chromium.new_context(viewport=LAPTOP)
    pg = context.new_page()
    sign_in(pg, app_server.url, name)
    pg.get_by_role("link", name="Wound masks").click()
    expect(pg.locator(".oe svg image")).to_be_attached()
    idle(pg)
    assert toolbar_rows(pg) == 1
    photo = pg.locator(".oe svg image").bounding_box()  # fitted into the stage: the whole photo in view
    assert photo["y"] >= 0 and photo["y"] + photo["height"] <= LAPTOP["height"], photo
    screenshot(pg, "editor_1366x768")
    pg.get_by_role("button", name="Suggest outlines").click()
    message = pg.get_by_text("the default wound model").first  # suggestions or "found no new wound": in view
    expect(message).to_be_visible()
    box = message.bounding_box()
    assert box["y"] >= 0 and box["y"] + box["height"] <= LAPTOP["height"], box  # beside the action, in view
    screenshot(pg, "editor_message_1366x768")

    run_id = add_attention_run(app_server.workspace)
    pg.get_by_test_id("stExpandSidebarButton").click()  # the editor keeps the sidebar collapsed (screen width)
    pg.get_by_role("link", name="Explore").click()
    expect(pg.get_by_role("heading", name="Token maps")).to_be_visible()
    idle(pg)
    expect(pg.get_by_text(f"run {run_id}").first).to_be_visible()
    umap = pg.locator('[data-testid="stVegaLiteChart"]').first
    expect(umap).to_be_visible()
    box = umap.bounding_box()
    assert box["y"] >= 0 and box["y"] + box["height"] <= LAPTOP["height"], box  # the whole map above the fold
    expect(pg.get_by_text("Overlay opacity")).to_be_visible()
    maps = pg.get_by_test_id("stImage").filter(has_text="(the photo)")
    expect(maps.first).to_be_visible()
    maps.first.scroll_into_view_if_needed()
    maps.first.locator("img").evaluate("img => img.decode()")  # its box has its final size once decoded
    assert maps.first.locator("img").bounding_box()["width"] >= 160  # a tile large enough to read (issue 54)
    screenshot(pg, "explore_attention_1366x768")
    pg.get_by_role("button", name="Enlarge").first.click()  # click to enlarge: the map in a dialog
    big = pg.get_by_role("dialog").get_by_test_id("stImage").locator("img")
    expect(big).to_be_visible()
    big.evaluate("img => img.decode()")
    assert big.bounding_box()["width"] >= 500
    pg.keyboard.press("Escape")

    pg.get_by_role("link", name="Report").click()
    expect(pg.get_by_role("heading", name="Agreement with the expert's triplets")).to_be_visible()
    idle(pg)
    screenshot(pg, "report_1366x768")
    context.close()
