"""Readers of a dataset folder's files: photos, masks, CSV tables and ``dataset.json``.

Each reader validates what it reads and raises one :class:`DatasetError` naming the file, row and
field; nothing here writes. :mod:`annotations.io.dataset` plans and writes imports from what these
return.

Safety rules, checked before any file is opened (:class:`DatasetFolder`):

- nothing but regular files and folders: a symbolic link, device file, FIFO or socket anywhere in
  the dataset folder is rejected by name (links are never followed, so nothing outside is read);
- a hard-linked file (``st_nlink > 1``) is read only when every one of its links lies inside the
  dataset folder (counted by inode); a link shared with a file elsewhere is rejected, since its
  other name cannot be checked (copy the file instead);
- files are opened component by component with ``O_NOFOLLOW`` and re-checked with ``fstat``, so a
  file swapped for a link after the scan is still refused.

Photos are stored upright (EXIF orientation applied, the original value kept in the image
metadata as ``exif_orientation``), as 8-bit RGB or greyscale (16-bit scaled, palette, alpha and
CMYK converted), and without identifying metadata (EXIF, GPS, dates, serials, maker notes, XMP,
IPTC, comments, PNG text chunks) unless ``keep_metadata``. Photos that need no pixel change are
stripped losslessly (JPEG segments, PNG chunks); the ICC colour profile is kept.
"""
from __future__ import annotations

import csv
import errno
import hashlib
import io
import json
import math
import os
import re
import stat
import struct
import warnings
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageOps, JpegImagePlugin, UnidentifiedImageError

from annotations.io import csvsafe
from annotations.store.rows import StoreOperationalError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".tif", ".tiff")
#: Apple's photo format: refused with a hint (reading it would need the pillow-heif codec).
HEIC_SUFFIXES = (".heic", ".heif")
ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")  # always fullmatch: "$" allows a final "\n"
MASK_FORMATS = ("auto", "label", "binary")
#: Largest photo or mask accepted, in pixels (Pillow's own decompression-bomb threshold).
MAX_PIXELS = 89_478_485
#: Largest file read from a dataset folder.
MAX_FILE_BYTES = 1 << 30
#: Longest CSV cell, in characters.
MAX_CELL_CHARS = 20_000
#: Most wounds one workspace mask (16-bit PNG) can hold.
MAX_WOUNDS_PER_MASK = 65_535
COLUMN_TYPES = ("str", "int", "float", "bool")
TRUE_WORDS = frozenset({"true", "yes", "1"})
FALSE_WORDS = frozenset({"false", "no", "0"})
_PIL_FORMATS = {".png": ["PNG"], ".jpg": ["JPEG"], ".jpeg": ["JPEG"],  # JPEG opens multi-picture (MPO) files too
                ".tif": ["TIFF"], ".tiff": ["TIFF"]}
_INT_TEXT = re.compile(r"[-+]?(0|[1-9][0-9]*)")
#: Longer digit strings (record numbers, barcodes) are inferred as text.
_MAX_NUMBER_CHARS = 15
_FLOAT_TEXT = re.compile(r"[-+]?(0|[1-9][0-9]*)?(\.[0-9]+)?([eE][-+]?[0-9]+)?")
#: Numbers as written in a file or typed: ASCII digits only (Python's int() and float() also take
#: "١٢", "1_000" and "nan"; those are errors here).
_ASCII_INT = re.compile(r"[-+]?[0-9]+")
_ASCII_DECIMAL = re.compile(r"[-+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+)?")
#: Control characters refused in any CSV cell or name (tab, newline and carriage return are text).
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: PNG chunks kept when metadata is stripped: pixels, colour and animation; never text, eXIf, tIME.
_PNG_KEEP = frozenset({b"IHDR", b"PLTE", b"IDAT", b"IEND", b"tRNS", b"cHRM", b"gAMA", b"iCCP", b"sBIT",
                       b"sRGB", b"cICP", b"mDCV", b"cLLI", b"bKGD", b"hIST", b"pHYs", b"sPLT", b"acTL",
                       b"fcTL", b"fdAT"})
_ORIENTATION = 0x0112
_TOO_MANY = (f"more than the {MAX_PIXELS:,} allowed (a decompression bomb or an unusually large image; "
             "resize it)")


class DatasetError(ValueError):
    """Invalid dataset input; the message names the file, row and field."""


def clear_error(err: BaseException, root: Path, done: str) -> DatasetError | None:
    """The one-line error for a full disk or a store locked too long, saying what was done
    (``done``) and what to do (None for any other error)."""
    text = str(err)
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        return DatasetError(f"{err.filename or root}: the disk is full ({err.strerror}); {done}; free some "
                            "space and run it again")
    if isinstance(err, StoreOperationalError) and ("full" in text or "disk" in text):
        return DatasetError(f"{root / 'triderm.sqlite'}: {text} (is the disk full?); {done}; free some "
                            "space and run it again")
    if isinstance(err, StoreOperationalError) and "locked" in text:
        return DatasetError(f"{root / 'triderm.sqlite'}: {text} (another process held its write lock too "
                            f"long); {done}; try again when it is done")
    return None


def valid_id(value: str) -> bool:
    """Ids are file-name safe: letters, digits, ``_ . -``, no leading dot, no path parts."""
    return bool(ID_PATTERN.fullmatch(value)) and ".." not in value


def check_id(value: str, where: str, what: str) -> str:
    """``value`` when it is a valid id; else DatasetError naming ``where`` and ``what``."""
    if not valid_id(value):
        raise DatasetError(f"{where}: {what} {value!r} is not a valid id (letters, digits, "
                           "'_', '.', '-'; no path separators or '..')")
    return value


# ---- the folder: no link, special file or outside path is ever read ----------------------------

class DatasetFolder:
    """A dataset folder, scanned once without following links; files are read only through it."""

    def __init__(self, root: str | Path) -> None:
        self.given = Path(root)
        if not self.given.is_dir():
            raise DatasetError(f"{root}: not a folder")
        self.root = self.given.resolve()
        self._links: Counter[tuple[int, int]] = Counter()
        hard: list[tuple[str, os.stat_result]] = []
        for dirpath, dirs, files in os.walk(self.root, onerror=self._unlistable):
            dirs.sort()
            for entry in sorted(dirs + files):
                path = os.path.join(dirpath, entry)
                try:
                    st = os.stat(path, follow_symlinks=False)
                except OSError as err:  # removed or made unreadable while we look
                    raise DatasetError(f"{self.name(Path(path))}: cannot be read ({err.strerror})") from None
                self._check_kind(self.name(Path(path)), st)
                if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
                    self._links[(st.st_dev, st.st_ino)] += 1
                    hard.append((self.name(Path(path)), st))
        for name, st in hard:  # every link inside is counted now
            self._check_links(name, st)

    def name(self, path: Path) -> str:
        """``path`` relative to the dataset folder, as messages show it."""
        for base in (self.given, self.root):
            try:
                return Path(path).relative_to(base).as_posix()
            except ValueError:
                pass
        return str(path)

    def _unlistable(self, err: OSError) -> None:
        raise DatasetError(f"{self.name(Path(err.filename))}: cannot be listed ({err.strerror})")

    @staticmethod
    def _check_kind(name: str, st: os.stat_result) -> None:
        if stat.S_ISLNK(st.st_mode):
            raise DatasetError(f"{name}: is a symbolic link; links are never followed (replace it "
                               "with a copy of the file)")
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
            raise DatasetError(f"{name}: is not a regular file (a device, FIFO or socket); only "
                               "files and folders may be in a dataset folder")

    def _check_links(self, name: str, st: os.stat_result) -> None:
        if st.st_nlink > 1 and self._links[(st.st_dev, st.st_ino)] < st.st_nlink:
            raise DatasetError(f"{name}: is a hard link shared with a file outside the dataset folder "
                               f"({st.st_nlink} links, {self._links[(st.st_dev, st.st_ino)]} inside); "
                               "copy the file instead")

    def files(self, sub: str) -> list[Path]:
        """The files of the sub-folder ``sub`` in name order. Names starting with ``.`` (``.DS_Store``)
        are ignored; a folder inside, or a name with a control character, is an error."""
        paths = []
        for path in sorted((self.root / sub).iterdir()):
            bad = re.search(r"[\x00-\x1f\x7f]", path.name)
            if bad:
                raise DatasetError(f"{sub}/{path.name!r}: the name holds the control character "
                                   f"U+{ord(bad.group()):04X}; rename it")
            if path.name.startswith("."):
                continue
            if path.is_dir():
                raise DatasetError(f"{self.name(path)}: is a folder; {sub}/ may hold only files (move its "
                                   "contents up or remove it)")
            paths.append(path)
        return paths

    def read_bytes(self, path: Path, limit: int = MAX_FILE_BYTES) -> bytes:
        """The bytes of a regular file inside the folder, opened without following any link."""
        name = self.name(path)
        parts = Path(name).parts
        if not parts or ".." in parts or Path(name).is_absolute():
            raise DatasetError(f"{path}: lies outside the dataset folder {self.root}")
        flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
        fds: list[int] = []
        try:
            fd = os.open(self.root, flags | getattr(os, "O_DIRECTORY", 0))
            fds.append(fd)
            for i, part in enumerate(parts):
                last = i == len(parts) - 1
                fd = os.open(part, flags | (0 if last else getattr(os, "O_DIRECTORY", 0)), dir_fd=fds[-1])
                fds.append(fd)
            st = os.fstat(fds[-1])
            self._check_kind(name, st)
            if not stat.S_ISREG(st.st_mode):
                raise DatasetError(f"{name}: is a folder, not a file")
            self._check_links(name, st)
            if st.st_size > limit:
                raise DatasetError(f"{name}: {st.st_size:,} bytes, more than the {limit:,} allowed")
            with os.fdopen(os.dup(fds[-1]), "rb") as fh:
                return fh.read()
        except OSError as err:
            if err.errno in (getattr(os, "ELOOP", -1), getattr(os, "ENOTDIR", -1)):
                raise DatasetError(f"{name}: is or lies under a symbolic link; links are never "
                                   "followed") from None
            raise DatasetError(f"{name}: cannot be read ({err.strerror})") from None
        finally:
            for fd in fds:
                os.close(fd)


# ---- dataset.json -----------------------------------------------------------------------------

def read_info(folder: DatasetFolder) -> dict[str, Any]:
    """``dataset.json`` (``{}`` when absent), checked: name, synthetic, mask_format, columns."""
    path = folder.root / "dataset.json"
    if not path.exists():
        return {"mask_format": "auto", "columns": {}}
    try:
        info = json.loads(folder.read_bytes(path).decode("utf-8-sig"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise DatasetError(f"dataset.json: not valid JSON ({err})") from None
    if not isinstance(info, dict):
        raise DatasetError("dataset.json: must hold a JSON object")
    if "name" in info and not isinstance(info["name"], str):
        raise DatasetError(f"dataset.json: name must be text, got {info['name']!r}")
    check_text(info.get("name", ""), "dataset.json: name")
    if "synthetic" in info:
        info["synthetic"] = parse_bool(info["synthetic"], "dataset.json: synthetic")
    info.setdefault("mask_format", "auto")
    if info["mask_format"] not in MASK_FORMATS:
        raise DatasetError(f"dataset.json: mask_format must be one of {', '.join(map(repr, MASK_FORMATS))}, "
                           f"got {info['mask_format']!r}")
    columns = info.setdefault("columns", {})
    if not isinstance(columns, dict) or not all(isinstance(t, str) and t in COLUMN_TYPES
                                                for t in columns.values()):
        raise DatasetError(f"dataset.json: columns must map column names to one of "
                           f"{', '.join(COLUMN_TYPES)}, e.g. {{\"age\": \"int\"}}; got {columns!r}")
    return info


def parse_bool(value: Any, where: str) -> bool:
    """``true/false/yes/no/1/0`` (any case) or a JSON boolean → bool; anything else is an error."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (str, int)) and str(value).strip().lower() in TRUE_WORDS | FALSE_WORDS:
        return str(value).strip().lower() in TRUE_WORDS
    raise DatasetError(f"{where}: {value!r} is not a boolean (true/false, yes/no, 1/0)")


# ---- CSV tables -------------------------------------------------------------------------------

class CsvRow(dict):
    """One CSV row: column → stripped text; ``typed`` holds the non-empty cells with their types."""

    typed: dict[str, Any]


def read_csv(folder: DatasetFolder, path: Path, required: tuple[str, ...],
             columns: dict[str, str] | None = None) -> list[tuple[int, CsvRow]]:
    """Rows as (line number, row): :func:`iter_csv` as a list."""
    return list(iter_csv(folder, path, required, columns))


def iter_csv(folder: DatasetFolder, path: Path, required: tuple[str, ...],
             columns: dict[str, str] | None = None) -> Iterator[tuple[int, CsvRow]]:
    """Rows as (line number, row), one at a time; checks encoding, header, row lengths, cell sizes
    and types.

    The whole file is checked (and its column types inferred) when this is called, before the
    first row is returned, so a bad file raises here and no caller has acted on part of it; the
    rows are then parsed again one by one, never held as a list.

    Any newline convention (LF, CRLF, CR) is read. A metadata column's type is the one declared in
    ``columns`` (``dataset.json``), else inferred: ``int``/``float`` only when every non-empty cell
    parses, has at most 15 characters and no leading zero (``'007'`` stays text), ``bool`` when
    every cell is ``true``/``false``; otherwise text."""
    name = folder.name(path)
    data = folder.read_bytes(path)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = len(re.findall(rb"\r\n|\r|\n", data[: err.start])) + 1
        raise DatasetError(f"{name}: line {line}: not valid UTF-8 text (byte {err.start}); "
                           "save the file as UTF-8") from None
    del data
    header: list[str] = []
    guesses: dict[str, _TypeGuess] = {}
    for line, cells in _records(name, text, required, header):
        for col, cell in zip(header, cells):
            guesses.setdefault(col, _TypeGuess()).add(cell.strip())
    types = {c: (columns or {}).get(c) or guesses.get(c, _TypeGuess()).kind for c in header}
    if columns and any(c in columns for c in header):  # a declared type may not fit a cell: checked before any row
        for line, cells in _records(name, text, required, []):
            for col, cell in zip(header, cells):
                if col in columns and cell.strip():
                    _typed(cell.strip(), types[col], f"{name}: line {line}: {col}")
    return _typed_rows(name, text, required, header, types)


def _typed_rows(name: str, text: str, required: tuple[str, ...], header: list[str],
                types: dict[str, str]) -> Iterator[tuple[int, CsvRow]]:
    for line, cells in _records(name, text, required, []):
        row = CsvRow(zip(header, (csvsafe.restore(c.strip()) for c in cells)))  # as export neutralised it
        row.typed = {col: _typed(value, types[col], f"{name}: line {line}: {col}")
                     for col, value in row.items() if value != ""}
        yield line, row


def _records(name: str, text: str, required: tuple[str, ...], header: list[str]) -> Iterator[tuple[int, list[str]]]:
    """(line, cells) of each non-blank record after the checked header (stored into ``header``)."""
    reader = csv.reader(io.StringIO(text, newline=""))
    next_line = 1  # where the next record starts (a quoted cell may span lines)
    try:
        header[:] = [h.strip() for h in next(reader, [])]
        _check_cells(name, reader.line_num, [f"column {i + 1}" for i in range(len(header))], header)
        if "" in header:
            raise DatasetError(f"{name}: line 1: column {header.index('') + 1} has no name")
        dup = [h for h, n in Counter(header).items() if n > 1]
        if dup:
            raise DatasetError(f"{name}: duplicate column(s) {', '.join(dup)}")
        missing = [c for c in required if c not in header]
        if missing:
            hint = "; the cells seem separated by ';': save the file with commas" if ";" in "".join(header) else ""
            raise DatasetError(f"{name}: missing required column(s) {', '.join(missing)} "
                               f"(found: {', '.join(header) or 'no header'}){hint}")
        next_line = reader.line_num + 1
        for cells in reader:
            line, next_line = next_line, reader.line_num + 1
            if not cells or (len(cells) == 1 and not cells[0].strip()):
                continue  # blank line
            if len(cells) > len(header):
                raise DatasetError(f"{name}: line {line}: more cells than columns ({len(cells)} > "
                                   f"{len(header)})")
            if len(cells) < len(header):
                raise DatasetError(f"{name}: line {line}: {len(cells)} cell(s) for {len(header)} columns "
                                   f"(missing {', '.join(header[len(cells):])})")
            _check_cells(name, line, header, cells)
            yield line, cells
    except csv.Error as err:
        if "field larger than field limit" in str(err):
            raise DatasetError(f"{name}: line {next_line}: a cell is longer than {MAX_CELL_CHARS:,} "
                               "characters") from None
        raise DatasetError(f"{name}: line {next_line}: not valid CSV ({err})") from None


def _check_cells(name: str, line: int, header: list[str], cells: list[str]) -> None:
    for col, cell in zip(header, cells):
        if len(cell) > MAX_CELL_CHARS:
            raise DatasetError(f"{name}: line {line}: {col}: a cell of {len(cell):,} characters "
                               f"(at most {MAX_CELL_CHARS:,})")
        check_text(cell, f"{name}: line {line}: {col}")


def check_text(text: str, where: str) -> str:
    """``text`` unless it holds a control character (NUL and the like; tab and newlines are fine)."""
    bad = _CONTROL.search(text)
    if bad:
        raise DatasetError(f"{where}: contains the control character U+{ord(bad.group()):04X} at position "
                           f"{bad.start() + 1}; remove it (only tab and line breaks are allowed in text)")
    return text


def parse_int(text: str, where: str, minimum: int | None = None) -> int:
    """A whole number in ASCII digits (``'١'``, ``'1_000'``, ``'1.0'`` are errors), at least ``minimum``."""
    if not _ASCII_INT.fullmatch(text):
        raise DatasetError(f"{where}: {text!r} is not a whole number (digits 0-9)")
    value = int(text)
    if minimum is not None and value < minimum:
        raise DatasetError(f"{where}: {value} is less than {minimum}")
    return value


def parse_number(text: str, where: str, minimum: float | None = None) -> float:
    """A finite number in ASCII digits (``'nan'``, ``'inf'``, ``'١.٥'`` are errors), at least ``minimum``."""
    value = float(text) if _ASCII_DECIMAL.fullmatch(text) else math.nan
    if not math.isfinite(value):
        raise DatasetError(f"{where}: {text!r} is not a finite number (digits 0-9, e.g. 1250 or 1.25e3)")
    if minimum is not None and value < minimum:
        raise DatasetError(f"{where}: {text} is less than {minimum:g}")
    return value


def parse_timestamp(text: str, where: str) -> str:
    """``text`` when it is an ISO 8601 date or date-time (kept as written), else an error."""
    try:
        if not text.isascii():
            raise ValueError(text)
        datetime.fromisoformat(text)
    except ValueError:
        raise DatasetError(f"{where}: {text!r} is not an ISO 8601 date or date-time (e.g. 2026-01-31 or "
                           "2026-01-31T14:05:00+00:00)") from None
    return text


class _TypeGuess:
    """A column's inferred type, one cell at a time (see :func:`iter_csv`)."""

    def __init__(self) -> None:
        self.present = False
        self.int = self.float = self.bool = True

    def add(self, v: str) -> None:
        if v == "":
            return
        self.present = True
        short = len(v) <= _MAX_NUMBER_CHARS
        self.int = self.int and short and bool(_INT_TEXT.fullmatch(v))
        self.float = self.float and short and bool(_FLOAT_TEXT.fullmatch(v)) and _finite(v)
        self.bool = self.bool and v.lower() in ("true", "false")

    @property
    def kind(self) -> str:
        if not self.present:
            return "str"
        return "int" if self.int else "float" if self.float else "bool" if self.bool else "str"


def _finite(v: str) -> bool:
    """Whether ``v`` reads as a finite number (``'e5'`` matches the float pattern but is text)."""
    try:
        return math.isfinite(float(v))
    except ValueError:
        return False


def _column_type(values: list[str]) -> str:
    guess = _TypeGuess()
    for v in values:
        guess.add(v)
    return guess.kind


def _typed(value: str, kind: str, where: str) -> Any:
    if kind == "str":
        return value
    if kind == "bool":
        return parse_bool(value, where)
    if not (_ASCII_INT if kind == "int" else _ASCII_DECIMAL).fullmatch(value):
        raise DatasetError(f"{where}: {value!r} is not {'an int' if kind == 'int' else 'a finite number'} "
                           "(the column's declared type in dataset.json; digits 0-9)")
    number = int(value) if kind == "int" else float(value)
    if kind == "float" and not math.isfinite(number):
        raise DatasetError(f"{where}: {value!r} is not a finite number")
    return number


def typed_value(text: str, previous: Any = None) -> Any:
    """A metadata value typed in the app, typed by the import's rules: the type the field already
    has (bool, int, float or text) when the text parses as it, else inferred from the text alone (a
    number only without leading zeros: ``'007'`` stays text). Empty text is ``None`` (no value)."""
    text = text.strip()
    if not text:
        return None
    kinds = {bool: "bool", int: "int", float: "float", str: "str"}
    kind = kinds.get(type(previous))
    if kind is not None:
        try:
            return _typed(text, kind, "value")
        except DatasetError:
            pass
    return _typed(text, _column_type([text]), "value")


def row_metadata(row: CsvRow, skip: tuple[str, ...]) -> dict[str, Any]:
    """The row's non-empty cells with their column types, without the ``skip`` columns."""
    return {k: v for k, v in row.typed.items() if k not in skip}


def column_schema(tables: list[list[dict[str, Any]]]) -> dict[str, str]:
    """``dataset.json`` ``columns`` for metadata rows: each column's type where all its values agree
    (so an export imports back with the same types, ``'12'`` staying text)."""
    kinds: dict[str, set[str]] = {}
    for rows in tables:
        for row in rows:
            for col, value in row.items():
                if value is not None:
                    kinds.setdefault(col, set()).add(
                        "bool" if isinstance(value, bool) else "int" if isinstance(value, int)
                        else "float" if isinstance(value, float) else "str")
    schema = {}
    for col, seen in sorted(kinds.items()):
        if len(seen) == 1:
            schema[col] = seen.pop()
        elif seen == {"int", "float"}:
            schema[col] = "float"
    return schema


# ---- photos -----------------------------------------------------------------------------------

@dataclass
class Photo:
    """A photo as the workspace stores it: upright, 8-bit, stripped of identifying metadata."""

    data: bytes
    sha256: str
    width: int
    height: int
    orientation: int = 1
    metadata: dict[str, Any] = field(default_factory=dict)


def open_image(data: bytes, name: str, suffix: str) -> tuple[Image.Image, Image.Image, int]:
    """Decode ``data`` as the format its suffix names, refusing oversized pixel counts.

    Returns the image as stored, the image upright (EXIF orientation applied) and the orientation."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            im = Image.open(io.BytesIO(data), formats=_PIL_FORMATS[suffix])
        if im.width * im.height > MAX_PIXELS:
            raise DatasetError(f"{name}: {im.width}×{im.height} = {im.width * im.height:,} pixels, {_TOO_MANY}")
        im.load()
        orientation = int(im.getexif().get(_ORIENTATION, 1))
        orientation = orientation if 1 <= orientation <= 8 else 1
        upright = ImageOps.exif_transpose(im) if orientation != 1 else im
    except DatasetError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
        pixels = re.search(r"\((\d+) pixels\)", str(err))
        count = f"{int(pixels.group(1)):,} pixels, " if pixels else ""
        raise DatasetError(f"{name}: {count}{_TOO_MANY}") from None
    except UnidentifiedImageError:
        kind = _PIL_FORMATS[suffix][0]
        raise DatasetError(f"{name}: cannot be read as a {kind} image (not a {kind} file, or a damaged one)") from None
    except Exception as err:
        kind = _PIL_FORMATS[suffix][0]
        raise DatasetError(f"{name}: cannot be read as a {kind} image ({type(err).__name__}: {err})") from None
    return im, upright, orientation


def photo_id(file_name: str, where: str) -> str:
    """The image id of a photo file named ``file_name`` (its stem), checked with its type; errors name ``where``."""
    suffix = Path(file_name).suffix.lower()
    if suffix not in IMAGE_SUFFIXES:
        hint = "; HEIC/HEIF photos are not read: save them as JPEG (iPhone: Settings › Camera › Formats › " \
               "Most Compatible)" if suffix in HEIC_SUFFIXES else ""
        raise DatasetError(f"{where}: unsupported file type (expected {', '.join(IMAGE_SUFFIXES)}){hint}")
    return check_id(Path(file_name).stem, where, "image id")


def read_photo(folder: DatasetFolder, path: Path, keep_metadata: bool = False) -> Photo:
    """Read, check and normalise one photo (see the module docstring)."""
    return normalise_photo(folder.read_bytes(path), folder.name(path), path.suffix.lower(), keep_metadata)


def normalise_photo(data: bytes, name: str, suffix: str, keep_metadata: bool = False) -> Photo:
    """Check and normalise the bytes of one photo file (``suffix``: its type; errors name ``name``):
    upright, 8-bit, stripped (see the module docstring)."""
    im, upright, orientation = open_image(data, name, suffix)
    pixels = _eight_bit(upright, name)
    if pixels is not im or orientation != 1:
        stored = _encode(pixels, im, suffix, keep_metadata)
    elif keep_metadata:
        stored = data
    elif suffix == ".png":
        stored = _strip_png(data)
    elif suffix in (".jpg", ".jpeg"):
        stripped = _strip_jpeg(data)
        stored = stripped if stripped is not None else _encode(pixels, im, suffix, keep_metadata)
    else:  # TIFF keeps metadata in tags among the pixel layout: re-encoded losslessly
        stored = _encode(pixels, im, suffix, keep_metadata)
    meta = {"exif_orientation": orientation} if orientation != 1 else {}
    return Photo(stored, hashlib.sha256(stored).hexdigest(), pixels.width, pixels.height, orientation, meta)


def load_photo(path: Path) -> Image.Image:
    """A photo outside any dataset (e.g. ``core.embed --images``) upright and 8-bit, as import stores it."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in _PIL_FORMATS:
        raise DatasetError(f"{path}: not a photo ({', '.join(IMAGE_SUFFIXES)})")
    _, upright, _ = open_image(path.read_bytes(), str(path), suffix)
    return _eight_bit(upright, str(path))


def photo_sha256(path: Path) -> str:
    """The sha256 import would store for the photo file ``path`` (of its normalised bytes)."""
    path = Path(path)
    return normalise_photo(path.read_bytes(), str(path), path.suffix.lower()).sha256


def _eight_bit(im: Image.Image, name: str) -> Image.Image:
    """8-bit RGB or L: 16-bit scaled (not clipped), palette/alpha flattened on white, CMYK to RGB."""
    if im.mode in ("RGB", "L"):
        return im
    if im.mode.startswith("I"):  # I;16, I;16B, I (16-bit PNG/TIFF): 0..65535 → 0..255
        array = np.asarray(im).astype(np.float64)
        return Image.fromarray(np.clip(np.rint(array / 257.0), 0, 255).astype(np.uint8), "L")
    if im.mode == "F":
        raise DatasetError(f"{name}: floating-point pixels are not supported; save the photo as 8- or 16-bit")
    if im.mode == "1":
        return im.convert("L")
    if "A" in im.mode or "a" in im.mode or "transparency" in im.info:
        rgba = im.convert("RGBA")
        flat = Image.new("RGB", rgba.size, (255, 255, 255))
        flat.paste(rgba, mask=rgba.getchannel("A"))
        return flat
    return im.convert("RGB")


def _encode(pixels: Image.Image, source: Image.Image, suffix: str, keep_metadata: bool) -> bytes:
    """Re-encode in the source's format; JPEG with the source's quantisation tables when it has them."""
    pixels = pixels.copy()
    pixels.info = {}  # Pillow's writers would carry comments, XMP and TIFF tags over from ``info``
    kwargs: dict[str, Any] = {}
    if source.info.get("icc_profile"):
        kwargs["icc_profile"] = source.info["icc_profile"]
    if keep_metadata:
        exif = source.getexif()
        if _ORIENTATION in exif:
            exif[_ORIENTATION] = 1
        kwargs["exif"] = exif.tobytes()
    buf = io.BytesIO()
    if suffix == ".png":
        if keep_metadata:
            kwargs["pnginfo"] = _png_text(source)
        pixels.save(buf, format="PNG", **kwargs)
    elif suffix in (".jpg", ".jpeg"):
        if keep_metadata:
            kwargs.update({k: source.info[k] for k in ("comment", "xmp") if source.info.get(k)})
        qtables = getattr(source, "quantization", None)
        if qtables and source.mode in ("RGB", "L") and pixels.mode == source.mode:
            kwargs.update(qtables=qtables, subsampling=max(JpegImagePlugin.get_sampling(source), 0))
        else:
            kwargs["quality"] = 95
        pixels.save(buf, format="JPEG", **kwargs)
    else:
        pixels.save(buf, format="TIFF", compression="tiff_lzw", **kwargs)
    return buf.getvalue()


def _png_text(source: Image.Image) -> Any:
    from PIL.PngImagePlugin import PngInfo

    info = PngInfo()
    for key, value in getattr(source, "text", {}).items():
        info.add_text(key, value)
    return info


def _strip_png(data: bytes) -> bytes:
    """The PNG without text, eXIf, tIME or private chunks (pixels and colour chunks byte-identical)."""
    out = [_PNG_SIGNATURE]
    pos = len(_PNG_SIGNATURE)
    while pos + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        end = pos + 12 + length
        if kind in _PNG_KEEP:
            out.append(data[pos:end])
        pos = end
        if kind == b"IEND":
            break
    return b"".join(out)


def _strip_jpeg(data: bytes) -> bytes | None:
    """The JPEG without APP1 (EXIF, XMP), APP3–APP13/APP15 (IPTC, maker data), comments or anything
    after the end-of-image marker (MPF previews, vendor trailers); JFIF, ICC and Adobe segments and
    the entropy-coded data are kept byte for byte. ``None`` when the marker layout is not understood."""
    if data[:2] != b"\xff\xd8":
        return None
    out = [b"\xff\xd8"]
    i = 2
    try:
        while True:
            if data[i] != 0xFF:
                return None
            while data[i] == 0xFF:
                i += 1
            marker = data[i]
            i += 1
            if marker == 0xD9:
                out.append(b"\xff\xd9")
                return b"".join(out)
            if 0xD0 <= marker <= 0xD7 or marker == 0x01:
                out.append(bytes((0xFF, marker)))
                continue
            length = int.from_bytes(data[i:i + 2], "big")
            if length < 2 or i + length > len(data):
                return None
            payload = data[i + 2:i + length]
            segment = bytes((0xFF, marker)) + data[i:i + length]
            i += length
            app = 0xE0 <= marker <= 0xEF
            if not ((app and (marker, payload[:5]) in ((0xE0, b"JFIF\0"), (0xEE, b"Adobe")))
                    or (marker == 0xE2 and payload.startswith(b"ICC_PROFILE\0"))
                    or (not app and marker != 0xFE)):
                continue
            out.append(segment)
            if marker == 0xDA:  # entropy-coded data runs to the next marker other than RSTn/stuffing
                j = i
                while True:
                    j = data.index(b"\xff", j)
                    if data[j + 1] == 0 or 0xD0 <= data[j + 1] <= 0xD7 or data[j + 1] == 0xFF:
                        j += 1
                        continue
                    break
                out.append(data[i:j])
                i = j
    except (IndexError, ValueError):
        return None


# ---- masks ------------------------------------------------------------------------------------

@dataclass
class Mask:
    """A mask as the workspace stores it, with each wound's area and bounding box."""

    labels: np.ndarray  # H×W int32, 0 = skin, 1..N wounds (N ≤ MAX_WOUNDS_PER_MASK)
    geometry: dict[int, tuple[int, list[int]]]  # wound index → (area px, [x0, y0, x1, y1])
    dropped: list[dict[str, Any]] = field(default_factory=list)  # components under the minimum area


def read_mask(folder: DatasetFolder, path: Path, photo: Photo, mask_format: str = "auto",
              min_area: int = 0) -> Mask:
    """Read one PNG mask, check it against the upright photo and split it into wounds."""
    name = folder.name(path)
    _, im, _ = open_image(folder.read_bytes(path), name, ".png")
    if im.size != (photo.width, photo.height):
        hint = ""
        if im.size == (photo.height, photo.width) and photo.orientation >= 5:
            hint = (f"; the photo is rotated upright on import (EXIF orientation {photo.orientation}) and "
                    "this mask matches the unrotated photo: save it from a tool that applies EXIF orientation")
        raise DatasetError(f"{name}: mask size {im.width}×{im.height} differs from the upright image "
                           f"size {photo.width}×{photo.height}{hint}")
    array = _mask_array(im, name)
    return labels_and_geometry(array, mask_format, min_area, name)


def _mask_array(im: Image.Image, name: str) -> np.ndarray:
    """The mask's values: grey, palette index or the RGB channels' maximum. An alpha channel is
    read only to check it: wounds drawn in transparency alone, or colour and transparency that
    disagree on which pixels are drawn, are an error naming the values found."""
    if im.mode == "F":
        raise DatasetError(f"{name}: floating-point masks are not supported; use 8- or 16-bit PNG")
    array = np.asarray(im)
    if array.ndim != 3:
        return array
    colour = array[..., 0] if im.mode in ("LA", "La", "PA") else array[..., :3].max(axis=2)
    if "A" in im.mode or "a" in im.mode:
        alpha = array[..., -1]
        if alpha.min() != alpha.max():
            if colour.min() == colour.max():
                raise DatasetError(f"{name}: the wounds are drawn only in the alpha (transparency) channel (values "
                                   f"{_values(alpha)}); the colour is {int(colour.min())} everywhere. Save the mask "
                                   "as greyscale (0 = skin) without transparency")
            if ((colour > 0) != (alpha > 0)).any():
                raise DatasetError(f"{name}: colour (values {_values(colour)}) and alpha channel (values "
                                   f"{_values(alpha)}) mark different pixels; save the mask as greyscale "
                                   "(0 = skin) without transparency")
    return colour


def _values(array: np.ndarray, most: int = 12) -> str:
    """The distinct values of ``array``, for a message (the first ``most`` and how many more)."""
    values = np.unique(array)
    shown = ", ".join(str(int(v)) for v in values[:most])
    return shown + (f", … ({len(values) - most} more)" if len(values) > most else "")


def _flat_values(array: np.ndarray, below: float) -> list[int]:
    """Non-zero values under ``below`` that fill a 5×5 block somewhere: regions painted in that value.
    Anti-aliased edges and JPEG noise are gradients and specks, never a flat 5×5 block, except the
    background a JPEG shifted off 0 (the most common value, with 0 itself rare): that one is skin."""
    from scipy import ndimage  # here, not at import: --help stays fast
    candidates = (array > 0) & (array < below)
    if not candidates.any():
        return []
    values, counts = np.unique(array, return_counts=True)
    common = values[np.argmax(counts)]
    if common > 0 and (values[0] != 0 or counts[0] < 0.1 * counts.max()):
        candidates &= array != common
    flat = ndimage.minimum_filter(array, 5, mode="nearest") == ndimage.maximum_filter(array, 5, mode="nearest")
    return [int(v) for v in np.unique(array[flat & candidates])]


def mask_to_labels(mask: np.ndarray, mask_format: str = "auto", min_area: int = 0) -> np.ndarray:
    """A mask image array (H×W, or H×W×C: channel-wise maximum) → int32 label map (see
    :func:`labels_and_geometry`)."""
    mask = np.asarray(mask)
    if mask.ndim == 3:
        mask = mask[..., :3].max(axis=2)
    return labels_and_geometry(mask, mask_format, min_area).labels


def is_binary(values: np.ndarray) -> bool:
    """``auto`` rule: whether this mask is binary (possibly anti-aliased or noisy) rather than a label map.

    Binary when its values are only {0, 1}, or when its largest value is at least 128 and the pixels
    near that value (≥ ¾ of it) outnumber the in-between ones (¼–¾: anti-aliased edges), so that near-0
    and near-max noise (a mask once saved as JPEG) thresholds cleanly. A label map 1..N has most of
    its wound pixels at in-between values."""
    vmax = int(values.max(initial=0))
    if vmax <= 1:
        return True
    if vmax < 128:
        return False
    high = int(np.count_nonzero(values >= 0.75 * vmax))
    middle = int(np.count_nonzero((values > 0.25 * vmax) & (values < 0.75 * vmax)))
    return high > 0 and middle <= high


def labels_and_geometry(array: np.ndarray, mask_format: str = "auto", min_area: int = 0,
                        name: str = "mask") -> Mask:
    """Label map, per-wound area/bbox and dropped specks in one vectorised pass.

    ``binary`` (or ``auto`` when :func:`is_binary`): thresholded at half the largest value, split
    into 4-connected components, components under ``min_area`` dropped and the rest numbered 1..N
    in raster order. ``label``: values are wound indices, kept as they are; an index whose area is
    under ``min_area`` is dropped.

    Nothing is erased or merged silently: a mask read as binary that has flat regions (a 5×5 block
    of one value) of a value that thresholding would drop (``binary``: at most half the largest
    value) or that is not near the largest value (``auto``: under ¾ of it, e.g. a label map
    {1, 2, 255} with 255 = "ignore", or a 16-bit label map whose largest label dominates) is an
    error naming the values found and the ``mask_format`` to set."""
    from scipy import ndimage  # here, not at import: --help stays fast
    array = np.asarray(array)
    if array.size and array.min() < 0:
        raise DatasetError(f"{name}: negative mask values ({int(array.min())})")
    binary = mask_format == "binary" or (mask_format == "auto" and is_binary(array))
    if binary:
        vmax = int(array.max(initial=0))
        flat = _flat_values(array, vmax / 2 + 0.5 if mask_format == "binary" else 0.75 * vmax) if vmax > 1 else []
        if flat and mask_format == "binary":
            raise DatasetError(f"{name}: a binary mask (mask_format \"binary\") with regions of value(s) "
                               f"{', '.join(map(str, flat))}, at most half its largest value {vmax}: they would be "
                               f"read as skin (values found: {_values(array)}). Give every wound pixel one value, "
                               "or set \"mask_format\": \"label\" in dataset.json if each value is one wound")
        if flat:
            raise DatasetError(f"{name}: ambiguous mask: values found {_values(array)}, with regions of value(s) "
                               f"{', '.join(map(str, flat))} besides {vmax}. Read as binary (wound = over half "
                               f"of {vmax}) they would be dropped or merged. If each value is one wound, set "
                               "\"mask_format\": \"label\" in dataset.json (set pixels meaning 'ignore', e.g. "
                               "255, to 0 first); if it is a binary mask, give every wound pixel one value")
        labels, count = ndimage.label(array > vmax / 2 if vmax > 1 else array > 0)
        labels = labels.astype(np.int32, copy=False)
    else:
        vmax = int(array.max(initial=0))
        if vmax > MAX_WOUNDS_PER_MASK:
            raise DatasetError(f"{name}: wound index {vmax:,} is larger than {MAX_WOUNDS_PER_MASK:,}, the "
                               "most a workspace mask can store")
        labels, count = array.astype(np.int32), vmax
    areas = np.bincount(labels.ravel(), minlength=count + 1)
    small = (areas < max(int(min_area), 1)) & (areas > 0)
    small[0] = False
    dropped = []
    boxes = ndimage.find_objects(labels, max_label=count)
    for index in np.flatnonzero(small):
        dropped.append({"file": name, "area": int(areas[index]), "bbox": _bbox(boxes[index - 1]),
                        **({} if binary else {"wound_index": int(index)})})
    if binary:
        keep = areas > 0
        keep[0] = False
        keep &= ~small
        if int(keep.sum()) > MAX_WOUNDS_PER_MASK:
            raise DatasetError(f"{name}: {int(keep.sum()):,} separate wounds, more than "
                               f"{MAX_WOUNDS_PER_MASK:,}, the most a workspace mask can store")
        lut = (np.cumsum(keep) * keep).astype(np.int32)
        if small.any():
            labels = lut[labels]
        kept = np.flatnonzero(keep)
        geometry = {int(lut[i]): (int(areas[i]), _bbox(boxes[i - 1])) for i in kept}
    else:
        if small.any():
            lut = np.arange(count + 1, dtype=np.int32)
            lut[small] = 0
            labels = lut[labels]
        geometry = {int(i): (int(areas[i]), _bbox(boxes[i - 1]))
                    for i in np.flatnonzero((areas > 0) & ~small) if i > 0}
    return Mask(labels, geometry, dropped)


def _bbox(box: tuple[slice, slice]) -> list[int]:
    return [int(box[1].start), int(box[0].start), int(box[1].stop), int(box[0].stop)]


def wound_geometry(labels: np.ndarray, index: int) -> tuple[int, list[int]]:
    """Area in pixels and bounding box [x0, y0, x1, y1] (x1, y1 exclusive) of one wound."""
    ys, xs = np.nonzero(labels == index)
    if len(xs) == 0:
        return 0, [0, 0, 0, 0]
    return len(xs), [int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1]
