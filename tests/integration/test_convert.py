"""annotations.io.convert: other tools' exports → a dataset folder; our own exports come back unchanged."""
from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from annotations.__main__ import main as annotations_main
from annotations.infra.workspace import Workspace
from annotations.io.convert import convert, decode_brush_rle
from annotations.io.dataset import import_dataset
from annotations.io.readers import DatasetError


def _labels(hole: bool) -> np.ndarray:
    """A disc (with a hole, or filled), an L-shape, and two pixels touching at a corner."""
    labels = np.zeros((60, 80), np.uint8)
    yy, xx = np.mgrid[:60, :80]
    r2 = (xx - 20) ** 2 + (yy - 20) ** 2
    labels[(r2 <= 144) & ((r2 > 9) if hole else True)] = 1
    labels[40:55, 50:55] = 2
    labels[50:55, 55:75] = 2
    labels[5, 70] = labels[6, 71] = 3
    return labels


def _workspace(root, labels: np.ndarray | None = None, dataset=None) -> Workspace:
    ws = Workspace(root)
    ws.store.set_meta("min_wound_area", 1)  # wound 3 is two pixels, on purpose
    if dataset is None:
        dataset = root.parent / f"{root.name}-ds"
        (dataset / "images").mkdir(parents=True)
        (dataset / "masks").mkdir()
        Image.fromarray(np.full((60, 80, 3), 200, np.uint8)).save(dataset / "images" / "a.png")
        Image.fromarray(labels).save(dataset / "masks" / "a.png")
        Image.fromarray(np.full((30, 30, 3), 90, np.uint8)).save(dataset / "images" / "b.png")
        (dataset / "wounds.csv").write_text("image_id,wound_index,description\na,1,deep ulcer\na,2,\"L, shaped\"\n"
                                            "a,3,two pixels\n")
        (dataset / "dataset.json").write_text(json.dumps({"name": "centre-a", "mask_format": "label"}))
    import_dataset(ws, dataset)
    return ws


def _export(ws: Workspace, out, fmt: str) -> dict[str, dict]:
    assert annotations_main(["export", str(out), "--format", fmt, "--workspace", str(ws.root)]) == 0
    docs = {p.name: json.loads(p.read_text()) for p in sorted(out.iterdir())}
    for doc in docs.values():
        doc.get("info", {}).pop("date_created", None)
    return docs


@pytest.mark.parametrize(("fmt", "source", "hole"), [("coco", "coco", False), ("coco-rle", "coco", True),
                                                      ("geojson", "geojson", True)])
def test_our_export_converts_imports_and_exports_back_equal(tmp_path, capsys, fmt, source, hole):
    """Export → convert → import into a new workspace → export: the same document."""
    first = _workspace(tmp_path / "ws1", _labels(hole))
    before = _export(first, tmp_path / "out1", fmt)
    capsys.readouterr()
    assert annotations_main(["convert", "--from", source, str(tmp_path / "out1"), str(tmp_path / "ds2"),
                             "--images", str(first.images_dir), "--name", "centre-a", "--min-area", "1"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["images"] == (2 if source == "coco" else 1) and summary["wounds"] == 3
    second = _workspace(tmp_path / "ws2", dataset=tmp_path / "ds2")
    after = _export(second, tmp_path / "out2", fmt)
    assert after == before
    for image_id in ("a",):
        assert (second.load_mask(image_id) == first.load_mask(image_id)).all()


def _brush_rle(values: np.ndarray) -> list[int]:
    """Label Studio's brush RLE (rle-pack) written from its specification: runs of ≥ 2 as repeated
    words, single values as literal chunks; run lengths in 4, 8, 12 or 16 bits, words of 8 bits."""
    sizes = (4, 8, 12, 16)
    bits = f"{values.size:032b}{7:05b}" + "".join(f"{s - 1:04b}" for s in sizes)
    i = 0
    while i < values.size:
        j = i
        while j < values.size and values[j] == values[i] and j - i < 1 << 16:
            j += 1
        size = next(k for k, s in enumerate(sizes) if j - i - 1 < 1 << s)
        bits += ("0" if j - i == 1 else "1") + f"{size:02b}" + f"{j - i - 1:0{sizes[size]}b}" + f"{int(values[i]):08b}"
        i = j
    bits += "0" * (-len(bits) % 8)
    return [int(bits[k:k + 8], 2) for k in range(0, len(bits), 8)]


def test_brush_rle_decodes_runs_and_literals():
    values = np.array([0] * 20 + [255] + [7] * 300 + [1, 2, 3], np.uint32)
    assert (decode_brush_rle(_brush_rle(values)) == values).all()
    with pytest.raises(ValueError, match="ends early"):
        decode_brush_rle(_brush_rle(values)[:-3])


def _photos(folder, names=("p1.png", "p2.png")):
    folder.mkdir(parents=True, exist_ok=True)
    for n in names:
        Image.fromarray(np.full((20, 40, 3), 120, np.uint8)).save(folder / n)


def test_label_studio_polygons_and_brushes(tmp_path):
    _photos(tmp_path / "src" / "images")
    brush = np.zeros((20, 40), bool)
    brush[2:6, 30:38] = True
    tasks = [
        {"data": {"image": "/data/upload/3/1a2b3c4d-p1.png"},
         "annotations": [{"was_cancelled": True, "result": []},
                         {"result": [{"type": "polygonlabels", "original_width": 40, "original_height": 20,
                                      "value": {"points": [[0, 0], [25, 0], [25, 50], [0, 50]],
                                                "polygonlabels": ["wound"]}},
                                     {"type": "brushlabels", "original_width": 40, "original_height": 20,
                                      "value": {"format": "rle", "brushlabels": ["scar"],
                                                "rle": _brush_rle(np.repeat(brush.ravel() * 255, 4))}},
                                     {"type": "choices", "value": {"choices": ["x"]}}]}]},
        {"data": {"image": "/data/upload/3/p2.png"}, "annotations": []},
    ]
    (tmp_path / "src" / "result.json").write_text(json.dumps(tasks))
    summary = convert("labelstudio", tmp_path / "src", tmp_path / "ds")
    assert summary["images"] == 2 and summary["wounds"] == 2
    labels = np.array(Image.open(tmp_path / "ds" / "masks" / "p1.png"))
    assert (labels == 1).sum() == 10 * 10 and (labels[:10, :10] == 1).all()  # 25 % of 40 wide, 50 % of 20 high
    assert ((labels == 2) == brush).all()
    assert not (tmp_path / "ds" / "masks" / "p2.png").exists()
    assert (tmp_path / "ds" / "wounds.csv").read_text().splitlines() == [
        "image_id,wound_index,description,label", "p1,1,,wound", "p1,2,,scar"]
    ws = Workspace(tmp_path / "ws")
    import_dataset(ws, tmp_path / "ds")
    assert [(w["image_id"], w["wound_index"], w["metadata"]) for w in ws.store.wounds()] == [
        ("p1", 1, {"label": "wound"}), ("p1", 2, {"label": "scar"})]


def test_cvat_polygons_and_masks(tmp_path):
    _photos(tmp_path / "src")
    xml = """<?xml version="1.0" encoding="utf-8"?>
<annotations><version>1.1</version>
  <image id="0" name="p1.png" width="40" height="20">
    <polygon label="wound" occluded="0" source="manual" points="0.00,0.00;10.00,0.00;10.00,5.00;0.00,5.00" z_order="0">
      <attribute name="description">sloughy base</attribute>
    </polygon>
    <mask label="wound" source="manual" occluded="0" rle="1, 2, 3, 2" left="20" top="10" width="4" height="2"
          z_order="0"/>
    <box label="ruler" occluded="0" xtl="30" ytl="1" xbr="39" ybr="4"/>
  </image>
  <image id="1" name="p2.png" width="40" height="20"/>
</annotations>"""
    (tmp_path / "src" / "annotations.xml").write_text(xml)
    summary = convert("cvat", tmp_path / "src" / "annotations.xml", tmp_path / "ds", min_area=1)
    assert (summary["images"], summary["wounds"], summary["other_shapes_skipped"]) == (2, 2, 1)
    labels = np.array(Image.open(tmp_path / "ds" / "masks" / "p1.png"))
    assert (labels[:5, :10] == 1).all() and (labels == 1).sum() == 50
    box = np.zeros((2, 4), bool)
    box.flat[1:3] = box.flat[6:8] = True  # 1 off, 2 on, 3 off, 2 on
    assert ((labels[10:12, 20:24] == 2) == box).all() and (labels == 2).sum() == 4
    assert "p1,1,sloughy base" in (tmp_path / "ds" / "wounds.csv").read_text()


def _coco(tmp_path, **change) -> None:
    _photos(tmp_path / "src")
    ann = {"id": 1, "image_id": 1, "category_id": 1, "segmentation": [[0, 0, 10, 0, 10, 10, 0, 10]]}
    doc = {"images": [{"id": 1, "file_name": "p1.png", "width": 40, "height": 20}], "annotations": [ann],
           "categories": [{"id": 1, "name": "wound"}]}
    for key, value in change.items():
        (ann if key in ann or key == "extra" else doc)[key] = value
    if "extra" in change:
        doc["annotations"].append({**ann, "id": 2, "segmentation": change["extra"]})
        del ann["extra"]
    (tmp_path / "src" / "annotations.json").write_text(json.dumps(doc))


@pytest.mark.parametrize(("change", "message"), [
    ({"segmentation": [[0, 0, 10]]}, r"annotations\[0\]\.segmentation\[0\]: a polygon needs"),
    ({"segmentation": {"size": [20, 40], "counts": 5}}, r"annotations\[0\]\.segmentation: counts is not"),
    ({"segmentation": {"size": [10, 10], "counts": "x"}}, r"annotations\[0\]\.segmentation: size"),
    ({"image_id": 9}, r"annotations\[0\]: image_id 9 is not in images"),
    ({"images": [{"id": 1, "file_name": "nope.png", "width": 40, "height": 20}]}, r"images\[0\]: photo 'nope.png'"),
    ({"images": [{"id": 1, "file_name": "p1.png", "width": 20, "height": 40}]}, r"images\[0\]: size 20×40"),
    ({"extra": [[5, 5, 15, 5, 15, 15, 5, 15]]},
     r"annotations\[1\]\.segmentation: overlaps annotations\.json: annotations\[0\]\.segmentation by 25 px"),
])
def test_bad_coco_is_one_error_naming_file_and_field_and_writes_nothing(tmp_path, change, message):
    _coco(tmp_path, **change)
    with pytest.raises(DatasetError, match=r"annotations\.json: " + message):
        convert("coco", tmp_path / "src", tmp_path / "ds", overlap="refuse")
    assert not (tmp_path / "ds").exists() and [p.name for p in tmp_path.iterdir()] == ["src"]


def test_bad_cvat_and_label_studio_name_the_field(tmp_path):
    _photos(tmp_path / "src")
    (tmp_path / "src" / "a.xml").write_text('<annotations><image name="p1.png" width="40" height="20">'
                                            '<mask label="w" rle="1, 2" left="0" top="0" width="4" height="2"/>'
                                            "</image></annotations>")
    with pytest.raises(DatasetError, match=r"a\.xml: <image> 1 <mask> 1: rle covers 3 pixels"):
        convert("cvat", tmp_path / "src" / "a.xml", tmp_path / "ds")
    (tmp_path / "src" / "t.json").write_text(json.dumps([{"data": {"image": "p1.png"}, "annotations": [{"result": [
        {"type": "brushlabels", "original_width": 40, "original_height": 20,
         "value": {"format": "rle", "rle": [0, 0], "brushlabels": ["w"]}}]}]}]))
    with pytest.raises(DatasetError, match=r"t\.json: \[0\]\.annotations\[0\]\.result\[0\]\.value\.rle: not a Label"):
        convert("labelstudio", tmp_path / "src" / "t.json", tmp_path / "ds")
    assert not (tmp_path / "ds").exists()


def test_convert_refuses_a_non_empty_out(tmp_path):
    _coco(tmp_path)
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "keep.txt").write_text("mine")
    with pytest.raises(DatasetError, match="not an empty folder"):
        convert("coco", tmp_path / "src", tmp_path / "ds")
    assert [p.name for p in (tmp_path / "ds").iterdir()] == ["keep.txt"]


def test_a_photo_that_is_a_link_is_refused_and_nothing_outside_is_copied(tmp_path):
    _coco(tmp_path)
    outside = tmp_path / "outside.png"
    (tmp_path / "src" / "p1.png").rename(outside)
    (tmp_path / "src" / "p1.png").symlink_to(outside)
    with pytest.raises(DatasetError, match=r"p1\.png: .*link"):
        convert("coco", tmp_path / "src", tmp_path / "ds")
    assert not (tmp_path / "ds").exists()
