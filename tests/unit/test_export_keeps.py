"""Outline export keeps what came in (issue 50, item 4), on the genuine peer files of tests/fixtures/peers/
(licences in its README): convert → import → export (coco, coco-rle, geojson, labelstudio) → convert back
keeps an outline's holes (area within 0.5 % of shapely's, pixel for pixel), its label and the photo's and
outline's ids in the source file."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from pycocotools import mask as mask_utils
from shapely import affinity
from shapely.geometry import mapping, shape

from annotations.infra.workspace import Workspace
from annotations.io.convert import convert
from annotations.io.dataset import import_dataset
from annotations.io.exports import EXPORTS, export
from annotations.io.readers import DatasetError

PEERS = Path(__file__).resolve().parents[1] / "fixtures" / "peers"
LS_TASKS = PEERS / "labelstudio" / "data_polygons.json"  # task 68501, region djbpw94CXj "Airplane", 640×426
CVAT_XML = PEERS / "cvat" / "annotations.xml"  # <image id="0" name="filename000.jpg">, a "car" polygon, 1600×1200
QUPATH = PEERS / "qupath" / "polygon.geojson"  # a MultiPolygon over 10000×10000, its main part a ring with 26 holes
#: The outline formats of the export registry (dataset and followup write whole folders of tables).
FORMATS = tuple(f for f in EXPORTS if f not in ("dataset", "followup"))
READ_AS = {"coco": "coco", "coco-rle": "coco", "geojson": "geojson", "labelstudio": "labelstudio"}


def _photo(path: Path, size: tuple[int, int]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.zeros((size[1], size[0], 3), np.uint8)).save(path)


def _labels(folder: Path, image_id: str) -> np.ndarray:
    return np.array(Image.open(folder / "masks" / f"{image_id}.png"))


def _imported(ds: Path, root: Path) -> Workspace:
    ws = Workspace(root)
    import_dataset(ws, ds)
    return ws


def _export_and_convert_back(ws: Workspace, fmt: str, tmp_path: Path, images: Path) -> tuple[Path, Path]:
    """Export ``ws`` as ``fmt`` and convert that export back (a Label Studio prediction accepted as is, as
    Label Studio exports it once submitted): the export folder and the converted dataset folder."""
    out = tmp_path / f"export-{fmt}"
    export(ws, out, fmt)
    src = out
    if fmt == "labelstudio":
        tasks = json.loads((out / "tasks.json").read_text())
        for task in tasks:
            task["annotations"] = task.pop("predictions", [])
        src = out / "result.json"
        src.write_text(json.dumps(tasks))
    back = tmp_path / f"back-{fmt}"
    convert(READ_AS[fmt], src, back, images=images)
    return out, back


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def _coco_area(seg: list | dict, h: int, w: int) -> int:
    """A COCO segmentation's pixels as pycocotools decodes it."""
    if isinstance(seg, dict):
        rle = {"size": seg["size"], "counts": seg["counts"].encode("ascii")}
    else:
        rle = mask_utils.merge(mask_utils.frPyObjects(seg, h, w))
    return int(mask_utils.decode(rle).sum())


# ---- holes ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def qupath_ring(tmp_path_factory) -> tuple[Path, object]:
    """QuPath's MultiPolygon scaled by 1/10 onto a 1000×1000 photo (the whole file is 10000×10000 px, more
    than a photo may hold), written as QuPath writes one object (a bare geometry), converted and imported:
    the dataset folder, the workspace and the scaled geometry."""
    root = tmp_path_factory.mktemp("qupath")
    geometry = affinity.scale(shape(json.loads(QUPATH.read_text())), 0.1, 0.1, origin=(0, 0))
    (root / "src").mkdir()
    (root / "src" / "ring.geojson").write_text(json.dumps(mapping(geometry)))
    _photo(root / "src" / "ring.png", (1000, 1000))
    convert("geojson", root / "src", root / "ds")
    return root, geometry


def test_the_qupath_fixture_has_holes_worth_most_of_its_area(qupath_ring):
    _, geometry = qupath_ring
    filled = sum(shape({"type": "Polygon", "coordinates": [list(p.exterior.coords)]}).area for p in geometry.geoms)
    assert filled > 1.5 * geometry.area  # filling the holes would add over 50 % (the main hole: a ring's inside)


@pytest.mark.parametrize("fmt", FORMATS)
def test_an_outline_with_holes_comes_back_pixel_for_pixel(qupath_ring, tmp_path, fmt):
    root, geometry = qupath_ring
    ws = _imported(root / "ds", tmp_path / "ws")
    first = _labels(root / "ds", "ring")
    assert abs(int((first == 1).sum()) - geometry.area) <= 0.005 * geometry.area
    _, back = _export_and_convert_back(ws, fmt, tmp_path, root / "ds" / "images")
    assert (_labels(back, "ring") == first).all()


@pytest.mark.parametrize("fmt", ["coco", "coco-rle"])
def test_coco_export_area_is_shapelys_within_half_a_percent(qupath_ring, tmp_path, fmt):
    """Each annotation's segmentation as pycocotools decodes it: within 0.5 % of the outline's shapely area
    (a polygon export of this outline fills its holes: about 80 % too much)."""
    root, geometry = qupath_ring
    ws = _imported(root / "ds", tmp_path / "ws")
    out = tmp_path / "out"
    export(ws, out, fmt)
    doc = json.loads((out / "annotations.json").read_text())
    (ann,) = doc["annotations"]
    assert ann["iscrowd"] == 0 and isinstance(ann["segmentation"], dict)  # holes: RLE, also in the polygon export
    pixels = _coco_area(ann["segmentation"], 1000, 1000)
    assert pixels == ann["area"] and abs(pixels - geometry.area) <= 0.005 * geometry.area


def test_coco_polygon_export_keeps_polygons_for_outlines_without_holes(tmp_path):
    """CVAT's car polygon has no hole: it stays a polygon, within 0.5 % of shapely's area by pycocotools."""
    (tmp_path / "src").mkdir(parents=True)
    (tmp_path / "src" / "annotations.xml").write_bytes(CVAT_XML.read_bytes())
    _photo(tmp_path / "src" / "filename000.jpg", (1600, 1200))
    convert("cvat", tmp_path / "src", tmp_path / "ds")
    ws = _imported(tmp_path / "ds", tmp_path / "ws")
    export(ws, tmp_path / "out", "coco")
    (ann,) = json.loads((tmp_path / "out" / "annotations.json").read_text())["annotations"]
    assert isinstance(ann["segmentation"], list)
    assert abs(_coco_area(ann["segmentation"], 1200, 1600) - ann["area"]) <= 0.005 * ann["area"]


# ---- labels and ids -------------------------------------------------------------------------------

def _label_studio_source(tmp_path: Path) -> Path:
    (tmp_path / "src").mkdir(parents=True)
    (tmp_path / "src" / "result.json").write_bytes(LS_TASKS.read_bytes())
    _photo(tmp_path / "src" / "image2.jpg", (640, 426))
    convert("labelstudio", tmp_path / "src", tmp_path / "ds")
    return tmp_path / "ds"


def _cvat_source(tmp_path: Path) -> Path:
    (tmp_path / "src").mkdir(parents=True)
    (tmp_path / "src" / "annotations.xml").write_bytes(CVAT_XML.read_bytes())
    _photo(tmp_path / "src" / "filename000.jpg", (1600, 1200))
    convert("cvat", tmp_path / "src", tmp_path / "ds")
    return tmp_path / "ds"


#: (source, image id, its id in the file, the outline's label and its id in the file)
SOURCES = [(_label_studio_source, "image2", 68501, "Airplane", "djbpw94CXj"),
           (_cvat_source, "filename000", 0, "car", None)]


@pytest.mark.parametrize(("source", "image_id", "image_source", "label", "wound_source"), SOURCES,
                         ids=["labelstudio", "cvat"])
def test_convert_and_import_keep_label_and_source_ids(tmp_path, source, image_id, image_source, label, wound_source):
    ws = _imported(source(tmp_path), tmp_path / "ws")
    (img,) = ws.store.images()
    (wound,) = ws.store.wounds()
    assert img["metadata"].get("source_image_id") == image_source
    assert wound["metadata"].get("label") == label and wound["metadata"].get("source_id") == wound_source


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(("source", "image_id", "image_source", "label", "wound_source"), SOURCES,
                         ids=["labelstudio", "cvat"])
def test_export_writes_label_and_ids_and_converts_back_with_them(tmp_path, fmt, source, image_id, image_source,
                                                                 label, wound_source):
    ds = source(tmp_path)
    ws = _imported(ds, tmp_path / "ws")
    out, back = _export_and_convert_back(ws, fmt, tmp_path, ds / "images")
    if fmt.startswith("coco"):
        doc = json.loads((out / "annotations.json").read_text())
        (img,), (ann,) = doc["images"], doc["annotations"]
        assert img["id"] == image_source  # a whole number: the COCO id itself
        assert doc["categories"] == [{"id": ann["category_id"], "name": label, "supercategory": "wound"}]
        assert ann.get("attributes", {}).get("source_id") == wound_source  # text: fresh COCO ids, the original kept
    elif fmt == "geojson":
        (feature,) = json.loads((out / f"{image_id}.geojson").read_text())["features"]
        assert feature["properties"]["classification"]["name"] == label
        assert feature.get("id") == wound_source and feature["properties"]["source_image_id"] == image_source
    else:
        (task,) = json.loads((out / "tasks.json").read_text())
        (region,) = task["predictions"][0]["result"]
        assert region["value"][region["type"]] == [label] and task["data"]["source_image_id"] == image_source
        assert region.get("meta", {}).get("source_id") == wound_source
        assert label in (out / "label_config.xml").read_text()
    (row,) = _rows(back / "wounds.csv")
    assert row["label"] == label and row.get("source_id", "") == (wound_source or "")
    (image_row,) = _rows(back / "images.csv")
    assert image_row["source_image_id"] == str(image_source)
    again = _imported(back, tmp_path / "ws-again")
    assert [w["metadata"] for w in again.store.wounds()] == [w["metadata"] for w in ws.store.wounds()]
    assert [i["metadata"] for i in again.store.images()] == [i["metadata"] for i in ws.store.images()]
    assert (_labels(back, image_id) == _labels(ds, image_id)).all()


def test_coco_ids_kept_when_whole_and_unique_else_fresh_with_the_originals(tmp_path):
    """The photos' own ids (CVAT's image 0 and Label Studio's task 68501, in one workspace) are the COCO ids written
    back; an id that is text cannot be a COCO id and goes under ``attributes.source_id``."""
    ws = _imported(_cvat_source(tmp_path / "a"), tmp_path / "ws")
    import_dataset(ws, _label_studio_source(tmp_path / "b"))
    export(ws, tmp_path / "out", "coco")
    doc = json.loads((tmp_path / "out" / "annotations.json").read_text())
    assert {i["triderm_image_id"]: (i["id"], i["attributes"]["source_id"]) for i in doc["images"]} == {
        "filename000": (0, 0), "image2": (68501, 68501)}
    assert sorted(a["id"] for a in doc["annotations"]) == [1, 2]
    assert {c["name"] for c in doc["categories"]} == {"car", "Airplane"}
    by_image = {a["triderm_image_id"]: a for a in doc["annotations"]}
    assert by_image["image2"]["attributes"] == {"source_id": "djbpw94CXj"} and "attributes" not in by_image["filename000"]
    names = {c["id"]: c["name"] for c in doc["categories"]}
    assert (names[by_image["image2"]["category_id"]], names[by_image["filename000"]["category_id"]]) == ("Airplane", "car")


@pytest.mark.parametrize(("where", "bad", "field"), [("region", "two\nlines", r"\[0\]\.annotations\[0\]\.result\[0\]\.id"),
                                                     ("task", [68501], r"\[0\]\.id")])
def test_a_source_id_that_is_no_id_is_one_error_and_writes_nothing(tmp_path, where, bad, field):
    tasks = json.loads(LS_TASKS.read_text())
    if where == "region":
        tasks[0]["annotations"][0]["result"][0]["id"] = bad
    else:
        tasks[0]["id"] = bad
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "result.json").write_text(json.dumps(tasks))
    _photo(tmp_path / "src" / "image2.jpg", (640, 426))
    with pytest.raises(DatasetError, match=rf"result\.json: {field}: .* is not an id"):
        convert("labelstudio", tmp_path / "src", tmp_path / "ds")
    assert not (tmp_path / "ds").exists()
