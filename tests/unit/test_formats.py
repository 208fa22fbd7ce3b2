"""annotations.io.formats: COCO (polygons, RLE) and GeoJSON exports rasterise back to the label maps."""
from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image
from pycocotools import mask as mask_utils
from shapely.geometry import shape

from annotations.__main__ import main as annotations_main
from annotations.infra.workspace import Workspace
from annotations.io.dataset import import_dataset
from annotations.io.formats import coco_polygons, mask_geometry, rasterize, rle_encode


def _dice(a: np.ndarray, b: np.ndarray) -> float:
    return float(2 * (a & b).sum() / (a.sum() + b.sum()))


def _labels() -> np.ndarray:
    """Three wounds: a disc with a hole, an L-shape, and two pixels touching at a corner."""
    labels = np.zeros((60, 80), np.uint8)
    yy, xx = np.mgrid[:60, :80]
    labels[((xx - 20) ** 2 + (yy - 20) ** 2 <= 144) & ((xx - 20) ** 2 + (yy - 20) ** 2 > 9)] = 1
    labels[40:55, 50:55] = 2
    labels[50:55, 55:75] = 2
    labels[5, 70] = labels[6, 71] = 3
    return labels


@pytest.fixture
def ws(tmp_path) -> Workspace:
    root = tmp_path / "ds"
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    Image.fromarray(np.full((60, 80, 3), 200, np.uint8)).save(root / "images" / "a.png")
    Image.fromarray(_labels()).save(root / "masks" / "a.png")
    Image.fromarray(np.full((30, 30, 3), 200, np.uint8)).save(root / "images" / "b.png")
    (root / "dataset.json").write_text(json.dumps({"mask_format": "label"}))
    ws = Workspace(tmp_path / "ws")
    ws.store.set_meta("min_wound_area", 1)  # wound 3 is two pixels touching at a corner, on purpose
    import_dataset(ws, root)
    return ws


def test_outline_geometry_is_exact():
    labels = _labels()
    for k in (1, 2, 3):
        mask = labels == k
        assert (rasterize(mask_geometry(mask), mask.shape) == mask).all(), k
    ring = mask_geometry(labels == 1)
    assert len(ring.interiors) == 1 and ring.area == (labels == 1).sum()
    block = coco_polygons(mask_geometry(np.pad(np.ones((2, 3), bool), 1)))  # rows 1-2, columns 1-3
    assert len(block) == 1 and len(block[0]) == 8
    assert set(block[0][0::2]) == {1, 4} and set(block[0][1::2]) == {1, 3}


def test_rle_matches_pycocotools_decoding():
    mask = _labels() == 2
    assert (mask_utils.decode({**rle_encode(mask), "counts": rle_encode(mask)["counts"].encode()}) == mask).all()


@pytest.mark.parametrize("fmt", ["coco", "coco-rle"])
def test_coco_round_trip_matches_the_label_map(ws, tmp_path, fmt, capsys):
    out = tmp_path / fmt
    assert annotations_main(["export", str(out), "--format", fmt, "--workspace", str(ws.root)]) == 0
    assert json.loads(capsys.readouterr().out)["wounds"] == 3
    doc = json.loads((out / "annotations.json").read_text())
    assert [c["name"] for c in doc["categories"]] == ["wound"] and len(doc["images"]) == 2
    img = next(i for i in doc["images"] if i["triderm_image_id"] == "a")
    labels = ws.load_mask("a")
    for ann in doc["annotations"]:
        seg = ann["segmentation"]
        h, w = img["height"], img["width"]
        rle = mask_utils.merge(mask_utils.frPyObjects(seg, h, w)) if isinstance(seg, list) else \
            {**seg, "counts": seg["counts"].encode()}
        back = mask_utils.decode(rle).astype(bool)
        truth = labels == ann["triderm_wound_index"]
        assert ann["area"] == truth.sum() and ann["image_id"] == img["id"]
        if ann["triderm_wound_index"] != 1 or fmt == "coco-rle":  # COCO polygons carry no holes
            assert _dice(back, truth) >= 0.98, (fmt, ann["triderm_wound_index"])


def test_geojson_round_trip_matches_the_label_map(ws, tmp_path):
    assert annotations_main(["export", str(tmp_path / "gj"), "--format", "geojson", "--workspace", str(ws.root)]) == 0
    assert sorted(p.name for p in (tmp_path / "gj").iterdir()) == ["a.geojson"]
    doc = json.loads((tmp_path / "gj" / "a.geojson").read_text())
    labels = ws.load_mask("a")
    assert doc["type"] == "FeatureCollection" and len(doc["features"]) == 3
    for feat in doc["features"]:
        truth = labels == feat["properties"]["wound_index"]
        back = rasterize(shape(feat["geometry"]), labels.shape)
        assert _dice(back, truth) >= 0.98 and feat["properties"]["area_px"] == truth.sum()


def test_unknown_format_is_refused(ws, tmp_path):
    with pytest.raises(SystemExit) as exit_:
        annotations_main(["export", str(tmp_path / "x"), "--format", "pascal", "--workspace", str(ws.root)])
    assert exit_.value.code == 2 and not (tmp_path / "x").exists()
