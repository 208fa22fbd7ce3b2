"""Property-based fuzzing of the annotation-file readers of ``convert`` (hypothesis): any COCO, CVAT,
Label Studio or GeoJSON file gives either a valid dataset folder or one DatasetError — never another
exception — and a refused file leaves ``out`` unwritten.

Besides random bytes, the strategies build near-valid documents (counts and sizes off by a little
or by 2^62, wrong types, NaN, deep nesting, crossing polygons) so the examples reach the decoders.
``TRIDERM_FUZZ_EXAMPLES`` sets the number of examples, as in ``test_fuzz_readers.py``.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image
from test_convert import _brush_rle

from annotations.io.convert import convert
from annotations.io.readers import DatasetError, DatasetFolder, read_info

EXAMPLES = int(os.environ.get("TRIDERM_FUZZ_EXAMPLES", "60"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
W, H = 12, 8

#: Numbers near the edges: zero, the photo's size ± 1, negative, huge, 2^62 (wraps an int64 sum).
EDGY_INTS = st.one_of(st.integers(-3, 120), st.sampled_from([W, H, W * H, W * H + 1, 1 << 31, 1 << 62, 1 << 63,
                                                            10 ** 22, -(1 << 62)]))
NUMBERS = st.one_of(EDGY_INTS, st.floats(-50, 50, allow_nan=False), st.sampled_from([1e300, -1e300, 0.5]))
JUNK = st.one_of(st.none(), st.booleans(), st.text(max_size=5), NUMBERS, st.just([]), st.just({}))
#: Coordinates mostly inside the W×H photo.
XS, YS = st.floats(-2, W + 2), st.floats(-2, H + 2)


def mostly(good: Any, bad: st.SearchStrategy) -> st.SearchStrategy:
    """``good`` (a value or a strategy) 4 times in 5, else ``bad``: most fields stay valid, so the
    examples get past the size and type checks to the decoders."""
    good = good if isinstance(good, st.SearchStrategy) else st.just(good)
    return st.integers(0, 4).flatmap(lambda k: bad if k == 4 else good)  # hypothesis favours 0: good


def _convert(fmt: str, name: str, content: bytes | str) -> None:
    """Convert ``content`` (saved as ``name`` beside a W×H photo p1.png); a result must be a complete
    dataset folder, a refusal one DatasetError with ``out`` left unwritten."""
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "src", Path(tmp) / "out"
        src.mkdir()
        Image.fromarray(np.full((H, W, 3), 120, np.uint8)).save(src / "p1.png")
        path = src / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8", "surrogatepass"))
        try:
            summary = convert(fmt, path, out)
        except DatasetError as err:
            assert type(err) is DatasetError and "\n" not in str(err)
            assert not out.exists()
            return
        assert summary["images"] == len(list((out / "images").iterdir()))
        for mask in (out / "masks").iterdir():
            labels = np.array(Image.open(mask))
            assert labels.shape == (H, W) and int(labels.max()) >= 1
        rows = (out / "wounds.csv").read_text().splitlines()
        assert len(rows) == 1 + summary["wounds"]


def _dumps(doc: Any, nan: bool) -> str:
    text = json.dumps(doc)
    return text.replace("0.5", "NaN", 1) if nan else text


# ---- COCO -------------------------------------------------------------------------------------

#: Characters of COCO's compressed counts and around them ('0'…'o' are digits, others invalid).
RLE_TEXT = st.text(alphabet=st.sampled_from(list("0123456789:;<=>?@ABOPQ_`aoz~ \x7f")), max_size=12)


@st.composite
def coco_segmentations(draw) -> Any:
    kind = draw(st.sampled_from(["polygon", "rle-list", "rle-string", "junk"]))
    if kind == "polygon":
        pairs = mostly(st.tuples(XS, YS), st.tuples(NUMBERS, NUMBERS))
        return [draw(mostly(st.lists(pairs, min_size=3, max_size=8).map(lambda ps: [c for p in ps for c in p]),
                            st.lists(NUMBERS, max_size=7))) for _ in range(draw(st.integers(1, 2)))]
    if kind == "junk":
        return draw(JUNK)
    size = draw(mostly([H, W], st.one_of(st.lists(EDGY_INTS, max_size=3), JUNK)))
    if kind == "rle-list":
        cuts = sorted(draw(st.lists(st.integers(0, W * H), max_size=6)))
        good = [b - a for a, b in zip([0, *cuts], [*cuts, W * H])]
        counts: Any = draw(mostly(good, st.lists(EDGY_INTS, max_size=8)))
    else:
        from pycocotools import mask as mask_utils
        mask = np.asfortranarray(draw(st.lists(st.booleans(), min_size=W * H, max_size=W * H)), np.uint8)
        good = mask_utils.encode(mask.reshape(H, W, order="F"))["counts"].decode("ascii")
        counts = draw(st.one_of(st.just(good), st.just(good[:-1]), RLE_TEXT.map(lambda t: good + t), RLE_TEXT))
    return {"size": size, "counts": counts}


@st.composite
def coco_documents(draw) -> str:
    image = {"id": 1, "file_name": draw(mostly("p1.png", st.sampled_from(["p1", "sub/p1.png", "../p1.png"]))),
             "width": draw(mostly(W, EDGY_INTS)), "height": draw(mostly(H, EDGY_INTS))}
    anns = [{"id": k, "image_id": draw(mostly(1, st.sampled_from([2, "1"]))),
             "category_id": draw(mostly(1, st.sampled_from([2, None, "1"]))), "segmentation": draw(coco_segmentations()),
             **({"triderm_wound_index": draw(EDGY_INTS)} if draw(st.booleans()) else {})}
            for k in range(draw(st.integers(0, 3)))]
    doc: Any = {"images": [image], "annotations": anns, "categories": [{"id": 1, "name": "wound"}]}
    if draw(mostly(False, st.just(True))):
        doc[draw(st.sampled_from(["images", "annotations", "categories"]))] = draw(JUNK)
    return _dumps(doc, draw(mostly(False, st.just(True))))


@FUZZ
@given(content=st.one_of(coco_documents(), st.binary(max_size=300)))
def test_coco_reader_any_document(content):
    _convert("coco", "annotations.json", content)


# ---- CVAT -------------------------------------------------------------------------------------

ATTR = st.one_of(EDGY_INTS.map(str), st.sampled_from(["", "4.0", "4.5", "1e62", "inf", "nan", "-0", " 3 ", "x"]))



@st.composite
def cvat_shapes(draw) -> str:
    kind = draw(st.sampled_from(["polygon", "mask", "box", "polyline"]))
    if kind == "mask":
        bw, bh = draw(st.integers(0, W + 1)), draw(st.integers(0, H + 1))
        split = draw(st.integers(0, bw * bh))
        counts = draw(mostly(st.sampled_from([f"{split}, {bw * bh - split}", f"0, {split}, {bw * bh - split}"]),
                             st.one_of(st.lists(EDGY_INTS, max_size=6).map(lambda c: ", ".join(map(str, c))),
                                       st.just(f"{bw * bh - 1}, 1, 1"), st.text(max_size=8))))
        left, top = draw(mostly(st.integers(0, max(0, W - bw)).map(str), ATTR)), draw(mostly(st.integers(0, max(0, H - bh)).map(str), ATTR))
        width, height = draw(mostly(str(bw), ATTR)), draw(mostly(str(bh), ATTR))
        return f'<mask label="w" rle="{counts}" left="{left}" top="{top}" width="{width}" height="{height}"/>'
    points = ";".join(f"{x},{y}" for x, y in draw(st.lists(mostly(st.tuples(XS, YS), st.tuples(NUMBERS, NUMBERS)),
                                                           max_size=8)))
    points = draw(mostly(points, st.text(alphabet=st.sampled_from(list("0123456789.,;-e ")), max_size=20)))
    return f'<{kind} label="w" points="{points}"><attribute name="description">d</attribute></{kind}>'


@st.composite
def cvat_documents(draw) -> str:
    width, height = draw(mostly(str(W), ATTR)), draw(mostly(str(H), ATTR))
    shapes = "".join(draw(st.lists(cvat_shapes(), max_size=3)))
    name = draw(mostly('name="p1.png"', st.sampled_from(['name="p2.png"', ""])))
    return f'<annotations><image id="0" {name} width="{width}" height="{height}">{shapes}</image></annotations>'


@FUZZ
@given(content=st.one_of(cvat_documents(), st.binary(max_size=300),
                         st.integers(1, 3000).map(lambda n: "<annotations>" + "<a>" * n + "</a>" * n + "</annotations>")))
def test_cvat_reader_any_document(content):
    _convert("cvat", "annotations.xml", content)


# ---- Label Studio -----------------------------------------------------------------------------

@st.composite
def ls_results(draw) -> Any:
    kind = draw(st.sampled_from(["polygonlabels", "brushlabels", "choices", "junk"]))
    if kind == "junk":
        return draw(JUNK)
    size = {"original_width": draw(mostly(W, EDGY_INTS)), "original_height": draw(mostly(H, EDGY_INTS))}
    if kind == "polygonlabels":
        percent = st.floats(-5, 105)
        points = draw(mostly(st.lists(mostly(st.lists(percent, min_size=2, max_size=2),
                                             st.lists(NUMBERS, max_size=3)), max_size=8), JUNK))
        return {"type": kind, **size, "value": {"points": points, kind: draw(mostly(["w"], JUNK))}}
    if kind == "brushlabels":
        n = draw(mostly(W * H * 4, st.sampled_from([W * H * 4 - 1, W * H * 4 + 4, 0, 5])))
        values = np.array(draw(st.lists(st.sampled_from([0, 255, 128, 7]), min_size=n, max_size=n)), np.uint32)
        rle = _brush_rle(values) if n else [0] * 5
        rle = draw(mostly(rle, st.one_of(st.just(rle[:-1]), st.just(rle[:8]), st.lists(st.integers(-1, 300),
                                                                                      max_size=12))))
        return {"type": kind, **size, "value": {"format": draw(mostly("rle", st.just("png"))), "rle": rle,
                                                kind: ["w"]}}
    return {"type": kind, "value": {"choices": ["x"]}}


@st.composite
def ls_documents(draw) -> str:
    results = draw(mostly(st.lists(ls_results(), max_size=3), JUNK))
    ann = {"result": results, "was_cancelled": draw(mostly(False, st.just(True))), "ground_truth": draw(st.booleans())}
    task: Any = {"data": draw(mostly({"image": "/data/upload/1/1a2b3c4d-p1.png"}, JUNK)),
                 "annotations": draw(mostly([ann], JUNK))}
    return _dumps(draw(mostly([task], st.one_of(st.just(task), JUNK))), draw(mostly(False, st.just(True))))


@FUZZ
@given(content=st.one_of(ls_documents(), st.binary(max_size=300)))
def test_label_studio_reader_any_document(content):
    _convert("labelstudio", "result.json", content)


# ---- GeoJSON ----------------------------------------------------------------------------------

COORDS = st.recursive(st.lists(NUMBERS, min_size=2, max_size=3), lambda inner: st.lists(inner, max_size=6),
                      max_leaves=30)


@st.composite
def geojson_documents(draw) -> str:
    kind = draw(mostly("Polygon", st.sampled_from(["MultiPolygon", "Point", "LineString", None])))
    rings = [draw(st.lists(st.tuples(XS, YS), min_size=0, max_size=8)) for _ in range(draw(st.integers(1, 2)))]
    polygon = [[list(p) for p in ring + ring[:1]] for ring in rings]
    coords = draw(mostly([polygon] if kind == "MultiPolygon" else polygon, st.one_of(COORDS, JUNK)))
    geometry = {"type": kind, "coordinates": coords}
    feature = {"type": "Feature", "geometry": draw(mostly(geometry, JUNK)),
               "properties": draw(mostly({"image_id": "p1", "wound_index": draw(EDGY_INTS)}, JUNK))}
    body = draw(mostly({"type": "FeatureCollection", "features": [feature]}, st.sampled_from([[feature], geometry])))
    return _dumps(body, draw(mostly(False, st.just(True))))


@FUZZ
@given(content=st.one_of(geojson_documents(), st.binary(max_size=300),
                         st.integers(1, 200_000).map(lambda n: "[" * n + "]" * n)))
def test_geojson_reader_any_document(content):
    _convert("geojson", "p1.geojson", content)


# ---- dataset.json (the one dataset-folder file test_fuzz_readers.py does not fuzz) -------------

INFO_VALUES = st.one_of(JUNK, st.sampled_from(["auto", "label", "binary", "yes", "0"]),
                        st.dictionaries(st.text(max_size=3), st.one_of(st.sampled_from(["int", "str", "x"]), JUNK),
                                        max_size=3))


@FUZZ
@given(content=st.one_of(st.binary(max_size=200),
                         st.dictionaries(st.sampled_from(["name", "synthetic", "mask_format", "columns", "x"]),
                                         INFO_VALUES, max_size=4).map(lambda d: _dumps(d, False)),
                         st.integers(1, 100_000).map(lambda n: "{\"a\":" * n + "1" + "}" * n)))
def test_dataset_info_reader_any_document(content):
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "dataset.json").write_bytes(content if isinstance(content, bytes) else content.encode())
        try:
            info = read_info(DatasetFolder(tmp))
        except DatasetError as err:
            assert type(err) is DatasetError and "dataset.json" in str(err)
            return
    assert info["mask_format"] in ("auto", "label", "binary") and isinstance(info["columns"], dict)
