"""Readers of a dataset folder's files: photos, masks and CSV tables.

Each reader validates what it reads and raises one :class:`DatasetError` naming the file, row and
field; nothing here writes. :mod:`annotations.dataset` plans and writes imports from what these
return.
"""
from __future__ import annotations

import csv
import hashlib
import io
import re
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, UnidentifiedImageError
from scipy import ndimage

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".tif", ".tiff")
ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


class DatasetError(ValueError):
    """Invalid dataset input; the message names the file, row and field."""


def valid_id(value: str) -> bool:
    """Ids are file-name safe: letters, digits, ``_ . -``, no leading dot, no path parts."""
    return bool(ID_PATTERN.match(value)) and ".." not in value


def parse_value(text: str) -> Any:
    """CSV cell → int, float or str; empty cells are missing (``None``)."""
    text = text.strip()
    if text == "":
        return None
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def read_csv(path: Path, required: tuple[str, ...]) -> list[tuple[int, dict[str, str]]]:
    """Rows as (line number, dict); checks encoding and required columns."""
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = path.read_bytes()[: err.start].count(b"\n") + 1
        raise DatasetError(f"{path.name}: line {line}: not valid UTF-8 text (byte {err.start}); "
                           "save the file as UTF-8") from None
    reader = csv.DictReader(io.StringIO(text))
    header = [h.strip() for h in (reader.fieldnames or [])]
    missing = [c for c in required if c not in header]
    if missing:
        raise DatasetError(f"{path.name}: missing required column(s) {', '.join(missing)} "
                           f"(found: {', '.join(header) or 'no header'})")
    if len(set(header)) != len(header):
        dup = [h for h, n in Counter(header).items() if n > 1]
        raise DatasetError(f"{path.name}: duplicate column(s) {', '.join(dup)}")
    reader.fieldnames = header
    rows = []
    for row in reader:
        if None in row:
            raise DatasetError(f"{path.name}: line {reader.line_num}: more cells than columns")
        rows.append((reader.line_num, {k: (v or "").strip() for k, v in row.items()}))
    return rows


def row_metadata(row: dict[str, str], skip: tuple[str, ...]) -> dict[str, Any]:
    return {k: parse_value(v) for k, v in row.items() if k not in skip and v.strip() != ""}


def check_id(value: str, where: str, what: str) -> str:
    if not valid_id(value):
        raise DatasetError(f"{where}: {what} {value!r} is not a valid id (letters, digits, "
                           "'_', '.', '-'; no path separators or '..')")
    return value


def load_image(path: Path) -> tuple[str, int, int]:
    data = path.read_bytes()
    try:
        with Image.open(io.BytesIO(data)) as im:
            im.load()
            width, height = im.size
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as err:
        raise DatasetError(f"images/{path.name}: cannot be read as an image ({err})") from None
    return hashlib.sha256(data).hexdigest(), width, height


def mask_to_labels(mask: np.ndarray, mask_format: str = "auto") -> np.ndarray:
    """A mask image array → int32 label map.

    ``auto``: masks whose values are only {0, 1} or {0, 255} are binary and are split into
    4-connected components (one wound each); anything else is a label map. ``label``: the
    values are wound indices as they are. RGB masks use their channel-wise maximum.
    """
    mask = np.asarray(mask)
    if mask.ndim == 3:
        mask = mask[..., :3].max(axis=2)
    mask = mask.astype(np.int64)
    values = set(np.unique(mask).tolist())
    if mask_format == "auto" and (values <= {0, 1} or values <= {0, 255}):
        labels, _ = ndimage.label(mask > 0)  # 4-connected, as the Medetec masks are counted
        return labels.astype(np.int32)
    return mask.astype(np.int32)


def wound_geometry(labels: np.ndarray, index: int) -> tuple[int, list[int]]:
    """Area in pixels and bounding box [x0, y0, x1, y1] (x1, y1 exclusive) of one wound."""
    ys, xs = np.nonzero(labels == index)
    if len(xs) == 0:
        return 0, [0, 0, 0, 0]
    return len(xs), [int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1]
