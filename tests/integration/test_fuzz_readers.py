"""Property-based fuzzing of the CSV, mask and photo readers (hypothesis): any bytes give either a
valid result or one DatasetError — never another exception — and a rejected import never changes
the workspace.

``make test`` runs a modest number of examples; for a long run set ``TRIDERM_FUZZ_EXAMPLES``, e.g.
``TRIDERM_FUZZ_EXAMPLES=5000 python -m pytest tests/integration/test_fuzz_readers.py``.
"""
from __future__ import annotations

import io
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image
from test_bad_inputs import small_dataset, workspace_state

from annotations.infra.workspace import Workspace
from annotations.io.dataset import import_dataset
from annotations.io.readers import (
    MAX_WOUNDS_PER_MASK,
    DatasetError,
    DatasetFolder,
    Photo,
    read_csv,
    read_mask,
    read_photo,
    wound_geometry,
)

EXAMPLES = int(os.environ.get("TRIDERM_FUZZ_EXAMPLES", "60"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
IMPORTS = settings(FUZZ, max_examples=max(EXAMPLES // 4, 5))

CSV_TEXT = st.text(alphabet=st.sampled_from(list(',"\r\n\t ;ab01.-+eETrufalsyno\x00é\ufeff')), max_size=300)
COLUMNS = st.dictionaries(st.sampled_from(["id", "a", "b", "age"]), st.sampled_from(["str", "int", "float", "bool"]),
                          max_size=3)


def _png(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="PNG")
    return buf.getvalue()


def _jpeg(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="JPEG", quality=80)
    return buf.getvalue()


VALID_MASK = _png((np.indices((20, 30)).sum(axis=0) % 7 == 0).astype(np.uint8) * 255)
VALID_PHOTOS = {".png": _png(np.full((20, 30, 3), 90, np.uint8)), ".jpg": _jpeg(np.full((20, 30, 3), 90, np.uint8))}


@st.composite
def mutated(draw, data: bytes) -> bytes:
    """``data`` with a few bytes overwritten, a slice cut out or the tail dropped."""
    out = bytearray(data)
    for _ in range(draw(st.integers(0, 6))):
        out[draw(st.integers(0, len(out) - 1))] = draw(st.integers(0, 255))
    if draw(st.booleans()):
        start = draw(st.integers(0, len(out)))
        del out[start:start + draw(st.integers(0, 64))]
    return bytes(out[: draw(st.integers(0, len(out)))] if draw(st.booleans()) else out)


@st.composite
def mask_arrays(draw) -> np.ndarray:
    """Small masks of any PNG-writable kind: binary, grey, label maps (8/16-bit), RGB."""
    h, w = draw(st.integers(1, 12)), draw(st.integers(1, 12))
    kind = draw(st.sampled_from(["u8", "u16", "rgb", "bool"]))
    dtype, shape = {"u8": (np.uint8, (h, w)), "u16": (np.uint16, (h, w)), "rgb": (np.uint8, (h, w, 3)),
                    "bool": (np.uint8, (h, w))}[kind]
    size = int(np.prod(shape)) * np.dtype(dtype).itemsize
    array = np.frombuffer(draw(st.binary(min_size=size, max_size=size)), dtype=dtype).reshape(shape)
    return (array % 2).astype(bool) if kind == "bool" else array


def _read_csv_bytes(data: bytes, columns: dict | None = None) -> list:
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "t.csv").write_bytes(data)
        return read_csv(DatasetFolder(tmp), Path(tmp) / "t.csv", ("id",), columns)


def _check_rows(rows: list) -> None:
    for line, row in rows:
        assert line >= 2 and "id" in row and set(row.typed) <= set(row)


@FUZZ
@given(data=st.binary(max_size=2000), columns=COLUMNS)
def test_csv_reader_any_bytes(data, columns):
    try:
        _check_rows(_read_csv_bytes(data, columns))
    except DatasetError as err:
        assert type(err) is DatasetError and "t.csv" in str(err)


@FUZZ
@given(text=CSV_TEXT, columns=COLUMNS)
def test_csv_reader_csv_like_text(text, columns):
    try:
        _check_rows(_read_csv_bytes(("id,a,b,age\n" + text).encode("utf-8", "surrogatepass"), columns))
    except DatasetError as err:
        assert type(err) is DatasetError and "t.csv" in str(err)


def _read_mask_bytes(data: bytes, size: tuple[int, int] = (30, 20), min_area: int = 2):
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "masks").mkdir()
        (Path(tmp) / "masks" / "a.png").write_bytes(data)
        photo = Photo(b"", "", size[0], size[1])
        return read_mask(DatasetFolder(tmp), Path(tmp) / "masks" / "a.png", photo, "auto", min_area)


def _check_mask(mask) -> None:
    assert mask.labels.dtype == np.int32 and int(mask.labels.max(initial=0)) <= MAX_WOUNDS_PER_MASK
    assert set(np.unique(mask.labels)) - {0} == set(mask.geometry)
    for index, geometry in mask.geometry.items():
        assert geometry == wound_geometry(mask.labels, index)


@FUZZ
@given(data=st.one_of(st.binary(max_size=600), mutated(VALID_MASK)))
def test_mask_reader_any_bytes(data):
    try:
        _check_mask(_read_mask_bytes(data))
    except DatasetError as err:
        assert type(err) is DatasetError and "masks/a.png" in str(err)


@FUZZ
@given(array=mask_arrays(), min_area=st.integers(0, 5))
def test_mask_reader_any_png_mask(array, min_area):
    try:
        _check_mask(_read_mask_bytes(_png(array), (array.shape[1], array.shape[0]), min_area))
    except DatasetError as err:  # e.g. negative or oversized values: never another exception
        assert type(err) is DatasetError and "masks/a.png" in str(err)


@FUZZ
@given(suffix=st.sampled_from([".png", ".jpg"]), data=st.data(), keep=st.booleans())
def test_photo_reader_any_bytes(suffix, data, keep):
    content = data.draw(st.one_of(st.binary(max_size=600), mutated(VALID_PHOTOS[suffix])))
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "images").mkdir()
        path = Path(tmp) / "images" / f"a{suffix}"
        path.write_bytes(content)
        try:
            photo = read_photo(DatasetFolder(tmp), path, keep)
        except DatasetError as err:
            assert type(err) is DatasetError and f"images/a{suffix}" in str(err)
            return
    stored = Image.open(io.BytesIO(photo.data))
    stored.load()
    assert stored.size == (photo.width, photo.height) and stored.mode in ("RGB", "L")


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("fuzz")
    dataset = small_dataset(root / "dataset")
    ws = Workspace(root / "ws")
    import_dataset(ws, dataset)
    ws.store.close()
    return dataset, root / "ws"


@IMPORTS
@given(target=st.sampled_from(["wounds.csv", "patients.csv", "masks/a.png", "images/b.png"]), data=st.data())
def test_import_of_fuzzed_files_is_valid_or_one_error_and_atomic(baseline, target, data):
    original = (baseline[0] / target).read_bytes()
    content = data.draw(st.one_of(st.binary(max_size=400), mutated(original),
                                  CSV_TEXT.map(lambda t: original.split(b"\n")[0] + b"\n" + t.encode())))
    with tempfile.TemporaryDirectory() as tmp:
        dataset, ws_root = Path(tmp) / "dataset", Path(tmp) / "ws"
        shutil.copytree(baseline[0], dataset)
        shutil.copytree(baseline[1], ws_root)
        (dataset / target).write_bytes(content)
        ws = Workspace(ws_root)
        before = workspace_state(ws_root)
        try:
            import_dataset(ws, dataset)
        except DatasetError as err:
            assert type(err) is DatasetError and "\n" not in str(err)
            assert workspace_state(ws_root) == before
        finally:
            ws.store.close()
