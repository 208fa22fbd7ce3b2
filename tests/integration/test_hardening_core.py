"""Issue 49, core/: ``core.segment`` reads photos exactly as import does (EXIF upright, 16-bit scaled, the
pixel budget), one photo at a time, and a bad photo is one error that leaves nothing behind."""
from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageOps

from annotations.dataset import import_dataset
from annotations.workspace import Workspace
from core import segment
from core.segmentation.defaults import THRESHOLD

_ORIENTATION = 0x0112
#: the stored pixels of an upright photo that EXIF ``orientation`` turns upright again
_STORE = {3: Image.Transpose.ROTATE_180, 6: Image.Transpose.ROTATE_90}


class BrightSegmenter:
    """A stand-in segmenter: a pixel's wound probability is its brightness (tests the photo reading around it)."""

    source = "bright stand-in"

    def probability(self, image: Image.Image) -> np.ndarray:
        return np.asarray(image.convert("L"), np.float32) / 255.0


@pytest.fixture
def bright(monkeypatch) -> None:
    monkeypatch.setattr(segment, "resolve_model", lambda *args: (BrightSegmenter(), None))


def _upright(width: int = 96, height: int = 64) -> np.ndarray:
    """A dark photo with one bright disc near its top-left corner (so any turn moves the wound)."""
    yy, xx = np.mgrid[:height, :width]
    img = np.full((height, width), 40, np.uint8)
    img[(xx - 20) ** 2 + (yy - 18) ** 2 <= 11 ** 2] = 220
    return img


def _run(images: Path, out: Path) -> int:
    return segment.main(["--images", str(images), "--out", str(out), "--device", "cpu"])


@pytest.mark.parametrize("orientation", [3, 6])
def test_an_exif_turned_photo_gets_the_mask_of_the_upright_photo_and_imports(tmp_path, bright, orientation):
    upright = Image.fromarray(_upright()).convert("RGB")
    stored = upright.transpose(_STORE[orientation])
    exif = Image.Exif()
    exif[_ORIENTATION] = orientation
    images = tmp_path / "images"
    images.mkdir()
    stored.save(images / "turned.png", exif=exif.tobytes())
    with Image.open(images / "turned.png") as im:  # the test's premise: EXIF turns the stored pixels upright
        assert np.array_equal(np.asarray(ImageOps.exif_transpose(im)), np.asarray(upright))
    out = tmp_path / "out"
    assert _run(images, out) == 0
    mask = np.asarray(Image.open(out / "masks" / "turned.png"))
    expected = segment.label_map(BrightSegmenter().probability(upright), THRESHOLD)
    assert mask.shape == (64, 96) and expected.max() == 1 and np.array_equal(mask, expected)
    (out / "images").mkdir()
    (images / "turned.png").rename(out / "images" / "turned.png")
    ws = Workspace(tmp_path / "ws")
    import_dataset(ws, out)  # the tool's own mask is accepted as it is
    assert np.array_equal(ws.load_mask("turned") > 0, mask > 0)
    assert ws.load_image("turned").size == (96, 64)


def test_a_16_bit_photo_gets_the_mask_of_its_8_bit_version(tmp_path, bright):
    eight = _upright()
    images = tmp_path / "images"
    images.mkdir()
    Image.fromarray(eight).save(images / "eight.png")
    Image.fromarray(eight.astype(np.uint16) * 257).save(images / "sixteen.png")
    with Image.open(images / "sixteen.png") as im:
        assert im.mode.startswith("I")  # really a 16-bit PNG
    assert _run(images, tmp_path / "out") == 0
    masks = {n: np.asarray(Image.open(tmp_path / "out" / "masks" / f"{n}.png")) for n in ("eight", "sixteen")}
    assert masks["eight"].max() == 1 and np.array_equal(masks["sixteen"], masks["eight"])


def _png_header_only(width: int, height: int) -> bytes:
    """A tiny PNG (a few hundred bytes) that declares ``width`` × ``height`` 8-bit grey pixels."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 4096))
            + chunk(b"IEND", b""))


@pytest.mark.parametrize("side", [10_000, 30_000])
def test_a_decompression_bomb_is_one_error_naming_it_and_nothing_is_written(tmp_path, capsys, bright, side):
    images = tmp_path / "images"
    images.mkdir()
    Image.fromarray(_upright()).save(images / "a-fine.png")  # segmented first, then rolled back
    (images / "bomb.png").write_bytes(_png_header_only(side, side))
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_:
        _run(images, out)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err
    assert f"bomb.png: {side * side:,} pixels, more than the" in err and "decompression bomb" in err
    assert not out.exists()


def test_a_bad_photo_after_good_ones_leaves_an_empty_output_folder_empty(tmp_path, capsys, bright):
    images = tmp_path / "images"
    images.mkdir()
    for name in ("a", "b"):
        Image.fromarray(_upright()).save(images / f"{name}.png")
    (images / "c.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(SystemExit) as exit_:
        _run(images, out)
    assert exit_.value.code == 2 and "c.png: cannot be read as a PNG image" in capsys.readouterr().err
    assert list(out.iterdir()) == []
