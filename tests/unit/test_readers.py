"""Readers: photos upright and stripped, 8-bit conversions, masks thresholded with a minimum wound area,
typed CSV metadata, safe folders — what is accepted, and how (the rejections are in test_bad_inputs.py)."""
from __future__ import annotations

import io
import json
import os
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageCms, ImageFilter, ImageOps, PngImagePlugin

from annotations.infra.workspace import Workspace
from annotations.io.dataset import export_dataset, import_dataset
from annotations.io.readers import (
    DatasetError,
    DatasetFolder,
    column_schema,
    labels_and_geometry,
    mask_to_labels,
    parse_int,
    parse_number,
    read_csv,
    read_photo,
    valid_id,
    wound_geometry,
)

RNG = np.random.default_rng(0)
PHOTO = np.asarray(Image.fromarray(np.clip(RNG.normal(120, 60, (40, 60, 3)), 0, 255).astype(np.uint8))
                   .filter(ImageFilter.GaussianBlur(2)))  # 60 wide, 40 high; smooth, as skin is
IDENTIFYING = (b"SERIAL-4711", b"Dr. Smith", b"2024:05:06", b"John Doe", b"Clinic X")


def _exif(orientation: int = 1) -> Image.Exif:
    exif = Image.Exif()
    exif[0x0112] = orientation
    exif[0x010F] = "PhoneMaker"
    exif[0x0132] = "2024:05:06 10:11:12"  # DateTime
    exif[0xA431] = "SERIAL-4711"  # BodySerialNumber
    exif[0x013B] = "Dr. Smith"  # Artist
    gps = exif.get_ifd(0x8825)
    gps[1], gps[2] = "N", (48.0, 8.0, 30.0)
    return exif


def _xmp() -> bytes:
    return (b'<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">'
            b'<rdf:Description xmlns:dc="http://purl.org/dc/elements/1.1/" dc:creator="John Doe"/>'
            b"</rdf:RDF></x:xmpmeta>")


def _dataset(root: Path, photo: str = "a.jpg", orientation: int = 1, **save) -> Path:
    """A one-photo dataset whose photo carries EXIF (GPS, date, serial, artist), XMP and a comment."""
    (root / "images").mkdir(parents=True)
    Image.fromarray(PHOTO).save(root / "images" / photo, exif=_exif(orientation), quality=92,
                                comment=b"Clinic X", xmp=_xmp(), **save)
    return root


def _stored(ws: Workspace, image_id: str = "a") -> bytes:
    return ws.image_path(image_id).read_bytes()


# ---- photos -----------------------------------------------------------------------------------

@pytest.mark.parametrize("orientation", range(1, 9))
def test_photo_is_stored_upright_and_orientation_recorded(orientation, tmp_path):
    ws = Workspace(tmp_path / "ws")
    import_dataset(ws, _dataset(tmp_path / "d", orientation=orientation))
    row = ws.store.image("a")
    expected = ImageOps.exif_transpose(Image.open(tmp_path / "d" / "images" / "a.jpg"))
    stored = ws.load_image("a")
    assert (row["width"], row["height"]) == stored.size == expected.size
    assert Image.open(ws.image_path("a")).getexif().get(0x0112, 1) == 1
    assert np.abs(np.asarray(stored, float) - np.asarray(expected.convert("RGB"), float)).mean() < 3
    assert row["metadata"] == ({} if orientation == 1 else {"exif_orientation": orientation})


def test_rotated_jpeg_mask_checked_against_the_upright_size(tmp_path):
    d = _dataset(tmp_path / "d", orientation=6)  # stored 60×40, shown (and outlined) 40×60
    (d / "masks").mkdir()
    mask = np.zeros((60, 40), np.uint8)
    mask[5:20, 5:15] = 1
    Image.fromarray(mask).save(d / "masks" / "a.png")
    ws = Workspace(tmp_path / "ws")
    import_dataset(ws, d)
    assert ws.load_mask("a").shape == (60, 40) == np.asarray(ws.load_image("a")).shape[:2]
    assert ws.store.wounds("a")[0]["bbox"] == [5, 5, 15, 20]


@pytest.mark.parametrize("suffix", [".jpg", ".png", ".tif"])
def test_identifying_metadata_is_stripped(suffix, tmp_path):
    d = tmp_path / "d"
    (d / "images").mkdir(parents=True)
    im = Image.fromarray(PHOTO)
    if suffix == ".png":
        info = PngImagePlugin.PngInfo()
        info.add_text("Author", "Dr. Smith")
        info.add_itxt("Comment", "John Doe", zip=True)
        im.save(d / "images" / "a.png", pnginfo=info, exif=_exif())
    elif suffix == ".tif":
        im.save(d / "images" / "a.tif", exif=_exif(), tiffinfo={270: "John Doe", 315: "Dr. Smith"})
    else:
        im.save(d / "images" / "a.jpg", exif=_exif(), comment=b"Clinic X", xmp=_xmp())
    raw = (d / "images" / f"a{suffix}").read_bytes()
    assert any(s in raw for s in IDENTIFYING)
    ws = Workspace(tmp_path / "ws")
    import_dataset(ws, d)
    data = _stored(ws)
    assert not any(s in data for s in IDENTIFYING)
    stored = Image.open(io.BytesIO(data))
    assert not {k for k in stored.getexif() if k not in range(256, 342)}  # only the TIFF layout tags
    assert np.array_equal(np.asarray(stored.convert("RGB")), np.asarray(Image.open(io.BytesIO(raw)).convert("RGB")))


def test_upright_jpeg_is_stripped_losslessly_and_keeps_its_icc_profile(tmp_path):
    icc = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    d = _dataset(tmp_path / "d", icc_profile=icc)
    ws = Workspace(tmp_path / "ws")
    import_dataset(ws, d)
    source, stored = Image.open(d / "images" / "a.jpg"), Image.open(ws.image_path("a"))
    assert np.array_equal(np.asarray(source), np.asarray(stored))  # no re-encoding
    assert stored.info.get("icc_profile") == icc and stored.quantization == source.quantization


def test_keep_metadata_keeps_it(tmp_path):
    ws = Workspace(tmp_path / "ws")
    import_dataset(ws, _dataset(tmp_path / "d"), keep_metadata=True)
    assert _stored(ws) == (tmp_path / "d" / "images" / "a.jpg").read_bytes()
    ws2 = Workspace(tmp_path / "ws2")
    import_dataset(ws2, _dataset(tmp_path / "d2", orientation=8), keep_metadata=True)
    stored = Image.open(ws2.image_path("a"))
    assert stored.getexif()[0xA431] == "SERIAL-4711" and stored.getexif()[0x0112] == 1
    assert stored.info["comment"] == b"Clinic X" and b"John Doe" in stored.info["xmp"]
    assert ws2.load_image("a").size == (40, 60)


def test_reimport_of_a_stripped_photo_is_idempotent(tmp_path):
    d = _dataset(tmp_path / "d", orientation=3)
    ws = Workspace(tmp_path / "ws")
    import_dataset(ws, d)
    first, mtime = _stored(ws), ws.image_path("a").stat().st_mtime_ns
    import_dataset(ws, d)
    assert _stored(ws) == first and ws.image_path("a").stat().st_mtime_ns == mtime
    export_dataset(ws, tmp_path / "out")
    again = Workspace(tmp_path / "ws2")
    import_dataset(again, tmp_path / "out")
    assert _stored(again) == first and again.store.image("a")["metadata"] == {"exif_orientation": 3}


def test_sixteen_bit_photo_is_scaled_not_saturated(tmp_path):
    d = tmp_path / "d"
    (d / "images").mkdir(parents=True)
    ramp = np.linspace(0, 65535, 40 * 60).reshape(40, 60).astype(np.uint16)
    Image.fromarray(ramp).save(d / "images" / "a.png")
    Image.fromarray(ramp).save(d / "images" / "b.tif")
    ws = Workspace(tmp_path / "ws")
    import_dataset(ws, d)
    for image_id in ("a", "b"):
        grey = np.asarray(ws.load_image(image_id))[..., 0].astype(int)
        assert np.abs(grey - np.rint(ramp / 257)).max() <= 1
        assert grey.min() == 0 and grey.max() == 255 and abs(grey.mean() - 127.5) < 1


def test_sixteen_bit_rgb_png_keeps_its_colours(tmp_path):
    d = tmp_path / "d"
    (d / "images").mkdir(parents=True)
    rgb16 = np.linspace(0, 65535, 8 * 8 * 3).reshape(8, 8, 3).astype(">u2")
    raw = b"".join(b"\0" + row.tobytes() for row in rgb16)

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    (d / "images" / "a.png").write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 8, 8, 16, 2, 0, 0, 0))
                                        + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
    photo = read_photo(DatasetFolder(d), d / "images" / "a.png")
    stored = np.asarray(Image.open(io.BytesIO(photo.data)), int)
    assert np.abs(stored - rgb16.astype(int) / 257).max() <= 1.5


@pytest.mark.parametrize("mode", ["P", "LA", "RGBA", "CMYK", "1", "L"])
def test_palette_alpha_cmyk_and_grey_photos_convert(mode, tmp_path):
    d = tmp_path / "d"
    (d / "images").mkdir(parents=True)
    suffix = ".jpg" if mode == "CMYK" else ".png"
    source = Image.fromarray(PHOTO).convert(mode)
    source.save(d / "images" / f"a{suffix}")
    ws = Workspace(tmp_path / "ws")
    import_dataset(ws, d)
    stored = Image.open(ws.image_path("a"))
    assert stored.mode in ("RGB", "L")
    expected = Image.open(d / "images" / f"a{suffix}").convert("RGB")
    tolerance = 8 if mode == "CMYK" else 0  # JPEG re-encoding
    assert np.abs(np.asarray(ws.load_image("a"), int) - np.asarray(expected, int)).mean() <= tolerance


def test_transparent_pixels_are_flattened_on_white(tmp_path):
    folder = tmp_path / "d"
    (folder / "images").mkdir(parents=True)
    rgba = np.zeros((4, 4, 4), np.uint8)
    rgba[:2, :, :] = (200, 10, 10, 255)
    Image.fromarray(rgba).save(folder / "images" / "a.png")
    photo = read_photo(DatasetFolder(folder), folder / "images" / "a.png")
    pixels = np.asarray(Image.open(io.BytesIO(photo.data)))
    assert pixels[0, 0].tolist() == [200, 10, 10] and pixels[3, 3].tolist() == [255, 255, 255]


# ---- masks ------------------------------------------------------------------------------------

def _discs(shape=(120, 160), centres=((30, 30), (30, 110), (90, 70)), radius=15) -> np.ndarray:
    yy, xx = np.mgrid[: shape[0], : shape[1]]
    mask = np.zeros(shape, bool)
    for cy, cx in centres:
        mask |= (yy - cy) ** 2 + (xx - cx) ** 2 <= radius**2
    return mask


def test_anti_aliased_binary_mask_is_thresholded():
    soft = np.asarray(Image.fromarray(_discs().astype(np.uint8) * 255).filter(ImageFilter.GaussianBlur(2)))
    assert len(np.unique(soft)) > 50  # formerly: one "wound" per grey value
    mask = labels_and_geometry(soft, "auto", 25)
    assert sorted(mask.geometry) == [1, 2, 3] and not mask.dropped
    assert all(abs(area - np.pi * 15**2) < 60 for area, _ in mask.geometry.values())


def test_jpeg_noise_and_specks_are_dropped_and_reported(tmp_path):
    noisy = _discs().astype(np.uint8) * 255
    buf = io.BytesIO()
    Image.fromarray(noisy).save(buf, format="JPEG", quality=70)
    noisy = np.asarray(Image.open(buf)).copy()
    noisy[100:102, 5:7] = 255  # a 4-pixel speck
    assert len(np.unique(noisy)) > 20
    mask = labels_and_geometry(noisy, "auto", 25)
    assert len(mask.geometry) == 3
    assert [(d["area"], d["bbox"]) for d in mask.dropped] == [(4, [5, 100, 7, 102])]


def test_label_map_keeps_indices_and_drops_small_labels():
    labels = np.zeros((50, 50), np.uint16)
    labels[5:15, 5:15] = 3
    labels[20:40, 20:40] = 7
    labels[45, 45] = 9
    mask = labels_and_geometry(labels, "auto", 25)
    assert sorted(mask.geometry) == [3, 7] and mask.geometry[3] == (100, [5, 5, 15, 15])
    assert mask.dropped == [{"file": "mask", "area": 1, "bbox": [45, 45, 46, 46], "wound_index": 9}]
    assert 9 not in mask.labels


def test_minimum_wound_area_is_the_workspace_setting(tmp_path):
    d = tmp_path / "d"
    (d / "images").mkdir(parents=True)
    (d / "masks").mkdir()
    Image.fromarray(PHOTO).save(d / "images" / "a.png")
    mask = np.zeros((40, 60), np.uint8)
    mask[2:8, 2:8] = 255  # 36 px
    mask[20:30, 20:40] = 255  # 200 px
    Image.fromarray(mask).save(d / "masks" / "a.png")
    ws = Workspace(tmp_path / "ws")
    ws.store.set_meta("min_wound_area", 50)
    summary = import_dataset(ws, d)
    assert summary["wounds"] == 1 and summary["dropped_wounds"] == [
        {"file": "masks/a.png", "area": 36, "bbox": [2, 2, 8, 8]}]
    assert ws.store.wounds("a")[0]["area"] == 200 and ws.load_mask("a").max() == 1


def test_more_than_255_wounds_round_trip_in_a_32_bit_label_map(tmp_path):
    d = tmp_path / "d"
    (d / "images").mkdir(parents=True)
    (d / "masks").mkdir()
    Image.fromarray(np.zeros((180, 204, 3), np.uint8)).save(d / "images" / "a.png")
    grid = np.zeros((180, 204), np.uint8)
    for y in range(0, 180, 6):
        for x in range(0, 204, 6):
            grid[y:y + 5, x:x + 5] = 255  # 5×5 squares, one pixel apart
    Image.fromarray(grid).save(d / "masks" / "a.png")
    ws = Workspace(tmp_path / "ws")
    summary = import_dataset(ws, d)
    assert summary["wounds"] == 30 * 34 == ws.load_mask("a").max()
    assert ws.load_mask("a").dtype == np.int32


@pytest.mark.parametrize("seed", range(5))
def test_vectorised_geometry_matches_the_per_wound_scan(seed):
    rng = np.random.default_rng(seed)
    binary = rng.random((60, 80)) > 0.6
    for array, fmt in ((binary.astype(np.uint8), "auto"), (rng.integers(0, 12, (60, 80)), "label")):
        mask = labels_and_geometry(array, fmt, 3)
        for index, (area, bbox) in mask.geometry.items():
            assert (area, bbox) == wound_geometry(mask.labels, index)
        assert set(np.unique(mask.labels)) - {0} == set(mask.geometry)
        assert all(d["area"] < 3 for d in mask.dropped)


def test_mask_to_labels_keeps_its_contract():
    rgb = np.zeros((10, 10, 3), np.uint8)
    rgb[1:3, 1:3] = 255
    rgb[6:9, 5:9] = 255
    assert sorted(np.unique(mask_to_labels(rgb))) == [0, 1, 2]
    assert mask_to_labels(rgb).dtype == np.int32


# ---- CSV --------------------------------------------------------------------------------------

def _csv(tmp_path: Path, text: str | bytes, columns: dict | None = None) -> list:
    folder = tmp_path / "csvd"
    folder.mkdir(exist_ok=True)
    path = folder / "t.csv"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return read_csv(DatasetFolder(folder), path, ("id",), columns)


@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"])
def test_any_newline_convention(newline, tmp_path):
    rows = _csv(tmp_path, newline.join(["id,note", "a,x", "", 'b,"two' + newline + 'lines"']) + newline)
    assert [(line, dict(r)) for line, r in rows] == [(2, {"id": "a", "note": "x"}),
                                                      (4, {"id": "b", "note": "two" + newline + "lines"})]


def test_types_are_inferred_only_when_every_value_parses(tmp_path):
    rows = _csv(tmp_path, "id,zip,code,age,score,flag,answer,mixed,big\n"
                          "a,01234,007,12,1.5,true,yes,5,123456789012345678\n"
                          "b,99999,8,30,2,False,no,x,1\n")
    first, second = rows[0][1].typed, rows[1][1].typed
    assert first == {"id": "a", "zip": "01234", "code": "007", "age": 12, "score": 1.5, "flag": True,
                     "answer": "yes", "mixed": "5", "big": "123456789012345678"}
    assert second["zip"] == "99999" and second["score"] == 2.0 and second["flag"] is False


def test_exponent_like_text_is_text(tmp_path):
    """'e5' fits the float pattern's optional parts but is no number (an annotator named e0 once
    crashed the type inference with a ValueError)."""
    rows = _csv(tmp_path, "id,annotator,x\na,e0,1e3\nb,E5,2\n")
    assert [r.typed for _, r in rows] == [{"id": "a", "annotator": "e0", "x": 1000.0},
                                         {"id": "b", "annotator": "E5", "x": 2.0}]


def test_declared_types_win(tmp_path):
    rows = _csv(tmp_path, "id,answer,zip,n\na,yes,01234,7\nb,0,5,8\n",
                {"answer": "bool", "zip": "int", "n": "str"})
    assert [r.typed for _, r in rows] == [{"id": "a", "answer": True, "zip": 1234, "n": "7"},
                                         {"id": "b", "answer": False, "zip": 5, "n": "8"}]


def test_metadata_types_survive_a_round_trip(tmp_path):
    d = _dataset(tmp_path / "d", photo="a.png")
    Image.fromarray(PHOTO).save(d / "images" / "b.png")
    (d / "images.csv").write_text("image_id,patient_id,room,consent,visit\na,p1,01234,true,3\nb,p2,12,false,4\n")
    (d / "patients.csv").write_text("patient_id,code,age\np1,007,40\np2,x9,51\n")
    (d / "dataset.json").write_text(json.dumps({"columns": {"room": "str"}, "synthetic": "false"}))
    ws = Workspace(tmp_path / "ws")
    import_dataset(ws, d)
    assert ws.is_synthetic is False
    meta = {r["image_id"]: r["metadata"] for r in ws.store.images()}
    assert meta == {"a": {"room": "01234", "consent": True, "visit": 3},
                    "b": {"room": "12", "consent": False, "visit": 4}}
    assert ws.store.patients()[0]["metadata"] == {"code": "007", "age": 40}
    export_dataset(ws, tmp_path / "out")
    again = Workspace(tmp_path / "ws2")
    import_dataset(again, tmp_path / "out")
    assert [r["metadata"] for r in again.store.images()] == [r["metadata"] for r in ws.store.images()]
    assert [r["metadata"] for r in again.store.patients()] == [r["metadata"] for r in ws.store.patients()]


def test_column_schema_only_for_agreeing_columns():
    assert column_schema([[{"a": 1, "b": "x", "c": True, "d": 1}], [{"a": 2, "b": "y", "d": 2.5, "e": "s"},
                                                                    {"e": 3}]]) == {
        "a": "int", "b": "str", "c": "bool", "d": "float"}


# ---- folders ----------------------------------------------------------------------------------

def test_hard_links_inside_the_dataset_are_read(tmp_path):
    d = _dataset(tmp_path / "d", photo="a.png")
    os.link(d / "images" / "a.png", d / "images" / "b.png")
    ws = Workspace(tmp_path / "ws")
    assert import_dataset(ws, d)["images"] == 2


def test_hidden_files_and_the_dataset_path_through_a_link_are_fine(tmp_path):
    d = _dataset(tmp_path / "d", photo="a.png")
    (d / "images" / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    (tmp_path / "link").symlink_to(d)  # the folder given may itself be reached through a link
    ws = Workspace(tmp_path / "ws")
    assert import_dataset(ws, tmp_path / "link")["images"] == 1


@pytest.mark.parametrize("options", [{}, {"progressive": True}, {"restart_marker_blocks": 2},
                                     {"progressive": True, "restart_marker_rows": 1}])
def test_jpeg_strip_is_lossless_for_progressive_and_restart_markers(options, tmp_path):
    d = tmp_path / "d"
    (d / "images").mkdir(parents=True)
    buf = io.BytesIO()
    Image.fromarray(PHOTO).save(buf, format="JPEG", exif=_exif(), comment=b"Clinic X", **options)
    (d / "images" / "a.jpg").write_bytes(buf.getvalue() + b"John Doe")  # a vendor trailer after the image
    photo = read_photo(DatasetFolder(d), d / "images" / "a.jpg")
    assert not any(s in photo.data for s in IDENTIFYING)
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(photo.data))), np.asarray(Image.open(buf)))


def test_a_value_typed_in_the_app_follows_the_import_rules():
    from annotations.io.readers import typed_value

    assert typed_value("007") == "007" and typed_value("01234") == "01234"  # leading zeros stay text
    assert typed_value("3.5") == 3.5 and typed_value("12") == 12 and typed_value("true") is True
    assert typed_value("3", previous=2.0) == 3.0 and isinstance(typed_value("3", previous=2.0), float)
    assert typed_value("yes", previous=False) is True and typed_value("12", previous="a") == "12"
    assert typed_value("unknown", previous=3) == "unknown" and typed_value("  ") is None


def test_ids_and_numbers_are_read_exactly():
    assert valid_id("ph7") and not valid_id("ph7\n") and not valid_id("ph7\n.png")  # "$" matched before "\n"
    assert parse_int("12", "x") == 12 and parse_number("1.25e3", "x") == 1250.0
    for text in ("\u0661\u0662", "1_000", "+\uff11", "1.0", " 1"):
        with pytest.raises(DatasetError, match="is not a whole number"):
            parse_int(text, "x")
    for text in ("nan", "inf", "1_0.5", "\u0661.5", "1e999"):
        with pytest.raises(DatasetError, match="is not a finite number"):
            parse_number(text, "x")


def test_ambiguous_masks_are_refused_and_a_declared_label_map_is_read_whole():
    labels = np.zeros((40, 40), np.uint16)
    labels[2:12, 2:12] = 1
    labels[20:30, 2:12] = 2
    labels[:, 30:] = 300  # the largest label covers most wound pixels: "auto" would read it as binary
    with pytest.raises(DatasetError, match=r"^m\.png: ambiguous mask: values found 0, 1, 2, 300, with regions "
                                           r"of value\(s\) 1, 2 besides 300"):
        labels_and_geometry(labels, "auto", 25, "m.png")
    mask = labels_and_geometry(labels, "label", 25, "m.png")
    assert sorted(mask.geometry) == [1, 2, 300] and not mask.dropped
    binary = (labels > 0).astype(np.uint8) * 255  # the same wounds drawn as a binary mask
    assert sorted(labels_and_geometry(binary, "auto", 25).geometry) == [1, 2, 3]


def test_an_alpha_channel_that_disagrees_with_the_colour_is_refused(tmp_path):
    d = tmp_path / "d"
    (d / "images").mkdir(parents=True)
    (d / "masks").mkdir()
    Image.fromarray(PHOTO).save(d / "images" / "a.png")
    rgba = np.zeros((40, 60, 4), np.uint8)
    rgba[5:15, 5:15] = (255, 0, 0, 255)  # a red wound, opaque
    rgba[20:30, 30:50, 3] = 255  # a black, opaque region: drawn, but in no colour
    Image.fromarray(rgba).save(d / "masks" / "a.png")
    ws = Workspace(tmp_path / "ws")
    with pytest.raises(DatasetError, match=r"^masks/a\.png: colour \(values 0, 255\) and alpha channel \(values 0, "
                                           r"255\) mark different pixels"):
        import_dataset(ws, d)
    rgba[20:30, 30:50, 3] = 0  # transparent where nothing is drawn: the colour is the mask
    Image.fromarray(rgba).save(d / "masks" / "a.png")
    assert import_dataset(ws, d)["wounds"] == 1
