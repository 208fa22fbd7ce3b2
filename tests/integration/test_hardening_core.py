"""Issue 49, core/: ``core.segment`` reads photos exactly as import does (EXIF upright, 16-bit scaled, the
pixel budget), one photo at a time, and a bad photo is one error that leaves nothing behind; model folders and
segmenter checkpoints are self-contained, their sizes bounded and their tensors checked (one error each)."""
from __future__ import annotations

import json
import re
import struct
import zlib
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image, ImageOps
from safetensors import safe_open
from safetensors.torch import save_file

from annotations.infra.workspace import Workspace
from annotations.io.dataset import import_dataset
from annotations.io.readers import DatasetError
from core import segment
from core.runtime import write_model_folder
from core.segmentation.defaults import THRESHOLD
from core.segmentation.export import SharedSegmenter, load_shared_segmenter
from core.segmentation.model import Segmenter, SegmenterError, encoder, new_net
from core.vision import inference
from core.vision.inference import HEAD_FORMAT, TAIL_FORMAT, SharedHead, SharedTail, TrainedHead, shared_model
from core.vision.model_files import ModelFileError, read_config
from core.vision.triderm_config import TriDermConfig

_ORIENTATION = 0x0112
#: the stored pixels of an upright photo that EXIF ``orientation`` turns upright again
_STORE = {3: Image.Transpose.ROTATE_180, 6: Image.Transpose.ROTATE_90}


class BrightSegmenter:
    """A stand-in segmenter: a pixel's wound probability is its brightness (tests the photo reading around it)."""

    source = "bright stand-in"
    threshold = 0.5

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


# ---- model folders: self-contained, sizes bounded, tensors checked (core.vision.model_files) ----------------------

def _head_folder(path: Path, channels: int = 8) -> Path:
    """A small TriDerm-V head folder (8 channels, 4 dimensions) as ``core.export_model`` writes one."""
    cfg = TriDermConfig(dim=4, hidden=4)
    recipe = {k: v for k, v in asdict(cfg).items() if k != "backbone"}
    model = SharedHead(channels, 4, recipe, "efficientnet-lite0", None, "center-l2", {}, {}, model_format=HEAD_FORMAT)
    return write_model_folder(model, path, "# a test head\n")


def _edit_config(folder: Path, **changes: Any) -> None:
    config = json.loads((folder / "config.json").read_text())
    for key, value in changes.items():
        if value is _DROP:
            del config[key]
        else:
            config[key] = value
    (folder / "config.json").write_text(json.dumps(config))


_DROP = object()


@pytest.fixture
def backbones(monkeypatch) -> list[str]:
    """The backbone names the model loader asked for (none is built)."""
    asked: list[str] = []

    def record(name: str, **kwargs: Any) -> None:
        asked.append(name)
        raise RuntimeError("the test's backbone stand-in")

    monkeypatch.setattr(inference, "load_backbone", record)
    return asked


@pytest.mark.parametrize("spec", ["file:../outside.pt", "../outside.pt", "{outside}", "file:{outside}@stage6",
                                  "sub/../../outside.pt", "open_clip:ViT-B-16:../outside.pt", "linked.pt"])
def test_a_backbone_file_outside_the_model_folder_is_refused(tmp_path, backbones, spec):
    outside = tmp_path / "outside.pt"
    outside.write_bytes(b"a file the model folder must not name")
    folder = _head_folder(tmp_path / "model")
    (folder / "linked.pt").symlink_to(outside)
    _edit_config(folder, backbone=spec.format(outside=outside))
    with pytest.raises(ModelFileError, match=r"config\.json|model folder") as err:
        TrainedHead.from_folder(folder, "cpu")
    assert "outside the model folder" in str(err.value) or "is a link" in str(err.value)
    assert backbones == []


def test_a_backbone_file_inside_the_model_folder_is_loaded_from_there(tmp_path, backbones):
    folder = _head_folder(tmp_path / "model")
    (folder / "weights").mkdir()
    (folder / "weights" / "bb.pt").write_bytes(b"x")
    _edit_config(folder, backbone="weights/bb.pt@stage5")
    with pytest.raises(RuntimeError, match="stand-in"):
        TrainedHead.from_folder(folder, "cpu")
    assert backbones == [f"file:{(folder / 'weights' / 'bb.pt').resolve()}@stage5"]


@pytest.mark.parametrize("name", ["config.json", "model.safetensors"])
def test_a_model_folder_file_that_is_a_link_is_refused(tmp_path, name):
    folder = _head_folder(tmp_path / "model")
    (folder / name).rename(tmp_path / name)
    (folder / name).symlink_to(tmp_path / name)
    with pytest.raises(ModelFileError, match=f"'{name}' (is a link|resolves outside)"):
        shared_model(SharedHead, folder)


@pytest.mark.parametrize(("change", "says"), [
    ({"channels": 10 ** 13}, "channels 10000000000000 must be an integer from 1 to 8192"),
    ({"dim": 10 ** 13}, "dim 10000000000000 must be an integer from 1 to 8192"),
    ({"channels": "eight"}, "channels 'eight' must be an integer"),
    ({"recipe": {"dim": 4, "hidden": 10 ** 13}}, "(recipe): hidden 10000000000000 must be an integer"),
    ({"channels": 8192, "recipe": {"dim": 4096, "hidden": 8192}}, "parameters, more than the"),
    ({"recipe": "fast"}, "recipe 'fast' is not an object"),
    ({"dim": _DROP}, "missing 1 required positional argument: 'dim'"),
    ({"backbone": 7}, "backbone 7 is not a backbone name"),
])
def test_hostile_head_config_values_are_one_error_naming_the_field(tmp_path, change, says):
    folder = _head_folder(tmp_path / "model")
    _edit_config(folder, **change)
    with pytest.raises(ModelFileError, match=re.escape(says)) as err:
        shared_model(SharedHead, folder)
    assert str(folder / "config.json") in str(err.value)


def _safetensors_cases(folder: Path, tmp_path: Path) -> dict[str, bytes]:
    data = (folder / "model.safetensors").read_bytes()
    other = _head_folder(tmp_path / "other", channels=16)  # same tensor names, other shapes
    return {"truncated": data[: len(data) // 2], "fake": b"not a safetensors file at all",
            "header only": data[:8], "empty": b"", "other shapes": (other / "model.safetensors").read_bytes()}


@pytest.mark.parametrize("case", ["truncated", "fake", "header only", "empty", "other shapes"])
def test_a_damaged_or_foreign_model_safetensors_is_one_error(tmp_path, case):
    folder = _head_folder(tmp_path / "model")
    (folder / "model.safetensors").write_bytes(_safetensors_cases(folder, tmp_path)[case])
    with pytest.raises(ModelFileError, match=r"model\.safetensors") as err:
        shared_model(SharedHead, folder)
    if case == "other shapes":
        assert "has shape" in str(err.value) and "the model's is" in str(err.value)


# ---- the segmenter's checkpoint and shared folder -------------------------------------------------------

@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    enc = encoder("cpu")
    return Segmenter(new_net(enc), enc, input_size=64).save(tmp_path_factory.mktemp("seg") / "seg.safetensors")


def _rewrite(src: Path, dst: Path, **meta: str) -> Path:
    with safe_open(str(src), framework="pt") as fh:
        names = fh.keys()
        tensors = {k: fh.get_tensor(k) for k in names}
        metadata = {**(fh.metadata() or {}), **meta}
    save_file(tensors, str(dst), metadata={k: v for k, v in metadata.items() if v != "DROP"})
    return dst


@pytest.mark.parametrize(("meta", "says"), [
    ({"width": str(10 ** 9)}, "width '1000000000' must be an integer from 1 to 1024"),
    ({"input_size": str(10 ** 6)}, "input_size '1000000' must be an integer from 32 to 2048"),
    ({"width": "wide"}, "width 'wide' must be an integer"),
    ({"width": "DROP"}, "width None must be an integer"),
    ({"width": "16"}, "has shape"),
    ({"tta": "3"}, "tta '3' must be 1, 2 or 4"),
    ({"channels": "[1,"}, "trained over backbone"),
])
def test_hostile_segmenter_checkpoint_metadata_is_one_error(tmp_path, checkpoint, meta, says):
    path = _rewrite(checkpoint, tmp_path / "bad.safetensors", **meta)
    with pytest.raises(SegmenterError, match=re.escape(says)) as err:
        Segmenter.load(path, device="cpu")
    assert str(path) in str(err.value)


def test_a_truncated_segmenter_checkpoint_is_one_error(tmp_path, checkpoint):
    path = tmp_path / "cut.safetensors"
    path.write_bytes(checkpoint.read_bytes()[:-100])
    with pytest.raises(SegmenterError, match=r"cut\.safetensors"):
        Segmenter.load(path, device="cpu")


@pytest.mark.parametrize(("change", "says"), [
    ({"width": 10 ** 9}, "width 1000000000 must be an integer from 1 to 1024"),
    ({"input_size": 10 ** 7}, "input_size 10000000 must be an integer from 32 to 2048"),
    ({"tta": 3}, "tta 3 must be 1, 2 or 4"),
    ({"width": _DROP}, "missing 1 required positional argument: 'width'"),
])
def test_hostile_shared_segmenter_config_is_one_error(tmp_path, checkpoint, change, says):
    seg = Segmenter.load(checkpoint, device="cpu")
    enc = seg.encoder
    shared = SharedSegmenter(enc.identity, enc.channels, seg.net.decoder.width, seg.input_size, seg.tta)
    shared.net.load_state_dict(seg.net.state_dict())
    folder = write_model_folder(shared, tmp_path / "shared", "# a test segmenter\n")
    assert load_shared_segmenter(folder, "cpu").input_size == 64
    _edit_config(folder, **change)
    with pytest.raises(SegmenterError, match=re.escape(says)):
        load_shared_segmenter(folder, "cpu")


def test_a_fine_tuned_tail_names_only_its_own_backbone(tmp_path):
    """A tail folder naming another (e.g. a 600 M-parameter) backbone is refused before anything is built."""
    tail = SharedTail(4, {}, "efficientnet-lite0", model_format=TAIL_FORMAT)
    folder = write_model_folder(tail, tmp_path / "tail", "# a test tail\n")
    assert isinstance(shared_model(SharedTail, folder), SharedTail)
    _edit_config(folder, backbone="timm:vit_huge_patch14_224")
    with pytest.raises(ModelFileError, match="is not EfficientNet-Lite0"):
        shared_model(SharedTail, folder)


def test_a_hub_snapshot_links_only_into_its_own_repository_cache(tmp_path):
    """A Hugging Face cache snapshot's files are links into the repository's blobs: followed there, not beyond."""
    repo = tmp_path / "models--org--name"
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs" / "abc").write_text('{"model_format": "x"}')
    snapshot = repo / "snapshots" / "rev"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").symlink_to("../../blobs/abc")
    assert read_config(snapshot, root=repo) == {"model_format": "x"}
    with pytest.raises(ModelFileError, match="resolves outside the model folder"):
        read_config(snapshot)  # a local folder follows no link
    (tmp_path / "elsewhere.json").write_text("{}")
    (snapshot / "config.json").unlink()
    (snapshot / "config.json").symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(ModelFileError, match="resolves outside the model folder"):
        read_config(snapshot, root=repo)


def test_a_link_to_a_file_inside_the_model_folder_is_refused_too(tmp_path):
    folder = _head_folder(tmp_path / "model")
    (folder / "model.safetensors").rename(folder / "real.safetensors")
    (folder / "model.safetensors").symlink_to("real.safetensors")
    with pytest.raises(ModelFileError, match=r"'model\.safetensors' is a link"):
        shared_model(SharedHead, folder)


def test_a_new_photos_mask_is_read_with_the_pixel_budget(tmp_path):
    """``core.embed --images``: a mask beside the new photos is read as import reads one (a bomb is one error)."""
    bomb = tmp_path / "masks" / "p.png"
    bomb.parent.mkdir()
    bomb.write_bytes(_png_header_only(30_000, 30_000))
    with pytest.raises(DatasetError, match=r"p\.png: 900,000,000 pixels, more than the"):
        inference.read_labels(bomb)
    Image.fromarray(_upright() > 100).save(bomb)
    assert inference.read_labels(bomb).max() == 1
