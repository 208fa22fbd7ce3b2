"""Outline editor geometry (annotations.accounts.session): polygons derived from the label map, rasterised
back, invalid outlines, the minimum wound area and overlap decisions."""
from __future__ import annotations

import numpy as np
import pytest
from PIL import Image, ImageDraw

from annotations.accounts import session
from annotations.infra.workspace import Workspace
from annotations.io.dataset import import_dataset


@pytest.fixture
def ws(tmp_path) -> Workspace:
    """One 120×100 photo with wound 1 (a 40×30 box at x 10–49, y 10–39)."""
    data = tmp_path / "data"
    (data / "images").mkdir(parents=True)
    (data / "masks").mkdir()
    Image.new("RGB", (120, 100), (210, 170, 150)).save(data / "images" / "p1.png")
    labels = np.zeros((100, 120), np.uint8)
    labels[10:40, 10:50] = 1
    Image.fromarray(labels).save(data / "masks" / "p1.png")
    (data / "wounds.csv").write_text("image_id,wound_index,description\np1,1,\n")
    out = Workspace(tmp_path / "ws")
    import_dataset(out, data)
    out.store.set_meta("min_wound_area", 50)
    return out


def test_polygons_round_trip_the_label_map():
    mask = Image.new("L", (320, 240), 0)
    ImageDraw.Draw(mask).ellipse([60, 60, 140, 130], fill=1)
    ImageDraw.Draw(mask).rectangle([200, 20, 200, 20], fill=1)  # a one-pixel wound
    mask = np.asarray(mask, bool)
    polys = session.mask_polygons(mask)
    assert len(polys) == 2 and all(len(p) >= 3 for p in polys)
    back = session.rasterise_outlines(polys, mask.shape)
    assert (back & mask).sum() / (back | mask).sum() > 0.98
    assert back[20, 200] and back[20:21, 199:202].sum() == 1
    labels = np.zeros((50, 50), np.int32)
    labels[5:10, 5:10], labels[20:30, 20:40] = 1, 3
    assert sorted(session.label_polygons(labels)) == [1, 3]


def test_fill_counts_pixel_centres():
    square = [(40, 40), (90, 40), (90, 80), (40, 80)]
    region = session.rasterise_outlines([square], (100, 120))
    ys, xs = np.nonzero(region)
    assert region.sum() == 50 * 40 and (xs.min(), xs.max(), ys.min(), ys.max()) == (40, 89, 40, 79)
    jittered = [(39.8, 40.3), (90.2, 40.0), (90.0, 79.7), (40.0, 80.4)]  # a click a fraction off
    assert (session.rasterise_outlines([jittered], (100, 120)) == region).all()


@pytest.mark.parametrize("outline, message", [
    ([(1, 1), (5, 5)], "at least 3 vertices; this one has 2"),
    ([(0, 0), (10, 10), (10, 0), (0, 10)], "crosses itself"),
    ([(0, 0), (5, 5), (10, 10)], "encloses no area"),
])
def test_invalid_outlines_are_refused(outline, message):
    assert message in session.outline_problem(outline)
    with pytest.raises(ValueError, match=message):
        session.rasterise_outlines([outline], (20, 20))


def test_minimum_area_refused_before_writing(ws):
    tiny = session.rasterise_outlines([[(70, 70), (76, 70), (76, 76), (70, 76)]], (100, 120))  # 36 px
    with pytest.raises(ValueError, match="minimum wound area of 50 px"):
        session.plan_outline(ws, "p1", tiny)
    assert len(ws.store.wounds("p1")) == 1


def box(x0: int, y0: int, x1: int, y1: int) -> np.ndarray:
    return session.rasterise_outlines([[(x0, y0), (x1, y0), (x1, y1), (x0, y1)]], (100, 120))


def test_overlap_needs_a_decision_and_follows_it(ws):
    before = ws.load_mask("p1").copy()
    plan = session.plan_outline(ws, "p1", box(40, 20, 70, 50))
    assert plan.overlaps == {1: 10 * 20} and session.overlap_mask(ws, plan).sum() == 200
    with pytest.raises(ValueError, match="Decide which wound keeps the overlap with wound\\(s\\) 1"):
        session.apply_outline(ws, plan, {}, actor="Dr T")
    assert (ws.load_mask("p1") == before).all() and len(ws.store.wounds("p1")) == 1

    index = session.apply_outline(ws, plan, {1: False}, actor="Dr T")  # wound 1 keeps the shared pixels
    labels = ws.load_mask("p1")
    assert ((labels == 1) == (before == 1)).all()
    assert ((labels == index) == (box(40, 20, 70, 50) & (before != 1))).all()

    plan = session.plan_outline(ws, "p1", box(0, 0, 20, 20), wound_index=index, origin="drawn")
    assert plan.overlaps == {1: 100}
    session.apply_outline(ws, plan, {1: True}, actor="Dr T")  # the redrawn wound takes them
    labels = ws.load_mask("p1")
    assert ((labels == index) == box(0, 0, 20, 20)).all() and not (labels == 1)[0:20, 0:20].any()
    wounds = {w["wound_index"]: w for w in ws.store.wounds("p1")}
    assert wounds[1]["area"] == int((labels == 1).sum()) == 1200 - 100
    assert session.wound_origin(wounds[index]) == "drawn"
    assert session.wound_origin(wounds[1]) == session.edit_origin(None)  # imported without an origin


def test_overlap_decision_never_leaves_a_wound_below_the_minimum(ws):
    plan = session.plan_outline(ws, "p1", box(5, 5, 60, 45))  # covers all of wound 1
    with pytest.raises(ValueError, match="Wound 1 would be left with 0 px"):
        session.apply_outline(ws, plan, {1: True}, actor="Dr T")
    assert len(ws.store.wounds("p1")) == 1


def test_edit_origin():
    assert session.edit_origin(None) == session.edit_origin("drawn") == "drawn"
    assert session.edit_origin("suggested") == session.edit_origin("import") == "edited"
