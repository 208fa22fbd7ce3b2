"""Issue 49 (hardening, round two): crafted annotation files give one DatasetError naming the file
and field, never a traceback, a crash, a random mask or an unbounded allocation; ``out`` is never
written."""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap
import zlib

import numpy as np
import pytest
from PIL import Image
from pycocotools import mask as mask_utils
from test_convert import _brush_rle, _coco, _photos

from annotations.io import convert as convert_module
from annotations.io.convert import convert
from annotations.io.readers import DatasetError

TWO_62 = 1 << 62


def _refused(tmp_path, fmt: str, src, match: str, **kwargs) -> None:
    with pytest.raises(DatasetError, match=match):
        convert(fmt, src, tmp_path / "ds", **kwargs)
    assert not (tmp_path / "ds").exists()


# ---- one checked RLE decoder ------------------------------------------------------------------

def _small_rle() -> str:
    """A compressed COCO RLE of a 2×2 mask: 4 pixels, not the 800 of a 40×20 photo."""
    return mask_utils.encode(np.asfortranarray(np.eye(2, dtype=np.uint8)))["counts"].decode("ascii")


@pytest.mark.parametrize(("counts", "message"), [
    ([5], r"covers 5 pixels, not the 800 of the 40×20 photo"),
    ([100, 100], r"covers 200 pixels"),
    ([TWO_62] * 4 + [800], r"covers more than the 800 pixels"),
    ([10 ** 22, 0], r"covers more than the 800"),
    ([-5, 805], r"count 1 \(-5\) is not a whole number"),
    ([400.5, 399.5], r"count 1 \(400\.5\) is not a whole number"),
    (None, r"covers 4 pixels, not the 800"),  # compressed, too short
    ("\x7f\x7f", r"holds '\\x7f' \(position 1\), not a COCO RLE character"),
    ("OO", r"count 1 \(-1\) is not a whole number"),  # 31 - 32: sign-extended
    ("P", r"ends inside a number"),
    ("0" + "o" * 20 + "1", r"too long to be a count"),
])
def test_a_coco_rle_must_cover_the_photo_exactly(tmp_path, counts, message):
    counts = _small_rle() if counts is None else counts
    _coco(tmp_path, segmentation={"size": [20, 40], "counts": counts})
    _refused(tmp_path, "coco", tmp_path / "src", r"annotations\.json: annotations\[0\]\.segmentation\.counts:? .*"
             + message)


def test_compressed_coco_counts_decode_as_pycocotools_writes_them():
    rng = np.random.default_rng(0)
    for shape in [(1, 1), (3, 7), (20, 40), (64, 3)]:
        mask = rng.random(shape) < 0.4
        rle = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
        counts = convert_module.coco_counts(rle["counts"].decode("ascii"), "x")
        flat = np.repeat(np.arange(len(counts)) % 2 == 1, counts)
        assert (mask == flat.reshape(shape[1], shape[0]).T).all()


def _cvat(tmp_path, shape: str, width: str = "40", height: str = "20") -> None:
    _photos(tmp_path / "src")
    (tmp_path / "src" / "a.xml").write_text(f'<annotations><image name="p1.png" width="{width}" height="{height}">'
                                            f"{shape}</image></annotations>")


def _mask(rle: str, box: str = 'left="0" top="0" width="4" height="2"') -> str:
    return f'<mask label="w" rle="{rle}" {box}/>'


@pytest.mark.parametrize(("shape", "size", "message"), [
    (_mask("1" + "0" * 22 + ", 2"), ("40", "20"), r"<mask> 1: attribute 'rle' count 1 .* is not a count"),
    (_mask("3, -1, 6"), ("40", "20"), r"<mask> 1: attribute 'rle' count 2 \('-1'\)"),
    (_mask("4, 4", 'left="0" top="0" width="-2" height="-4"'), ("40", "20"), r"the box -2×-4 at \(0, 0\) is not inside"),
    (_mask("4, 4", 'left="-1" top="0" width="4" height="2"'), ("40", "20"), r"the box 4×2 at \(-1, 0\)"),
    (_mask("4, 4", 'left="0" top="0" width="inf" height="2"'), ("40", "20"), r"attribute 'width' is missing or not"),
    (_mask("4, 4"), ("1e62", "20"), r": attribute 'width' is missing or not a whole number"),
    (_mask("4, 4"), ("100000000", "100000000"), r": size 100000000×100000000 is not a photo size"),
    (_mask("4, 4"), ("40.5", "20"), r"attribute 'width' is missing or not a whole number"),
])
def test_a_crafted_cvat_mask_is_one_error(tmp_path, shape, size, message):
    _cvat(tmp_path, shape, *size)
    _refused(tmp_path, "cvat", tmp_path / "src" / "a.xml", r"a\.xml: <image> 1.*" + message)


def test_cvat_counts_that_wrap_an_int64_sum_are_refused_without_a_crash(tmp_path):
    """4 × 2^62 + 8 wraps an int64 sum to 8, the box's size: np.repeat then wrote past its buffer
    (a segmentation fault, so this runs in a child process)."""
    _cvat(tmp_path, _mask(", ".join([str(TWO_62)] * 4 + ["8"])))
    script = textwrap.dedent(f"""
        from annotations.io.convert import convert
        from annotations.io.readers import DatasetError
        try:
            convert("cvat", {str(tmp_path / "src" / "a.xml")!r}, {str(tmp_path / "ds")!r})
        except DatasetError as err:
            print("DatasetError:", err)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "DatasetError: a.xml: <image> 1 <mask> 1: attribute 'rle' count 1 ('4611686018427387904') is not a count" \
        in done.stdout
    assert not (tmp_path / "ds").exists()


def test_a_label_studio_brush_of_another_size_is_refused_before_it_is_decoded(tmp_path):
    _photos(tmp_path / "src")
    big = _brush_rle(np.zeros(4 * 40 * 21, np.uint32))  # one row too many
    tasks = [{"data": {"image": "p1.png"}, "annotations": [{"result": [
        {"type": "brushlabels", "original_width": 40, "original_height": 20,
         "value": {"format": "rle", "rle": big, "brushlabels": ["w"]}}]}]}]
    (tmp_path / "src" / "t.json").write_text(json.dumps(tasks))
    _refused(tmp_path, "labelstudio", tmp_path / "src" / "t.json",
             r"t\.json: \[0\]\.annotations\[0\]\.result\[0\]\.value\.rle: not a Label Studio brush RLE of 40×20×4 "
             r"\(RGBA\) values \(3,360 values, expected 3,200\)")


# ---- bounded memory ---------------------------------------------------------------------------

_LIMITED = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
from annotations.io.convert import convert
from annotations.io.readers import DatasetError
try:
    convert(sys.argv[1], sys.argv[2], sys.argv[3])
except DatasetError as err:
    print("DatasetError:", err)
"""


def _convert_in_1_gib(fmt: str, src, out) -> str:
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}  # no per-thread buffers in 1 GiB
    done = subprocess.run([sys.executable, "-c", _LIMITED, fmt, str(src), str(out)], capture_output=True,
                          text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_a_small_coco_file_declaring_huge_rle_photos_is_refused_within_1_gib(tmp_path):
    """12 full-photo RLEs of a declared 9000×9000 photo (1 kB of JSON) were all decoded before the
    photo was looked at: 1.9 GB. Now each is decoded only once the photo is found to be that size."""
    _photos(tmp_path / "src")
    anns = [{"id": k, "image_id": 1, "category_id": 1, "segmentation": {"size": [9000, 9000], "counts": [81_000_000]}}
            for k in range(12)]
    (tmp_path / "src" / "annotations.json").write_text(json.dumps({
        "images": [{"id": 1, "file_name": "p1.png", "width": 9000, "height": 9000}], "annotations": anns,
        "categories": [{"id": 1, "name": "w"}]}))
    out = _convert_in_1_gib("coco", tmp_path / "src", tmp_path / "ds")
    assert "DatasetError: annotations.json: images[0]: size 9000×9000 is not the photo's upright 40×20" in out
    assert not (tmp_path / "ds").exists()


def _png_header(width: int, height: int) -> bytes:
    """A PNG that declares ``width``×``height`` pixels and holds none (a decompression bomb's header)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    return (b"\x89PNG\r\n\x1a\n" + struct.pack(">I", len(ihdr)) + chunk + struct.pack(">I", zlib.crc32(chunk))
            + struct.pack(">I", 0) + b"IEND" + struct.pack(">I", zlib.crc32(b"IEND")))


@pytest.mark.parametrize("size", [(100_000, 100_000), (10_000, 9_000)])
def test_a_photo_over_the_pixel_budget_is_refused_when_converting(tmp_path, size):
    """Pillow raises DecompressionBombError over twice its limit (a traceback before) and only warns
    between once and twice; the import's budget (MAX_PIXELS) applies to both."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.png").write_bytes(_png_header(*size))
    feature = {"type": "Feature", "geometry": {"type": "Polygon", "coordinates": [[[0, 0], [9, 0], [9, 9], [0, 0]]]},
               "properties": {}}
    (tmp_path / "src" / "a.geojson").write_text(json.dumps({"type": "FeatureCollection", "features": [feature]}))
    _refused(tmp_path, "geojson", tmp_path / "src", r"a\.geojson: features\[0\]: a\.png .*more than the "
             r"89,478,485 .*allowed")


# ---- polygons ---------------------------------------------------------------------------------

def _star(n: int) -> list[float]:
    a = np.arange(n) * 2 * np.pi * (n // 2) / n
    return [float(c) for xy in np.c_[np.cos(a), np.sin(a)] * 9 + 10 for c in xy]


@pytest.mark.parametrize(("polygon", "message"), [
    ([1, 1, 30, 15, 1, 1], r"encloses no area"),  # two points
    ([1, 1, 10, 5, 19, 9, 28, 13], r"encloses no area"),  # on one line
    ([1, 1, 5, 5, 1, 1, 5, 5], r"encloses no area"),  # back and forth
    (_star(301), r"crosses itself and has 301 vertices; outlines of more than 200 vertices are not repaired"),
    ([50, 30, 60, 30, 60, 40], r"\(50, 30\)–\(60, 40\) lies wholly outside the 40×20 photo 'p1\.png'"),
    ([-1e9, -1e9, -1e9 + 5, -1e9, -1e9, -1e9 + 5], r".* lies wholly outside"),
    ([0, 0, 1e300, 0, 0, 1e300], r"a coordinate is beyond ±1e\+09 pixels"),
])
def test_a_polygon_without_area_too_costly_to_repair_or_off_the_photo_is_one_error(tmp_path, polygon, message):
    _coco(tmp_path, segmentation=[polygon])
    _refused(tmp_path, "coco", tmp_path / "src", r"annotations\.json: annotations\[0\]\.segmentation(\[0\])?: "
             r"(the outline )?" + message)


def test_a_small_crossing_polygon_is_still_repaired(tmp_path):
    _coco(tmp_path, segmentation=[[0, 0, 10, 10, 10, 0, 0, 10]])  # a bow tie: two triangles
    assert convert("coco", tmp_path / "src", tmp_path / "ds")["wounds"] == 1
    labels = np.array(Image.open(tmp_path / "ds" / "masks" / "p1.png"))
    assert labels[5, 1] == labels[5, 8] == 1 and labels[1, 5] == labels[8, 5] == 0


# ---- one error, not a traceback ---------------------------------------------------------------

def _geojson(tmp_path, text: str) -> None:
    _photos(tmp_path / "src")
    (tmp_path / "src" / "p1.geojson").write_text(text)


_FEATURE = ('{"type": "FeatureCollection", "features": [{"type": "Feature", "properties": {}, "geometry": '
            '{"type": "Polygon", "coordinates": [[[0, 0], [X, 0], [10, 10], [0, 0]]]}}]}')


@pytest.mark.parametrize(("value", "message"), [("NaN", "NaN is not a JSON number"),
                                                ("Infinity", "Infinity is not a JSON number"),
                                                ("-Infinity", "-Infinity is not a JSON number"),
                                                ("1e999", "1e999 is too large a number")])
def test_geojson_with_nan_or_infinity_is_one_error(tmp_path, value, message):
    _geojson(tmp_path, _FEATURE.replace("X", value))
    _refused(tmp_path, "geojson", tmp_path / "src", r"p1\.geojson: not a readable JSON file \(" + message)


@pytest.mark.parametrize("fmt", ["coco", "geojson", "labelstudio"])
def test_json_nested_too_deeply_is_one_error(tmp_path, fmt):
    name = {"coco": "annotations.json", "geojson": "p1.geojson", "labelstudio": "result.json"}[fmt]
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / name).write_text("[" * 100_000 + "]" * 100_000)
    _refused(tmp_path, fmt, tmp_path / "src", "not a readable JSON file \\(nested too deeply\\)")


@pytest.mark.parametrize(("annotation", "message"), [
    ({"result": 5}, r"\[0\]\.annotations\[0\]\.result: must be a list of results, got int"),
    ({"result": {"type": "polygonlabels"}}, r"\[0\]\.annotations\[0\]\.result: must be a list of results, got dict"),
    (None, r"\[0\]\.annotations: must be a list, got int"),
])
def test_a_label_studio_result_that_is_not_a_list_is_one_error(tmp_path, annotation, message):
    _photos(tmp_path / "src")
    task = {"data": {"image": "p1.png"}, "annotations": 7 if annotation is None else [annotation]}
    (tmp_path / "src" / "t.json").write_text(json.dumps([task]))
    _refused(tmp_path, "labelstudio", tmp_path / "src" / "t.json", r"t\.json: " + message)


@pytest.mark.parametrize(("category", "message"), [(7, r"category_id 7 is not in categories"),
                                                   (None, r"missing field 'category_id'")])
def test_a_coco_category_missing_from_categories_is_one_error(tmp_path, category, message):
    _coco(tmp_path, category_id=category)
    if category is None:
        doc = json.loads((tmp_path / "src" / "annotations.json").read_text())
        del doc["annotations"][0]["category_id"]
        (tmp_path / "src" / "annotations.json").write_text(json.dumps(doc))
    _refused(tmp_path, "coco", tmp_path / "src", r"annotations\.json: annotations\[0\]: " + message)


def test_convert_does_not_follow_a_linked_folder_inside_the_images_folder(tmp_path):
    _photos(tmp_path / "outside", names=("p1.png",))
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "sub").symlink_to(tmp_path / "outside")
    _coco(tmp_path, images=[{"id": 1, "file_name": "sub/p1.png", "width": 40, "height": 20}])
    (tmp_path / "src" / "p1.png").unlink()
    _refused(tmp_path, "coco", tmp_path / "src", r"images\[0\]: .*images/sub: is a symbolic link; links are never "
             "followed", images=tmp_path / "images")


def test_a_linked_photo_is_refused_before_its_header_is_read(tmp_path):
    """The photo's size used to be read through the link (a file outside), then the copy refused it."""
    _coco(tmp_path)
    Image.fromarray(np.zeros((30, 30, 3), np.uint8)).save(tmp_path / "outside.png")
    (tmp_path / "src" / "p1.png").unlink()
    (tmp_path / "src" / "p1.png").symlink_to(tmp_path / "outside.png")
    _refused(tmp_path, "coco", tmp_path / "src", r"images\[0\]: .*src/p1\.png: is a symbolic link; links are never "
             r"followed \(replace it with a copy of the file\)")


def test_an_annotation_file_over_the_file_budget_is_refused_before_it_is_read(tmp_path, monkeypatch):
    monkeypatch.setattr(convert_module, "MAX_FILE_BYTES", 100)
    _coco(tmp_path)
    _refused(tmp_path, "coco", tmp_path / "src", r"annotations\.json: [0-9]+ bytes, more than the 100 allowed")
    _cvat(tmp_path, _mask("4, 4" + ", 0" * 40))
    _refused(tmp_path, "cvat", tmp_path / "src" / "a.xml", r"a\.xml: [0-9]+ bytes, more than the 100 allowed")


@pytest.mark.parametrize("index", [65_536, 2 ** 31])
def test_a_wound_index_a_label_map_cannot_hold_is_one_error(tmp_path, index):
    """Found by test_fuzz_convert: an index over 65,535 overflowed the 16-bit label map (OverflowError)."""
    _geojson(tmp_path, _FEATURE.replace("X", "10").replace('"properties": {}', f'"properties": {{"wound_index": {index}}}'))
    _refused(tmp_path, "geojson", tmp_path / "src", rf"p1\.geojson: features\[0\]: wound index {index:,} is larger "
             r"than 65,535, the most a label map")


# ---- bounded work: each outline within its bounding box (polygons) or band of columns/rows (RLE) --

def test_each_outline_is_decoded_within_its_box_or_band_not_the_whole_photo(tmp_path, monkeypatch):
    """Every outline used to be decoded to a mask of the whole photo (N outlines: N photos of work)."""
    decoded: list[tuple[int, int]] = []
    for name in ("_runs", "rasterize_window"):
        real = getattr(convert_module, name)
        monkeypatch.setattr(convert_module, name, lambda *a, _real=real, **k: decoded.append(
            (out := _real(*a, **k))[0].shape) or out)
    _coco(tmp_path, extra={"size": [20, 40], "counts": [20 * 30, 20 * 2, 20 * 8]})  # a square, then columns 30–31
    assert convert("coco", tmp_path / "src", tmp_path / "ds")["wounds"] == 2
    assert decoded == [(10, 10), (20, 2)]  # not (20, 40) twice
    labels = np.array(Image.open(tmp_path / "ds" / "masks" / "p1.png"))
    assert (labels[:10, :10] == 1).all() and (labels == 1).sum() == 100
    assert (labels[:, 30:32] == 2).all() and (labels == 2).sum() == 40


def _flat_runs(flat: np.ndarray) -> list[int]:
    """Run lengths (off, on, off, …) of a flat bool array."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], flat.astype(np.int8), [0]])))
    bounds = np.concatenate([[0], edges, [flat.size]])
    return [int(c) for c in np.diff(bounds)] if flat.size else [0]


@pytest.mark.parametrize("column_major", [True, False])
def test_the_band_decoder_gives_the_whole_mask_back(column_major):
    rng = np.random.default_rng(1)
    for shape in [(1, 1), (5, 7), (20, 40), (9, 1)]:
        for density in (0.0, 0.02, 0.5, 1.0):
            mask = rng.random(shape) < density
            counts = _flat_runs(mask.ravel(order="F" if column_major else "C"))
            band, top, left = convert_module._runs(counts, shape, column_major)
            back = np.zeros(shape, bool)
            back[top:top + band.shape[0], left:left + band.shape[1]] = band
            assert (back == mask).all(), (shape, density)
            assert band.size <= mask.size


def test_a_brush_is_read_chunk_by_chunk_into_its_band_as_the_full_decode_reads_it():
    """A brush used to be expanded to all w×h×4 words (4 bytes a pixel) however few it paints; now
    its runs of alpha ≥ 128 are read from the chunks, repeated runs crossing pixels included."""
    rng = np.random.default_rng(2)
    for w, h in [(1, 1), (7, 5), (40, 20)]:
        for _ in range(20):
            lengths = rng.integers(1, 40, size=4 * w * h)
            words = np.repeat(rng.choice([0, 7, 127, 128, 255], size=lengths.size), lengths)[:4 * w * h]
            words = np.pad(words, (0, 4 * w * h - words.size)).astype(np.uint32)
            band, top, left = convert_module._brush_mask(_brush_rle(words), w, h, "x")
            back = np.zeros((h, w), bool)
            back[top:top + band.shape[0], left:left + band.shape[1]] = band
            assert (back == (words.reshape(h, w, 4)[:, :, 3] >= 128)).all()
