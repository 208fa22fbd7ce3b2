"""Label Studio JSON: TriDerm's export (tasks with pre-annotations) and its brush RLE encoder, read back by convert.

The real Label Studio server is in tests/labelstudio/; here the same files without it: a prediction
accepted as is (what Label Studio exports once a person submits it) converts back to the same outlines.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from annotations.__main__ import main as annotations_main
from annotations.infra.workspace import Workspace
from annotations.io.convert import _brush_mask, convert, decode_brush_rle
from annotations.io.dataset import import_dataset
from annotations.io.formats import encode_brush_rle, labelstudio_region


@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (40, 1700)])
@pytest.mark.parametrize("fill", [0.0, 0.3, 1.0])
def test_brush_rle_encoder_is_the_decoders_inverse(shape, fill):
    """Every pixel's four RGBA words are 255 (wound) or 0, also across runs longer than 65,536 words."""
    mask = np.random.default_rng(0).random(shape) < fill
    mask[: shape[0] // 2, : shape[1] // 2] = fill > 0  # a long run (40 × 850 px = 136,000 words when filled)
    words = decode_brush_rle(encode_brush_rle(mask), mask.size * 4).reshape(*shape, 4)
    assert ((words == 255) == mask[..., None]).all() and ((words == 0) == ~mask[..., None]).all()
    band, top, left = _brush_mask(encode_brush_rle(mask), shape[1], shape[0], "x")
    back = np.zeros(shape, bool)
    back[top:top + band.shape[0], left:left + band.shape[1]] = band
    assert (back == mask).all()


def test_a_region_is_a_polygon_unless_one_ring_cannot_hold_it():
    mask = np.zeros((10, 20), bool)
    mask[2:6, 4:10] = True
    region = labelstudio_region(mask, "wound")
    assert region["type"] == "polygonlabels" and region["from_name"] == "outline"
    assert sorted(map(tuple, region["value"]["points"])) == [(20.0, 20.0), (20.0, 60.0), (50.0, 20.0), (50.0, 60.0)]
    mask[3:5, 6:8] = False  # a hole
    assert labelstudio_region(mask, "wound")["type"] == "brushlabels"
    with pytest.raises(ValueError, match="needs a BrushLabels tag"):
        labelstudio_region(mask, "wound", brush=None)


def _workspace(root) -> Workspace:
    """Photo a: a disc with a hole, an L-shape and two pixels touching at a corner (labels, descriptions);
    photo b: no wound."""
    labels = np.zeros((60, 80), np.uint8)
    yy, xx = np.mgrid[:60, :80]
    r2 = (xx - 20) ** 2 + (yy - 20) ** 2
    labels[(r2 <= 144) & (r2 > 9)] = 1
    labels[40:55, 50:55] = 2
    labels[50:55, 55:75] = 2
    labels[5, 70] = labels[6, 71] = 4
    ds = root.parent / f"{root.name}-ds"
    (ds / "images").mkdir(parents=True)
    (ds / "masks").mkdir()
    Image.fromarray(np.full((60, 80, 3), 200, np.uint8)).save(ds / "images" / "a.png")
    Image.fromarray(labels).save(ds / "masks" / "a.png")
    Image.fromarray(np.full((30, 30, 3), 90, np.uint8)).save(ds / "images" / "b.png")
    (ds / "wounds.csv").write_text("image_id,wound_index,description,label\na,1,deep ulcer,ulcer\n"
                                   "a,2,\"L, shaped\",scar\na,4,,ulcer\n")
    (ds / "dataset.json").write_text(json.dumps({"name": "centre-a", "mask_format": "label"}))
    ws = Workspace(root)
    ws.store.set_meta("min_wound_area", 1)  # wound 4 is two pixels, on purpose
    import_dataset(ws, ds)
    return ws


def _accepted(tasks: list[dict]) -> list[dict]:
    """Label Studio's JSON export once each task's prediction was submitted as it is."""
    return [{**{k: v for k, v in t.items() if k != "predictions"},
             "annotations": [{"result": p["result"]} for p in t.get("predictions", [])]} for t in tasks]


def test_export_to_label_studio_converts_back_to_the_same_outlines(tmp_path, capsys):
    ws = _workspace(tmp_path / "ws")
    assert annotations_main(["export", str(tmp_path / "ls"), "--format", "labelstudio",
                             "--workspace", str(ws.root)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["images"], summary["wounds"]) == (2, 3)
    tasks = json.loads((tmp_path / "ls" / "tasks.json").read_text())
    assert [t["data"] for t in tasks] == [{"image": "/data/local-files/?d=images/a.png", "triderm_image_id": "a"},
                                          {"image": "/data/local-files/?d=images/b.png", "triderm_image_id": "b"}]
    regions = tasks[0]["predictions"][0]["result"]
    assert [(r["id"], r["type"], r["value"][r["type"]]) for r in regions] == [
        ("wound-1", "brushlabels", ["ulcer"]), ("wound-2", "polygonlabels", ["scar"]),
        ("wound-4", "brushlabels", ["ulcer"])]
    assert [r.get("meta") for r in regions] == [{"text": ["deep ulcer"]}, {"text": ["L, shaped"]}, None]
    config = (tmp_path / "ls" / "label_config.xml").read_text()
    assert '<PolygonLabels name="outline" toName="image"><Label value="ulcer"/><Label value="scar"/>' in config

    (tmp_path / "ls" / "result.json").write_text(json.dumps(_accepted(tasks)))
    back = convert("labelstudio", tmp_path / "ls" / "result.json", tmp_path / "ds", images=ws.images_dir,
                   min_area=1)
    assert (back["images"], back["wounds"]) == (2, 3)
    assert (np.array(Image.open(tmp_path / "ds" / "masks" / "a.png")) == ws.load_mask("a")).all()
    assert (tmp_path / "ds" / "wounds.csv").read_text().splitlines() == [
        "image_id,wound_index,description,label", "a,1,deep ulcer,ulcer", 'a,2,"L, shaped",scar', "a,4,,ulcer"]


def test_a_region_drawn_in_label_studio_renumbers_the_photos_wounds_in_file_order(tmp_path):
    """Indices are kept only when every region of the photo carries one (``wound-N``)."""
    ws = _workspace(tmp_path / "ws")
    assert annotations_main(["export", str(tmp_path / "ls"), "--format", "labelstudio", "--workspace", str(ws.root),
                             "--image-prefix", "/data/local-files/?d=clinic/"]) == 0
    tasks = _accepted(json.loads((tmp_path / "ls" / "tasks.json").read_text()))
    assert tasks[0]["data"]["image"] == "/data/local-files/?d=clinic/a.png"
    tasks[0]["annotations"][0]["result"][0]["id"] = "Xy12abCD"  # the id Label Studio gives a new region
    (tmp_path / "ls" / "result.json").write_text(json.dumps(tasks))
    convert("labelstudio", tmp_path / "ls" / "result.json", tmp_path / "ds", images=ws.images_dir, min_area=1)
    labels = np.array(Image.open(tmp_path / "ds" / "masks" / "a.png"))
    assert sorted(np.unique(labels).tolist()) == [0, 1, 2, 3]
    assert ((labels == 3) == (ws.load_mask("a") == 4)).all()


def test_an_rle_encoder_input_without_pixels_is_refused():
    with pytest.raises(ValueError, match="empty mask"):
        encode_brush_rle(np.zeros((0, 4), bool))
