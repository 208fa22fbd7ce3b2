"""annotations.io.convert on genuine files of Label Studio, CVAT and QuPath (tests/fixtures/peers/, see its
README): photo references, overlapping outlines, COCO crowd regions, wounds under the minimum area, bare
GeoJSON geometries, and one rasterisation rule that keeps a polygon's area (issue 50)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import shapely
from PIL import Image
from shapely.geometry import MultiPolygon, Polygon, box, shape

from annotations.__main__ import main as annotations_main
from annotations.infra.workspace import DEFAULT_MIN_WOUND_AREA, Workspace
from annotations.io.convert import convert
from annotations.io.dataset import import_dataset
from annotations.io.formats import polygons, rasterize
from annotations.io.readers import DatasetError

PEERS = Path(__file__).resolve().parents[1] / "fixtures" / "peers"
LS_TASKS = PEERS / "labelstudio" / "data_polygons.json"  # label-studio-converter: a 640×426 photo, one polygon
CVAT_XML = PEERS / "cvat" / "annotations.xml"  # CVAT's documentation example: filename000.jpg, 1600×1200
QUPATH = PEERS / "qupath" / "polygon.geojson"  # QuPath's test data: a bare MultiPolygon


def _photo(path: Path, size: tuple[int, int]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.zeros((size[1], size[0], 3), np.uint8)).save(path)


def _labels(folder: Path, image_id: str) -> np.ndarray:
    return np.array(Image.open(folder / "masks" / f"{image_id}.png"))


def _cvat_polygon(text: str) -> Polygon:
    points = re.search(r'<polygon label="car" points="([^"]+)"', text)
    assert points is not None
    return Polygon([tuple(map(float, p.split(","))) for p in points.group(1).split(";")])


def _ls_polygon() -> Polygon:
    res = json.loads(LS_TASKS.read_text())[0]["annotations"][0]["result"][0]
    return Polygon([(x * res["original_width"] / 100, y * res["original_height"] / 100)
                    for x, y in res["value"]["points"]])


# ---- 1. Label Studio image references ----------------------------------------------------------

@pytest.mark.parametrize("url", ["/data/local-files/?d=dataset%2Fplane%20one.jpg",  # what LS's COCO importer writes
                                 "/data/local-files/?d=plane%20one.jpg",
                                 "/data/upload/12/1a2b3c4d-plane%20one.jpg",
                                 "s3://bucket/dataset/plane%20one.jpg",
                                 "gs://bucket/plane%20one.jpg",
                                 "https://example.org/photos/plane%20one.jpg?token=abc"])
def test_label_studio_photo_from_local_files_upload_and_cloud_urls(tmp_path, url):
    tasks = json.loads(LS_TASKS.read_text())
    tasks[0]["data"]["image"] = url
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "result.json").write_text(json.dumps(tasks))
    _photo(tmp_path / "src" / "images" / "plane one.jpg", (640, 426))
    summary = convert("labelstudio", tmp_path / "src", tmp_path / "ds")
    assert (summary["images"], summary["wounds"]) == (1, 1)
    assert (tmp_path / "ds" / "images" / "plane_one.jpg").is_file()


def test_label_studio_reference_without_a_file_name_names_the_field(tmp_path):
    tasks = json.loads(LS_TASKS.read_text())
    tasks[0]["data"]["image"] = "/data/local-files/?d="
    (tmp_path / "t.json").write_text(json.dumps(tasks))
    with pytest.raises(DatasetError, match=r"t\.json: \[0\]\.data: no file name in the image reference"):
        convert("labelstudio", tmp_path / "t.json", tmp_path / "ds")
    assert not (tmp_path / "ds").exists()


def test_label_studio_converter_fixture_keeps_the_polygon_area(tmp_path):
    """The genuine export (photo reference ``/image2``) converts; the wound's pixels are its polygon's area."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "result.json").write_bytes(LS_TASKS.read_bytes())
    _photo(tmp_path / "src" / "image2.jpg", (640, 426))
    summary = convert("labelstudio", tmp_path / "src", tmp_path / "ds")
    assert (summary["images"], summary["wounds"]) == (1, 1)
    area = (_labels(tmp_path / "ds", "image2") == 1).sum()
    assert abs(area - _ls_polygon().area) <= 0.005 * _ls_polygon().area


# ---- 2. overlapping outlines: --overlap z-order | later-wins | refuse; COCO crowd regions --------

def _cvat_with_a_wound_below_in_file_order_above_in_z(tmp_path: Path) -> Path:
    """CVAT's documentation example with a square drawn first in the file but with a higher z_order."""
    text = CVAT_XML.read_text()
    square = ('<polygon label="wound" points="1100.00,500.00;1400.00,500.00;1400.00,700.00;1100.00,700.00" '
              'occluded="0" z_order="2">\n    </polygon>\n    ')
    text = text.replace('<polygon label="car"', square + '<polygon label="car"', 1)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "annotations.xml").write_text(text)
    _photo(tmp_path / "src" / "filename000.jpg", (1600, 1200))
    return tmp_path / "src" / "annotations.xml"


def test_cvat_documentation_example_converts_with_its_polygon_area(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "annotations.xml").write_bytes(CVAT_XML.read_bytes())
    _photo(tmp_path / "src" / "filename000.jpg", (1600, 1200))
    summary = convert("cvat", tmp_path / "src", tmp_path / "ds")
    assert (summary["wounds"], summary["other_shapes_skipped"], summary["overlap"]) == (1, 4, "z-order")
    car = _cvat_polygon(CVAT_XML.read_text())
    assert abs((_labels(tmp_path / "ds", "filename000") == 1).sum() - car.area) <= 0.005 * car.area


@pytest.mark.parametrize(("rule", "square_keeps"), [(None, True), ("z-order", True), ("later-wins", False)])
def test_cvat_overlap_follows_z_order_by_default(tmp_path, rule, square_keeps):
    xml = _cvat_with_a_wound_below_in_file_order_above_in_z(tmp_path)
    summary = convert("cvat", xml, tmp_path / "ds", overlap=rule)
    labels = _labels(tmp_path / "ds", "filename000")
    square = np.zeros_like(labels, bool)
    square[500:700, 1100:1400] = True
    assert summary["wounds"] == 2 and summary["overlapping_px"] > 0
    assert (labels[square] == 1).all() == square_keeps  # wound 1 is the square (first in the file)
    car = rasterize(_cvat_polygon(xml.read_text()), labels.shape)
    assert ((labels == 2) == (car & ~square if square_keeps else car)).all()


def test_overlap_refuse_names_both_outlines_and_writes_nothing(tmp_path):
    xml = _cvat_with_a_wound_below_in_file_order_above_in_z(tmp_path)
    with pytest.raises(DatasetError, match=r"annotations\.xml: <image> 1 <polygon> 3: overlaps annotations\.xml: "
                                           r"<image> 1 <polygon> 2 by \d+ px"):
        convert("cvat", xml, tmp_path / "ds", overlap="refuse")
    assert not (tmp_path / "ds").exists()


def _coco(tmp_path: Path, annotations: list[dict]) -> Path:
    _photo(tmp_path / "src" / "p1.png", (40, 30))
    doc = {"images": [{"id": 1, "file_name": "p1.png", "width": 40, "height": 30}],
           "categories": [{"id": 1, "name": "wound"}],
           "annotations": [{"id": n, "image_id": 1, "category_id": 1, **a} for n, a in enumerate(annotations, 1)]}
    (tmp_path / "src" / "annotations.json").write_text(json.dumps(doc))
    return tmp_path / "src"


def test_coco_overlap_later_wins_by_default(tmp_path, capsys):
    src = _coco(tmp_path, [{"segmentation": [[0, 0, 20, 0, 20, 20, 0, 20]]},
                           {"segmentation": [[10, 10, 30, 10, 30, 30, 10, 30]]}])
    assert annotations_main(["convert", "--from", "coco", str(src), str(tmp_path / "ds"), "--overlap", "refuse"]) == 2
    assert "annotations[1].segmentation: overlaps" in capsys.readouterr().err and not (tmp_path / "ds").exists()
    summary = convert("coco", src, tmp_path / "ds")
    labels = _labels(tmp_path / "ds", "p1")
    assert (summary["wounds"], summary["overlap"], summary["overlapping_px"]) == (2, "later-wins", 100)
    assert (labels == 1).sum() == 300 and (labels[10:30, 10:30] == 2).all()


def test_coco_crowd_region_is_ignored_not_a_wound(tmp_path):
    """iscrowd 1 (an uncompressed RLE over columns 0–9, as COCO writes crowds) is no wound and paints nothing."""
    crowd = {"size": [30, 40], "counts": [0, 30 * 10, 30 * 30]}
    src = _coco(tmp_path, [{"segmentation": [[5, 5, 25, 5, 25, 25, 5, 25]], "iscrowd": 0},
                           {"segmentation": crowd, "iscrowd": 1}])
    summary = convert("coco", src, tmp_path / "ds")
    assert (summary["wounds"], summary["crowd_regions_ignored"], summary["overlapping_px"]) == (1, 1, 0)
    labels = _labels(tmp_path / "ds", "p1")
    assert (labels[5:25, 5:25] == 1).all() and (labels == 1).sum() == 400  # the crowd's pixels: skin or the wound
    assert (tmp_path / "ds" / "wounds.csv").read_text().splitlines() == ["image_id,wound_index,description,source_id",
                                                                         "p1,1,,1"]  # the COCO annotation id kept


# ---- 3. wounds under the minimum wound area: dropped by convert, so import accepts the folder ----

def test_wounds_under_the_minimum_area_are_dropped_and_the_folder_imports(tmp_path):
    side = int(np.sqrt(DEFAULT_MIN_WOUND_AREA)) - 1  # a square of fewer pixels than the minimum
    src = _coco(tmp_path, [{"segmentation": [[0, 0, side, 0, side, side, 0, side]], "description": "speck"},
                           {"segmentation": [[10, 10, 30, 10, 30, 30, 10, 30]], "description": "ulcer"}])
    summary = convert("coco", src, tmp_path / "ds")
    assert summary["wounds"] == 1
    assert summary["small_wounds_dropped"] == [
        f"annotations.json: annotations[0].segmentation: {side * side} px, under the minimum wound area of "
        f"{DEFAULT_MIN_WOUND_AREA} px; dropped"]
    ws = Workspace(tmp_path / "ws")
    import_dataset(ws, tmp_path / "ds")
    assert [(w["wound_index"], w["description"]) for w in ws.store.wounds()] == [(1, "ulcer")]


def test_a_wound_covered_by_later_ones_below_the_minimum_is_dropped_with_the_reason(tmp_path):
    src = _coco(tmp_path, [{"segmentation": [[0, 0, 12, 0, 12, 12, 0, 12]]},
                           {"segmentation": [[2, 0, 30, 0, 30, 30, 0, 30, 0, 2, 2, 2]]}])
    summary = convert("coco", src, tmp_path / "ds")
    assert summary["wounds"] == 1 and summary["small_wounds_dropped"] == [
        "annotations.json: annotations[0].segmentation: 4 px (140 px covered by outlines drawn over it), under the minimum "
        f"wound area of {DEFAULT_MIN_WOUND_AREA} px; dropped"]


# ---- 4. bare GeoJSON geometries and features -----------------------------------------------------

def test_qupath_bare_multipolygon_converts_with_its_area(tmp_path):
    """QuPath's own test file is a bare MultiPolygon; on a 1000×1000 photo (the outline is clipped to it)
    the wound's pixels are the clipped polygon's area."""
    _photo(tmp_path / "photos" / "polygon.png", (1000, 1000))
    summary = convert("geojson", QUPATH, tmp_path / "ds", images=tmp_path / "photos")
    assert (summary["images"], summary["wounds"]) == (1, 1)
    clipped = shape(json.loads(QUPATH.read_text())).intersection(box(0, 0, 1000, 1000))
    assert abs((_labels(tmp_path / "ds", "polygon") == 1).sum() - clipped.area) <= 0.005 * clipped.area


def test_bare_feature_is_a_collection_of_one(tmp_path):
    feature = {"type": "Feature", "properties": {"classification": {"name": "wound"}},
               "geometry": {"type": "Polygon", "coordinates": [[[2, 2], [22, 2], [22, 12], [2, 12], [2, 2]]]}}
    (tmp_path / "p1.geojson").write_text(json.dumps(feature))
    _photo(tmp_path / "p1.png", (40, 30))
    assert convert("geojson", tmp_path / "p1.geojson", tmp_path / "ds")["wounds"] == 1
    assert (_labels(tmp_path / "ds", "p1") == 1).sum() == 200


# ---- 5. one rasterisation rule: areas kept, shared edges tile -----------------------------------

def _fixture_polygons() -> list[Polygon]:
    """The peers' polygons (pixels) as given, and with their vertices rounded to whole pixels."""
    qupath = shape(json.loads(QUPATH.read_text()))
    given = [_cvat_polygon(CVAT_XML.read_text()), _ls_polygon(), *polygons(qupath.intersection(box(0, 0, 1000, 1000)))]
    rounded = [shapely.make_valid(Polygon(np.round(np.asarray(p.exterior.coords)))) for p in given]
    rounded = [g for r in rounded for g in getattr(r, "geoms", [r]) if isinstance(g, (Polygon, MultiPolygon))]
    diamond = Polygon([(60, 0), (120, 60), (60, 120), (0, 60)])  # every edge passes through pixel centres
    return [*given, *rounded, diamond]


def test_rasterised_area_is_the_polygon_area():
    """Within 0.5 % of shapely's area for each polygon of at least 100 px."""
    large = [p for p in _fixture_polygons() if p.area >= 100]
    assert len(large) >= 6
    off = {}
    for n, poly in enumerate(large):
        x1, y1 = poly.bounds[2:]
        pixels = int(rasterize(poly, (int(y1) + 2, int(x1) + 2)).sum())
        if abs(pixels - poly.area) > 0.005 * poly.area:
            off[n] = (pixels, poly.area)
    assert off == {}


def test_outlines_sharing_an_edge_tile_without_gap_or_overlap(tmp_path):
    """Two triangles splitting a square along its diagonal (which runs through pixel centres)."""
    first, second = (rasterize(Polygon(p), (30, 40)) for p in ([(0, 0), (20, 0), (0, 20)], [(20, 0), (20, 20), (0, 20)]))
    assert not (first & second).any() and (first | second)[:20, :20].all()
    src = _coco(tmp_path, [{"segmentation": [[0, 0, 20, 0, 0, 20]]}, {"segmentation": [[20, 0, 20, 20, 0, 20]]}])
    summary = convert("coco", src, tmp_path / "ds", overlap="refuse")
    labels = _labels(tmp_path / "ds", "p1")
    assert summary["wounds"] == 2 and (labels[:20, :20] > 0).all() and (labels > 0).sum() == 400
    assert abs(int((labels == 1).sum()) - int((labels == 2).sum())) <= 20


def test_the_outline_editor_and_convert_share_the_rule_and_bands_change_nothing(monkeypatch):
    """session.rasterise_outlines (the editor) gives formats.rasterize's pixels; rows taken in small bands
    (RASTER_CHUNK) give the same mask as in one."""
    from annotations.accounts import session
    from annotations.io import formats

    diamond = [(60.0, 0.0), (120.0, 60.0), (60.0, 120.0), (0.0, 60.0)]
    assert (session.rasterise_outlines([diamond], (130, 130)) == rasterize(Polygon(diamond), (130, 130))).all()
    qupath = shape(json.loads(QUPATH.read_text()))
    whole = rasterize(qupath, (400, 300))
    monkeypatch.setattr(formats, "RASTER_CHUNK", 37)
    assert (rasterize(qupath, (400, 300)) == whole).all() and whole.sum() > 10_000
