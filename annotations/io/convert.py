"""Outlines from other annotation tools → a TriDerm dataset folder (then ``python -m annotations import``).

``convert(fmt, src, out, images=…)`` reads one of

- **coco**: a COCO instance-segmentation file (``annotations.json``, or the folder holding it);
  ``segmentation`` as polygons (pixel-corner coordinates, COCO's convention), compressed RLE or
  uncompressed RLE (pycocotools). The TriDerm keys our export writes (``triderm_image_id``,
  ``triderm_wound_index``, ``description``) are read back, so our export converts back losslessly.
  An ``iscrowd: 1`` region is an ignore region, not a wound: it is checked, then left out (its pixels
  are skin unless a wound covers them; counted as ``crowd_regions_ignored``).
- **geojson**: a ``.geojson`` file or a folder of them (our export: ``<image_id>.geojson``; QuPath's
  "Export objects as GeoJSON"): Polygon/MultiPolygon features, holes kept; the photo is the
  feature's ``image_id`` property or else the file's name. A bare Polygon/MultiPolygon geometry (as
  QuPath writes one object) or a bare Feature is read as a collection of one feature.
- **labelstudio**: a Label Studio JSON export (a list of tasks): ``polygonlabels`` results (points
  in percent of ``original_width``/``original_height``) and ``brushlabels`` results (Label Studio's
  own bit-packed RLE, decoded by :func:`decode_brush_rle`). Of several annotations of one task the
  one marked ``ground_truth`` is read, else the last one not cancelled. The photo is the task's
  ``data.image``: of a local-files URL (``/data/local-files/?d=folder/x.jpg``, what Label Studio's
  COCO importer writes) the URL-decoded ``d`` parameter (its path, else its file name, under the
  photos folder); of an upload (``/data/upload/3/1a2b3c4d-x.jpg``), ``s3://``, ``gs://`` or
  ``http(s)://`` URL the URL-decoded last segment. What TriDerm's own export
  (:func:`annotations.io.formats.labelstudio_tasks`) adds is read back: the task's ``data.triderm_image_id``,
  a region id ``wound-N`` (wound index N, kept when every region of the photo has one) and the
  region's ``meta.text`` (its description, Label Studio's per-region note).
- **cvat**: a CVAT XML 1.1 file ("CVAT for images"): ``<polygon>`` and ``<mask>`` (RLE inside
  its ``left``/``top``/``width``/``height`` box) shapes; boxes, polylines and points are not
  outlines and are counted as ``skipped``; video tracks are refused. Each shape's ``z_order`` is read.

Polygons are rasterised by the one rule of :func:`annotations.io.formats.rasterize_rings`: a pixel is
inside when its centre is, a centre exactly on an edge when the inside lies to its right (or, on a
horizontal edge, below it), so outlines sharing an edge tile without gap or overlap and a polygon
keeps its area. The photos are looked up in ``images`` (default: the annotation file's folder, then
its ``images/`` subfolder) by the file name the annotation gives (Label Studio's upload prefix
``1a2b3c4d-`` is dropped when the plain name is what exists; a name without a photo suffix, as
GeoJSON gives, matches any). Image ids are the photos' names
without suffix (characters outside ``A-Z a-z 0-9 _ . -`` become ``_``) unless the file gives a
TriDerm id. Wounds are numbered in file order unless the file gives TriDerm indices.

The folder written: ``images/`` (the photos, byte for byte), ``masks/`` (label maps, one wound per
pixel), ``wounds.csv`` (``image_id, wound_index, description``; ``label``, the outline's label or
class, when one is not ``wound``; ``source_id``, the outline's id in the file: COCO annotation id,
Label Studio region id, GeoJSON feature id), ``images.csv`` (``image_id, patient_id`` empty,
``source_image_id``: COCO image id, Label Studio task id, CVAT image id; written when the file gives
them) and ``dataset.json`` (their column types). Import keeps these columns as metadata, and
:func:`annotations.io.exports.export` writes them back, so results can be merged into the
source (a file TriDerm exported gives its kept ids back: ``attributes.source_id`` of COCO, Label
Studio's ``data.source_image_id`` and ``meta.source_id``, not the ids TriDerm numbered).

Everything is read and checked before ``out`` appears: bad input raises one
:class:`~annotations.io.readers.DatasetError` naming the file and the field, and ``out`` is left as it was. A label map holds one wound per pixel, so a pixel two outlines cover goes
to one of them by the ``overlap`` rule (:data:`OVERLAP_RULES`): ``z-order`` (the default for CVAT:
the higher ``z_order``, then the later outline), ``later-wins`` (the default for the others: the
outline later in the file) or ``refuse`` (one error naming both). Wounds then left with fewer pixels
than ``min_area`` (default the workspace's :data:`~annotations.infra.workspace.DEFAULT_MIN_WOUND_AREA`,
which import applies) are dropped, one report line each in ``small_wounds_dropped``, so the folder
always imports.

Crafted files are refused the same way, before anything large is allocated: RLE counts (COCO lists
and compressed strings, CVAT ``rle``) must be whole numbers ≥ 0 summing exactly to the photo (COCO)
or the box (CVAT), a Label Studio brush must hold exactly width × height × 4 values, declared sizes
must be the photo's, and the photo's header is read within the import's pixel budget
(:data:`~annotations.io.readers.MAX_PIXELS`). JSON ``NaN``/``Infinity``, numbers that overflow a float
and nesting deeper than Python's recursion limit are errors; so are an outline enclosing no area (two
points, points on one line), one lying wholly outside its photo, a coordinate beyond ±1e9 pixels,
a wound index over 65,535, a COCO ``category_id`` missing from ``categories``, a source id (COCO,
Label Studio, GeoJSON, CVAT) that is neither a whole number nor 1 to :data:`MAX_SOURCE_ID` printable
characters, and a photo reached
through a symbolic link below the images folder. An outline that crosses itself is repaired (shapely
``make_valid``, "structure" method: the area its rings enclose) only up to
:data:`MAX_REPAIR_VERTICES` vertices (the repair's cost grows with the crossings, up to the square
of the vertices); a longer crossing outline is refused. Each outline is decoded within its bounding
box (polygons) or its band of columns or rows (RLE, the brush's read chunk by chunk), one at a
time, so memory and work stay about one label map of the photo plus each outline's box.
"""
from __future__ import annotations

import csv
import json
import math
import os
import re
import stat
import warnings
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import numpy as np
import shapely
from PIL import Image, UnidentifiedImageError
from shapely.geometry import MultiPolygon, Polygon, shape

from annotations.io.csvsafe import neutralise
from annotations.io.dataset import copy_photo
from annotations.infra.fileio import staged_folder, write_text
from annotations.io.formats import DEFAULT_LABEL, rasterize_window
from annotations.infra.workspace import DEFAULT_MIN_WOUND_AREA
from annotations.io.readers import (_PIL_FORMATS, IMAGE_SUFFIXES, MAX_FILE_BYTES, MAX_PIXELS, MAX_WOUNDS_PER_MASK,
                                    DatasetError, column_schema, valid_id)

SOURCES = ("coco", "geojson", "labelstudio", "cvat")
#: How a pixel two outlines cover is resolved: ``z-order`` (the higher CVAT ``z_order`` wins, then the
#: later outline; formats without one: as ``later-wins``), ``later-wins`` (the outline later in the
#: file), ``refuse`` (an error naming both).
OVERLAP_RULES = ("z-order", "later-wins", "refuse")
#: Most vertices of an outline that crosses itself and is repaired (shapely ``make_valid``, whose
#: cost grows with the number of crossings, up to the square of the vertex count); a larger crossing
#: outline is refused. Outlines that do not cross themselves may have any number of vertices.
MAX_REPAIR_VERTICES = 200
#: Largest coordinate of an outline, in pixels (far beyond any photo; larger ones overflow GEOS).
MAX_COORDINATE = 1e9
#: Longest text id of a photo or an outline kept from the file (``source_image_id``, ``source_id``).
MAX_SOURCE_ID = 200
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
_LS_PREFIX = re.compile(r"^[0-9a-f]{8}-")
#: The region id TriDerm's Label Studio export gives wound N (:func:`annotations.io.formats.labelstudio_tasks`).
_LS_WOUND_ID = re.compile(r"wound-([1-9][0-9]{0,4})")


@dataclass
class _Wound:
    """One outline as read: a geometry (pixel coordinates) or a checked RLE that ``decode`` turns into
    a bool mask and its top row and left column in the photo of the declared size (called only once
    that size is the photo's)."""

    where: str
    geometry: Polygon | MultiPolygon | None = None
    decode: Callable[[], tuple[np.ndarray, int, int]] | None = None
    label: str = ""
    description: str = ""
    index: int | None = None
    z: int = 0  # CVAT's z_order: drawn above the outlines of a lower one
    crowd: bool = False  # COCO iscrowd: an ignore region, never a wound
    source_id: int | str | None = None  # the outline's id in the file (kept as wound metadata ``source_id``)


@dataclass
class _Photo:
    where: str  # file and field naming this photo, for errors
    name: str  # the file name the annotation gives
    size: tuple[int, int] | None = None  # (width, height) the annotation declares
    image_id: str | None = None
    wounds: list[_Wound] = field(default_factory=list)
    source_id: int | str | None = None  # the photo's id in the file (kept as image metadata ``source_image_id``)


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is too large a number")
    return value


def _check_size(path: Path) -> None:
    """Refuse an annotation file larger than the largest file import reads (before reading it)."""
    try:
        size = path.stat().st_size
    except OSError as err:
        raise DatasetError(f"{path}: cannot be read ({err.strerror})") from None
    if size > MAX_FILE_BYTES:
        raise DatasetError(f"{path}: {size:,} bytes, more than the {MAX_FILE_BYTES:,} allowed")


def _load_json(path: Path) -> Any:
    """A JSON file; NaN, Infinity, numbers that overflow a float and nesting too deep for Python are errors."""
    _check_size(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"), parse_constant=_no_constant, parse_float=_finite)
    except RecursionError:
        raise DatasetError(f"{path}: not a readable JSON file (nested too deeply)") from None
    except (OSError, UnicodeDecodeError, ValueError) as err:  # json.JSONDecodeError is a ValueError
        raise DatasetError(f"{path}: not a readable JSON file ({err})") from None


def _need(obj: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise DatasetError(f"{where}: missing field {key!r}")
    if not isinstance(obj[key], kind) or isinstance(obj[key], bool):
        raise DatasetError(f"{where}: field {key!r} has the wrong type ({type(obj[key]).__name__})")
    return obj[key]


def _whole(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _source_id(value: Any, where: str) -> int | str | None:
    """An id the file gives (a whole number or text of 1 to :data:`MAX_SOURCE_ID` printable characters),
    kept so an export writes it back; ``None`` when absent, one DatasetError when malformed."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and 0 < len(value) <= MAX_SOURCE_ID and value.isprintable() and value == value.strip():
        return value
    raise DatasetError(f"{where}: {value!r:.60} is not an id (a whole number, or 1 to {MAX_SOURCE_ID} printable "
                       "characters without surrounding spaces)")


def _kept_id(item: dict, own_keys: tuple[str, ...], where: str) -> int | str | None:
    """The source id of a COCO image or annotation: ``attributes.source_id`` (what TriDerm's export writes;
    Datumaro's COCO reader, which CVAT uses, keeps ``attributes``) when present, else its ``id`` unless the item is TriDerm's own (it
    carries ``own_keys``: then the ``id`` is the export's numbering)."""
    attributes = item.get("attributes")
    if isinstance(attributes, dict) and "source_id" in attributes:
        return _source_id(attributes["source_id"], f"{where}.attributes.source_id")
    if any(k in item for k in own_keys):
        return None
    return _source_id(item.get("id"), f"{where}.id")


def _photo_dims(w: int, h: int, where: str) -> tuple[int, int]:
    if not (w > 0 and h > 0 and w * h <= MAX_PIXELS):
        raise DatasetError(f"{where}: size {w}×{h} is not a photo size (1 to {MAX_PIXELS:,} pixels)")
    return w, h


def _size(obj: dict, wkey: str, hkey: str, where: str) -> tuple[int, int]:
    return _photo_dims(_need(obj, wkey, int, where), _need(obj, hkey, int, where), where)


def _outline(geometry: Any, where: str) -> Polygon | MultiPolygon:
    """The polygonal part of ``geometry``, repaired (shapely ``make_valid``) when it crosses itself;
    an outline enclosing no area (two points, points on one line) is an error."""
    coords = shapely.get_coordinates(geometry)
    if coords.size and not np.abs(coords).max() <= MAX_COORDINATE:  # also catches NaN
        raise DatasetError(f"{where}: a coordinate is beyond ±{MAX_COORDINATE:g} pixels (or not a number)")
    if not geometry.is_valid:
        rings = sum(1 + shapely.get_num_interior_rings(part) for part in shapely.get_parts(geometry))
        vertices = int(shapely.get_num_coordinates(geometry)) - rings  # a ring repeats its first vertex last
        if vertices > MAX_REPAIR_VERTICES:
            raise DatasetError(f"{where}: the outline crosses itself and has {vertices:,} vertices; outlines "
                               f"of more than {MAX_REPAIR_VERTICES} vertices are not repaired (fix it in the "
                               "tool that drew it)")
        geometry = shapely.make_valid(geometry, method="structure", keep_collapsed=False)
    parts = [g for g in shapely.get_parts(geometry) if isinstance(g, (Polygon, MultiPolygon))]
    area = shapely.union_all(parts) if parts else Polygon()
    if area.is_empty or area.area <= 0:
        raise DatasetError(f"{where}: the outline encloses no area (fewer than three points off one line)")
    return area


def _polygon(coords: list, where: str) -> Polygon | MultiPolygon:
    """A polygon from a flat [x1, y1, x2, y2, …] list, repaired when it crosses itself."""
    if (not isinstance(coords, list) or len(coords) < 6 or len(coords) % 2
            or not all(isinstance(c, (int, float)) and not isinstance(c, bool) and math.isfinite(c) for c in coords)):
        raise DatasetError(f"{where}: a polygon needs at least three x, y pairs of finite numbers")
    return _outline(Polygon(np.asarray(coords, float).reshape(-1, 2)), where)


# --- run-length encodings ----------------------------------------------------------------------

def _checked_counts(counts: list, area: int, where: str, what: str) -> list[int]:
    """``counts`` when they are whole numbers ≥ 0 summing exactly to ``area`` (checked in Python
    integers, one by one, before anything is allocated); else one DatasetError."""
    total = 0
    for k, c in enumerate(counts):
        if not isinstance(c, int) or isinstance(c, bool) or c < 0:
            raise DatasetError(f"{where}: count {k + 1} ({c!r:.40}) is not a whole number ≥ 0")
        total += c
        if total > area:
            raise DatasetError(f"{where} covers more than the {area:,} pixels of {what}")
    if total != area:
        raise DatasetError(f"{where} covers {total:,} pixels, not the {area:,} of {what}")
    return counts


def coco_counts(text: str, where: str) -> list[int]:
    """The run lengths of a COCO compressed RLE string (pycocotools' ``rleFrString``: 5 bits a
    character from ``'0'``, a continuation bit, sign-extended, counts after the second stored as the
    difference to the one two before). A malformed string is one DatasetError."""
    counts: list[int] = []
    pos = 0
    while pos < len(text):
        value, shift, more = 0, 0, True
        while more:
            if pos == len(text):
                raise DatasetError(f"{where}: counts string ends inside a number")
            c = ord(text[pos]) - 48
            if not 0 <= c < 64:
                raise DatasetError(f"{where}: counts string holds {text[pos]!r} (position {pos + 1}), not a "
                                   "COCO RLE character")
            if shift > 60:
                raise DatasetError(f"{where}: counts string holds a number too long to be a count")
            value |= (c & 0x1F) << shift
            more = bool(c & 0x20)
            pos += 1
            shift += 5
            if not more and c & 0x10:
                value -= 1 << shift
        counts.append(value + counts[-2] if len(counts) > 2 else value)
    return counts


def _runs(counts: list[int], shape_hw: tuple[int, int], column_major: bool) -> tuple[np.ndarray, int, int]:
    """Checked run lengths (off, on, off, …) filling ``shape_hw`` row by row or, as COCO stores it,
    column by column: the one decoder of every RLE here (COCO, CVAT). Only the rows (columns) from
    the first to the last one covered are decoded: the mask of that band, its top row and left column."""
    h, w = shape_hw
    line = h if column_major else w  # pixels per column (row)
    runs = np.asarray(counts, np.int64)
    ends = np.cumsum(runs)  # ≤ the area: the counts are checked
    on = (np.arange(len(runs)) % 2 == 1) & (runs > 0)
    if not on.any():
        return np.zeros((0, 0), bool), 0, 0
    first, last = int((ends - runs)[on].min()) // line, int(ends[on].max() - 1) // line + 1
    clipped = np.diff(np.clip(np.concatenate([[0], ends]), first * line, last * line))
    band = np.repeat(np.arange(len(runs)) % 2 == 1, clipped).reshape(last - first, line)
    return (band.T, 0, first) if column_major else (band, first, 0)


# --- COCO --------------------------------------------------------------------------------------

def read_coco(path: Path) -> list[_Photo]:
    """The photos and outlines of a COCO file."""
    doc = _load_json(path)
    name = path.name
    images = _need(doc, "images", list, name)
    listed = doc.get("categories", [])
    categories = {c.get("id"): str(c.get("name", "")) for c in listed if isinstance(c, dict)
                  if isinstance(c.get("id"), (int, str))} if isinstance(listed, list) else {}
    photos: dict[Any, _Photo] = {}
    for n, img in enumerate(images):
        here = f"{name}: images[{n}]"
        image_id = _need(img, "id", (int, str), here)
        if image_id in photos:
            raise DatasetError(f"{here}: id {image_id!r} is used twice")
        tid = img.get("triderm_image_id")
        photos[image_id] = _Photo(here, _need(img, "file_name", str, here), _size(img, "width", "height", here),
                                  tid if isinstance(tid, str) else None,
                                  source_id=_kept_id(img, ("triderm_image_id",), here))
    for n, ann in enumerate(_need(doc, "annotations", list, name)):
        here = f"{name}: annotations[{n}]"
        photo = photos.get(_need(ann, "image_id", (int, str), here))
        if photo is None:
            raise DatasetError(f"{here}: image_id {ann['image_id']!r} is not in images")
        assert photo.size is not None  # a COCO image declares its width and height
        w, h = photo.size
        seg = _need(ann, "segmentation", (list, dict), here)
        category = _need(ann, "category_id", (int, str), here)
        if category not in categories:
            raise DatasetError(f"{here}: category_id {category!r} is not in categories")
        wound = _Wound(f"{here}.segmentation", label=categories[category],
                       description=str(ann.get("description", "")),
                       index=_whole(ann.get("triderm_wound_index")), crowd=_whole(ann.get("iscrowd")) == 1,
                       source_id=_kept_id(ann, ("triderm_wound_index",), here))
        if isinstance(seg, list):
            polys = [_polygon(p, f"{here}.segmentation[{k}]") for k, p in enumerate(seg)]
            wound.geometry = shapely.union_all(polys)
        else:
            if seg.get("size") != [h, w]:
                raise DatasetError(f"{here}.segmentation: size {seg.get('size')!r:.60} is not the photo's [{h}, {w}]")
            counts = seg.get("counts")
            if not isinstance(counts, (list, str)):
                raise DatasetError(f"{here}.segmentation: counts is not a COCO RLE (a list of run lengths "
                                   f"or a compressed string), got {type(counts).__name__}")
            checked = _checked_counts(counts if isinstance(counts, list)
                                      else coco_counts(counts, f"{here}.segmentation.counts"),
                                      w * h, f"{here}.segmentation.counts", f"the {w}×{h} photo")
            wound.decode = lambda c=checked, hw=(h, w): _runs(c, hw, column_major=True)
        photo.wounds.append(wound)
    return list(photos.values())


# --- GeoJSON -----------------------------------------------------------------------------------

def read_geojson(files: list[Path]) -> list[_Photo]:
    """The photos and outlines of GeoJSON files (FeatureCollections, or lists of features)."""
    photos: dict[str, _Photo] = {}
    for path in files:
        doc = _load_json(path)
        kind = doc.get("type") if isinstance(doc, dict) else None
        if kind in ("Polygon", "MultiPolygon"):  # a bare geometry (QuPath writes them): one feature
            doc = [{"type": "Feature", "geometry": doc, "properties": {}}]
        elif kind == "Feature":  # a bare feature: a collection of one
            doc = [doc]
        features = doc.get("features") if isinstance(doc, dict) else doc
        if not isinstance(features, list):
            raise DatasetError(f"{path.name}: missing field 'features' (expected a FeatureCollection, a Feature "
                               "or a Polygon/MultiPolygon geometry)")
        for n, feat in enumerate(features):
            here = f"{path.name}: features[{n}]"
            props = feat.get("properties") if isinstance(feat, dict) else None
            props = props if isinstance(props, dict) else {}
            geom = _need(feat, "geometry", dict, here)
            if geom.get("type") not in ("Polygon", "MultiPolygon"):
                raise DatasetError(f"{here}.geometry: type {geom.get('type')!r} is not an outline "
                                   "(Polygon or MultiPolygon)")
            try:
                g = shape(geom)
            except (ValueError, TypeError, AttributeError, IndexError, KeyError,
                    shapely.errors.ShapelyError) as err:
                raise DatasetError(f"{here}.geometry: not a valid GeoJSON geometry ({err})") from None
            g = _outline(g, f"{here}.geometry")
            image_id = props.get("image_id") if isinstance(props.get("image_id"), str) else None
            key = image_id or path.stem
            photo = photos.setdefault(key, _Photo(here, key, None, image_id))
            if photo.source_id is None:
                photo.source_id = _source_id(props.get("source_image_id"), f"{here}.properties.source_image_id")
            cls = props.get("classification")
            photo.wounds.append(_Wound(f"{here}.geometry", geometry=g,
                                       label=str(cls.get("name", "")) if isinstance(cls, dict) else "",
                                       description=str(props.get("description", "")),
                                       index=_whole(props.get("wound_index")),
                                       source_id=_source_id(feat.get("id"), f"{here}.id")))
    return list(photos.values())


# --- Label Studio ------------------------------------------------------------------------------

def _brush_chunks(rle: list[int], expected: int | None) -> Iterator[tuple[int, int, int | list[int]]]:
    """The chunks of Label Studio's brush RLE (the rle-pack format of thi.ng/umbrella): (first word,
    end word, the repeated word or the literal words), after its count is checked (against
    ``expected`` when given). A malformed stream is a ValueError.

    The stream: 32 bits count, 5 bits word size − 1, four 4-bit run-length sizes − 1, then chunks
    of one bit (1: a repeated word, 0: literal words), 2 bits choosing the run-length size and the
    run length − 1. (Written here because the reference decoder ships inside the label-studio-sdk
    package, whose pinned dependencies this project does not need.)"""
    if not all(isinstance(b, int) and not isinstance(b, bool) and 0 <= b < 256 for b in rle):
        raise ValueError("the RLE must be a list of bytes (whole numbers 0 to 255)")
    data = bytes(rle) + bytes(4)  # padding: a read of up to 32 bits never runs past the end
    total = 8 * len(rle)
    pos = 0

    def read(n: int) -> int:
        nonlocal pos
        if pos + n > total:
            raise ValueError("the RLE ends early")
        first = pos >> 3
        v = (int.from_bytes(data[first:first + 5], "big") >> (40 - (pos & 7) - n)) & ((1 << n) - 1)
        pos += n
        return v

    num, word = read(32), read(5) + 1
    sizes = [read(4) + 1 for _ in range(4)]
    if expected is not None and num != expected:
        raise ValueError(f"{num:,} values, expected {expected:,}")
    if num > 4 * MAX_PIXELS:
        raise ValueError(f"{num} values is more than a photo holds")
    yield 0, num, word  # the count and the word size first
    i = 0
    while i < num:
        repeated = read(1)
        j = min(num, i + 1 + read(sizes[read(2)]))
        yield i, j, read(word) if repeated else [read(word) for _ in range(i, j)]
        i = j


def decode_brush_rle(rle: list[int], expected: int | None = None) -> np.ndarray:
    """Label Studio's brush RLE → its flat array of words (see :func:`_brush_chunks`); the count is
    checked before the words are allocated."""
    chunks = _brush_chunks(rle, expected)
    _, num, word = next(chunks)
    assert isinstance(word, int)  # the first chunk is the header: count, word size
    out = np.zeros(num, np.uint8 if word <= 8 else np.uint16 if word <= 16 else np.uint32)
    for i, j, values in chunks:
        out[i:j] = values
    return out


def _brush_counts(rle: list[int], w: int, h: int) -> list[int]:
    """Run lengths (off, on, …, row by row) of the pixels of a brush RLE of w×h RGBA words whose alpha
    (every fourth word) is ≥ 128, read chunk by chunk without expanding the words."""
    chunks = _brush_chunks(rle, w * h * 4)
    next(chunks)
    spans: list[list[int]] = []  # [first pixel, end pixel] of the pixels on, in order
    for i, j, values in chunks:
        if isinstance(values, int):  # alpha words are 4p + 3: pixels ⌈(i − 3) / 4⌉ up to ⌈(j − 3) / 4⌉
            found = [(-(-(i - 3) // 4), -(-(j - 3) // 4))] if values >= 128 else []
        else:
            found = [(k // 4, k // 4 + 1) for k, v in enumerate(values, start=i) if k % 4 == 3 and v >= 128]
        for a, b in found:
            if a >= b:
                continue
            if spans and spans[-1][1] == a:
                spans[-1][1] = b
            else:
                spans.append([a, b])
    counts, at = [], 0
    for a, b in spans:
        counts += [a - at, b - a]
        at = b
    return [*counts, w * h - at]


def _ls_annotation(task: dict, here: str) -> tuple[dict | None, str]:
    listed = task.get("annotations") or []
    if not isinstance(listed, list):
        raise DatasetError(f"{here}.annotations: must be a list, got {type(listed).__name__}")
    anns = [a for a in listed if isinstance(a, dict) and not a.get("was_cancelled")]
    if not anns:
        return None, here
    chosen = next((a for a in anns if a.get("ground_truth")), anns[-1])
    return chosen, f"{here}.annotations[{task['annotations'].index(chosen)}]"


def _ls_photo_name(url: str, where: str) -> str:
    """The photo's file name in a Label Studio image reference: the ``d`` query parameter of a
    local-files URL (``/data/local-files/?d=folder/x.jpg``, URL-decoded: its path below the photos
    folder), else the URL's last path segment (``/data/upload/3/1a2b3c4d-x.jpg``, ``s3://``,
    ``gs://``, ``http(s)://``, URL-decoded)."""
    parts = urlsplit(url)
    local = parse_qs(parts.query).get("d")
    name = local[0] if local else unquote(parts.path).rsplit("/", 1)[-1]
    if not name.strip("/"):
        raise DatasetError(f"{where}: no file name in the image reference {url!r:.120}")
    return name


def read_labelstudio(path: Path) -> list[_Photo]:
    """The photos and outlines of a Label Studio JSON export."""
    tasks = _load_json(path)
    if not isinstance(tasks, list):
        raise DatasetError(f"{path.name}: expected a list of tasks (Label Studio's JSON export)")
    photos = []
    for n, task in enumerate(tasks):
        here = f"{path.name}: [{n}]"
        data = _need(task, "data", dict, here)
        url = data.get("image") if isinstance(data.get("image"), str) else \
            next((v for v in data.values() if isinstance(v, str)), None)
        if url is None:
            raise DatasetError(f"{here}.data: no image reference")
        tid = data.get("triderm_image_id")
        photo = _Photo(f"{here}.data", _ls_photo_name(url, f"{here}.data"), image_id=tid if isinstance(tid, str) else None,
                       source_id=_source_id(data["source_image_id"], f"{here}.data.source_image_id")
                       if "source_image_id" in data else _source_id(task.get("id"), f"{here}.id"))
        photos.append(photo)
        ann, where = _ls_annotation(task, here)
        results = ann.get("result") or [] if ann else []
        if not isinstance(results, list):
            raise DatasetError(f"{where}.result: must be a list of results, got {type(results).__name__}")
        for k, res in enumerate(results):
            rhere = f"{where}.result[{k}]"
            kind = res.get("type") if isinstance(res, dict) else None
            if kind not in ("polygonlabels", "brushlabels"):
                continue
            size = _size(res, "original_width", "original_height", rhere)
            if photo.size not in (None, size):
                raise DatasetError(f"{rhere}: original size {size} differs from another result's {photo.size}")
            photo.size = size
            value = _need(res, "value", dict, rhere)
            labels = value.get(kind) or []
            meta = res.get("meta")
            text = meta.get("text") if isinstance(meta, dict) else None
            index = _LS_WOUND_ID.fullmatch(str(res.get("id", "")))
            kept = meta.get("source_id") if isinstance(meta, dict) else None
            wound = _Wound(f"{rhere}.value", label=str(labels[0]) if isinstance(labels, list) and labels else "",
                           description=str(text[0]) if isinstance(text, list) and text else "",
                           index=int(index[1]) if index else None,
                           source_id=_source_id(kept, f"{rhere}.meta.source_id") if kept is not None
                           else None if index else _source_id(res.get("id"), f"{rhere}.id"))
            w, h = size
            if kind == "polygonlabels":
                pts = _need(value, "points", list, rhere + ".value")
                try:
                    coords = [float(p[k]) * (w, h)[k] / 100 for p in pts for k in (0, 1)]
                except (TypeError, ValueError, IndexError, KeyError):
                    raise DatasetError(f"{rhere}.value.points: must be [x, y] pairs in percent") from None
                wound.geometry = _polygon(coords, f"{rhere}.value.points")
            else:
                if value.get("format") != "rle":
                    raise DatasetError(f"{rhere}.value: format {value.get('format')!r} is not 'rle'")
                wound.decode = lambda rle=_need(value, "rle", list, rhere + ".value"), w=w, h=h, at=rhere: \
                    _brush_mask(rle, w, h, f"{at}.value.rle")
            photo.wounds.append(wound)
    return photos


def _brush_mask(rle: list, w: int, h: int, where: str) -> tuple[np.ndarray, int, int]:
    """The mask (alpha ≥ 128) of a Label Studio brush RLE of w×h RGBA words, within its band of rows."""
    try:
        counts = _brush_counts(rle, w, h)
    except ValueError as err:
        raise DatasetError(f"{where}: not a Label Studio brush RLE of {w}×{h}×4 (RGBA) values ({err})") from None
    return _runs(counts, (h, w), column_major=False)


# --- CVAT --------------------------------------------------------------------------------------

_CVAT_NUMBER = re.compile(r"\s*-?[0-9]{1,12}(\.[0-9]{0,12})?\s*")
_CVAT_COUNT = re.compile(r"\s*[0-9]{1,12}\s*")


def _cvat_int(el: ET.Element, key: str, where: str) -> int:
    """A whole pixel coordinate or size (CVAT writes them as whole numbers, sometimes with '.0')."""
    text = el.attrib.get(key)
    if text is None or not _CVAT_NUMBER.fullmatch(text) or float(text) != int(float(text)):
        raise DatasetError(f"{where}: attribute {key!r} is missing or not a whole number ({text!r:.40})")
    return int(float(text))


def _cvat_counts(el: ET.Element, area: int, where: str, what: str) -> list[int]:
    cells = el.attrib.get("rle", "").split(",")
    for k, cell in enumerate(cells):
        if not _CVAT_COUNT.fullmatch(cell):
            raise DatasetError(f"{where}: attribute 'rle' count {k + 1} ({cell.strip()!r:.40}) is not a count (a "
                               "whole number ≥ 0 of at most 12 digits; expected comma-separated counts)")
    return _checked_counts([int(c) for c in cells], area, f"{where}: rle", what)


def read_cvat(path: Path) -> tuple[list[_Photo], int]:
    """The photos and outlines of a CVAT XML 1.1 file; also how many non-outline shapes were skipped."""
    _check_size(path)
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as err:
        raise DatasetError(f"{path.name}: not a readable XML file ({err})") from None
    name = path.name
    if root.tag != "annotations":
        raise DatasetError(f"{name}: the root element is <{root.tag}>, expected <annotations> (CVAT XML 1.1)")
    if root.find("track") is not None:
        raise DatasetError(f"{name}: <track> elements (CVAT for video) are not supported; export as "
                           "'CVAT for images 1.1'")
    photos, skipped = [], 0
    for n, img in enumerate(root.iter("image")):
        here = f"{name}: <image> {n + 1}"
        if "name" not in img.attrib:
            raise DatasetError(f"{here}: attribute 'name' is missing")
        w, h = _photo_dims(_cvat_int(img, "width", here), _cvat_int(img, "height", here), here)
        photo = _Photo(here, img.attrib["name"], (w, h),
                       source_id=_cvat_int(img, "id", here) if "id" in img.attrib else None)
        for k, el in enumerate(img):
            shere = f"{here} <{el.tag}> {k + 1}"
            attrs = {a.get("name"): (a.text or "") for a in el.iter("attribute")}
            wound = _Wound(shere, label=el.get("label", ""), description=attrs.get("description", ""),
                           z=_cvat_int(el, "z_order", shere) if "z_order" in el.attrib and el.tag in ("polygon", "mask")
                           else 0)
            if el.tag == "polygon":
                try:
                    coords = [float(c) for pt in el.attrib["points"].split(";") for c in pt.split(",")]
                except (KeyError, ValueError):
                    raise DatasetError(f"{shere}: attribute 'points' is missing or not 'x,y;x,y;…'") from None
                wound.geometry = _polygon(coords, f"{shere} points")
            elif el.tag == "mask":
                left, top = _cvat_int(el, "left", shere), _cvat_int(el, "top", shere)
                bw, bh = _cvat_int(el, "width", shere), _cvat_int(el, "height", shere)
                if not (bw >= 1 and bh >= 1 and left >= 0 and top >= 0 and left + bw <= w and top + bh <= h):
                    raise DatasetError(f"{shere}: the box {bw}×{bh} at ({left}, {top}) is not inside the {w}×{h} photo")
                counts = _cvat_counts(el, bw * bh, shere, f"its {bw}×{bh} box")
                wound.decode = lambda c=counts, box=(left, top, bw, bh): _boxed(c, box)
            else:
                skipped += el.tag in ("box", "polyline", "points", "ellipse", "cuboid", "skeleton")
                continue
            photo.wounds.append(wound)
        photos.append(photo)
    return photos, skipped


def _boxed(counts: list[int], box: tuple[int, int, int, int]) -> tuple[np.ndarray, int, int]:
    left, top, bw, bh = box
    band, row, _ = _runs(counts, (bh, bw), column_major=False)
    return band, top + row, left


# --- writing the dataset folder ----------------------------------------------------------------

def _find_photo(images: list[Path], name: str, where: str) -> Path:
    rel = Path(name)
    tries = [] if rel.is_absolute() or ".." in rel.parts else [rel]
    tries += [Path(rel.name), Path(_LS_PREFIX.sub("", rel.name))]
    if rel.suffix.lower() not in IMAGE_SUFFIXES:  # a bare image id (GeoJSON): any photo suffix
        tries += [Path(rel.name + s) for suffix in IMAGE_SUFFIXES for s in (suffix, suffix.upper())]
    for folder in images:
        for t in tries:
            if (folder / t).is_file():
                _no_link_below(folder, t, where)
                return folder / t
    raise DatasetError(f"{where}: photo {name!r} not found in {' or '.join(map(str, images))}")


def _no_link_below(folder: Path, rel: Path, where: str) -> None:
    """Refuse a photo that is, or is reached through, a symbolic link below ``folder`` (links are never
    followed, as in :class:`~annotations.io.readers.DatasetFolder`), before its header is read."""
    for k in range(1, len(rel.parts) + 1):
        sub = folder.joinpath(*rel.parts[:k])
        if stat.S_ISLNK(os.lstat(sub).st_mode):
            raise DatasetError(f"{where}: {sub}: is a symbolic link; links are never followed (replace it "
                               f"with a copy of the {'file' if k == len(rel.parts) else 'folder'})")


def _photo_size(path: Path, where: str) -> tuple[int, int]:
    """The photo's upright size (as the import stores it), read from its header within the import's
    pixel budget (:data:`~annotations.io.readers.MAX_PIXELS`)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path, formats=_PIL_FORMATS[path.suffix.lower()]) as im:
                w, h = im.size
                if w * h > MAX_PIXELS:
                    raise DatasetError(f"{where}: {path.name} is {w}×{h} = {w * h:,} pixels, more than the "
                                       f"{MAX_PIXELS:,} allowed")
                return (h, w) if im.getexif().get(0x0112, 1) in (5, 6, 7, 8) else (w, h)  # turned a quarter
    except DatasetError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
        raise DatasetError(f"{where}: {path.name} has more than the {MAX_PIXELS:,} pixels allowed ({err})") from None
    except (OSError, UnidentifiedImageError, ValueError, SyntaxError) as err:
        raise DatasetError(f"{where}: {path.name} is not a readable photo ({err})") from None


def _image_id(photo: _Photo, path: Path) -> str:
    image_id = photo.image_id or _UNSAFE.sub("_", path.stem).lstrip("_.-")
    if not valid_id(image_id):
        raise DatasetError(f"{photo.where}: cannot make an image id from {photo.name!r}")
    return image_id


@dataclass
class _Painted:
    """A photo's label map and what painting its outlines gave."""

    labels: np.ndarray
    wounds: list[tuple[int, _Wound]]  # (index, wound), the wounds kept
    empty: int = 0  # outlines covering no pixel centre
    crowd: int = 0  # COCO iscrowd regions left out
    overlap_px: int = 0  # pixels an outline took from another (by the overlap rule)
    dropped: list[str] = field(default_factory=list)  # report lines: wounds under the minimum area


def _decoded(wound: _Wound, photo: _Photo, shape_hw: tuple[int, int]) -> tuple[np.ndarray, int, int]:
    """The wound's mask within its box (polygons rasterised by :func:`~annotations.io.formats.rasterize_rings`)."""
    if wound.decode is not None:
        return wound.decode()
    assert wound.geometry is not None  # every outline is a geometry or an RLE
    x0, y0, x1, y1 = wound.geometry.bounds
    if x0 >= shape_hw[1] or y0 >= shape_hw[0] or x1 <= 0 or y1 <= 0:
        raise DatasetError(f"{wound.where}: the outline ({x0:g}, {y0:g})–({x1:g}, {y1:g}) lies wholly "
                           f"outside the {shape_hw[1]}×{shape_hw[0]} photo {photo.name!r}")
    return rasterize_window(wound.geometry, shape_hw)


def _label_map(photo: _Photo, shape_hw: tuple[int, int], overlap: str, min_area: int) -> _Painted:
    """The photo's label map. Outlines are painted one at a time (in file order, or by rising z-order
    for ``z-order``): a pixel two outlines cover goes to the one painted later (``refuse``: an error).
    COCO crowd regions are not painted. Wounds then left with fewer than ``min_area`` pixels are
    dropped (a report line each); the rest are numbered in file order unless the file gives indices."""
    wounds = [w for w in photo.wounds if not w.crowd]
    given = [w.index for w in wounds]
    indices = [i for i in given if isinstance(i, int) and i >= 1]
    use_given = bool(given) and len(indices) == len(given)
    if use_given and len(set(indices)) != len(indices):
        raise DatasetError(f"{photo.where}: wound index {max(indices, key=indices.count)} is given twice")
    most = max(indices) if use_given else len(given)
    if most > MAX_WOUNDS_PER_MASK:
        raise DatasetError(f"{photo.where}: wound index {most:,} is larger than {MAX_WOUNDS_PER_MASK:,}, the most a "
                           "label map (16-bit PNG) can store")
    labels = np.zeros(shape_hw, np.uint8 if most <= 255 else np.uint16)
    order = sorted(range(len(wounds)), key=lambda k: wounds[k].z) if overlap == "z-order" else range(len(wounds))
    out = _Painted(labels, [], crowd=len(photo.wounds) - len(wounds))
    drawn = np.zeros(len(wounds) + 1, np.int64)  # pixels each wound painted (by its position + 1)
    for k in order:  # one wound at a time, within its bounding box (or band); painted as position + 1
        mask, top, left = _decoded(wounds[k], photo, shape_hw)
        if not mask.any():
            out.empty += 1
            continue
        view = labels[top:top + mask.shape[0], left:left + mask.shape[1]]
        clash = view[mask]
        taken = clash[clash > 0]
        if taken.size and overlap == "refuse":
            first = int(taken[0]) - 1
            raise DatasetError(f"{wounds[k].where}: overlaps {wounds[first].where} by {taken.size} px (a label map "
                               "holds one wound per pixel; choose --overlap z-order or later-wins to let one win)")
        out.overlap_px += int(taken.size)
        view[mask] = k + 1
        drawn[k + 1] = int(mask.sum())
    areas = np.bincount(labels.ravel(), minlength=len(wounds) + 1)
    lut = np.zeros(len(wounds) + 1, labels.dtype)
    for k, wound in enumerate(wounds):
        if not drawn[k + 1]:
            continue
        if areas[k + 1] < max(min_area, 1):
            note = f" ({drawn[k + 1] - areas[k + 1]} px covered by outlines drawn over it)" if areas[k + 1] < drawn[k + 1] else ""
            out.dropped.append(f"{wound.where}: {areas[k + 1]} px{note}, under the minimum wound area of {min_area} px;"
                               " dropped")
            continue
        index = indices[k] if use_given else len(out.wounds) + 1
        lut[k + 1] = index
        out.wounds.append((index, wound))
    out.labels = lut[labels]
    return out


def _write(photos: list[_Photo], images: list[Path], out: Path, name: str, synthetic: bool,
           overlap: str, min_area: int, skipped: int = 0) -> dict[str, Any]:
    out = Path(out)
    with staged_folder(out, DatasetError) as stage:
        (stage / "images").mkdir()
        (stage / "masks").mkdir()
        rows: list[dict[str, Any]] = []
        image_rows: list[dict[str, Any]] = []
        seen: dict[str, str] = {}
        empty = crowd = overlap_px = 0
        dropped: list[str] = []
        for photo in photos:
            path = _find_photo(images, photo.name, photo.where)
            if path.suffix.lower() not in IMAGE_SUFFIXES:
                raise DatasetError(f"{photo.where}: {path.name} is not a {', '.join(IMAGE_SUFFIXES)} photo")
            image_id = _image_id(photo, path)
            if image_id in seen:
                raise DatasetError(f"{photo.where}: image id {image_id!r} again (also {seen[image_id]})")
            seen[image_id] = photo.where
            size = _photo_size(path, photo.where)
            if photo.size not in (None, size):
                raise DatasetError(f"{photo.where}: size {photo.size[0]}×{photo.size[1]} is not the photo's "
                                   f"upright {size[0]}×{size[1]} ({path})")
            painted = _label_map(photo, (size[1], size[0]), overlap, min_area)
            empty, crowd, overlap_px = empty + painted.empty, crowd + painted.crowd, overlap_px + painted.overlap_px
            dropped += painted.dropped
            copy_photo(path, stage / "images" / f"{image_id}{path.suffix.lower()}")
            if painted.wounds:
                Image.fromarray(painted.labels).save(stage / "masks" / f"{image_id}.png")
            rows += [{"image_id": image_id, "wound_index": i, "description": w.description, "label": w.label or None,
                      "source_id": w.source_id} for i, w in sorted(painted.wounds, key=lambda iw: iw[0])]
            image_rows.append({"image_id": image_id, "patient_id": "", "source_image_id": photo.source_id})
        extra = [c for c in ("label", "source_id") if any(r[c] is not None for r in rows)]
        if extra[:1] == ["label"] and {r["label"] for r in rows} <= {None, DEFAULT_LABEL}:
            extra.pop(0)  # only the default label: nothing to keep (our own exports come back unchanged)
        _write_csv(stage / "wounds.csv", ["image_id", "wound_index", "description", *extra], rows)
        kept_ids = any(r["source_image_id"] is not None for r in image_rows)
        if kept_ids:
            _write_csv(stage / "images.csv", ["image_id", "patient_id", "source_image_id"], image_rows)
        schema = column_schema([[{c: r[c] for c in extra} for r in rows],
                                [{"source_image_id": r["source_image_id"]} for r in image_rows] if kept_ids else []])
        write_text(stage / "dataset.json", json.dumps({"name": name, "synthetic": synthetic, "mask_format": "label",
                                                       **({"columns": schema} if schema else {})}, indent=2) + "\n")
    return {"images": len(seen), "wounds": len(rows), "empty_outlines_dropped": empty,
            "other_shapes_skipped": skipped, "crowd_regions_ignored": crowd, "overlap": overlap,
            "overlapping_px": overlap_px, "small_wounds_dropped": dropped, "out": str(out)}


def _write_csv(path: Path, columns: list[str], rows: list[dict[str, Any]]) -> None:
    """``rows`` (their ``columns``; ``None`` an empty cell) as a CSV file safe to open in a spreadsheet."""
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows({c: "" if r[c] is None else neutralise(r[c]) for c in columns} for r in rows)


def _files(src: Path, suffix: str) -> list[Path]:
    if src.is_dir():
        files = sorted(p for p in src.iterdir() if p.suffix.lower() == suffix and p.is_file())
        if not files:
            raise DatasetError(f"{src}: no *{suffix} file")
        return files
    if not src.is_file():
        raise DatasetError(f"{src}: no such file or folder")
    return [src]


def _one(src: Path, preferred: str, suffix: str) -> Path:
    if src.is_dir() and (src / preferred).is_file():
        return src / preferred
    files = _files(src, suffix)
    if len(files) > 1:
        raise DatasetError(f"{src}: {len(files)} *{suffix} files; name the one to convert")
    return files[0]


def convert(fmt: str, src: str | Path, out: str | Path, images: str | Path | None = None,
            name: str | None = None, synthetic: bool = False, overlap: str | None = None,
            min_area: int = DEFAULT_MIN_WOUND_AREA) -> dict[str, Any]:
    """Convert ``src`` (format ``fmt``, one of :data:`SOURCES`) into the dataset folder ``out``.
    ``overlap`` (one of :data:`OVERLAP_RULES`; default ``z-order`` for CVAT, else ``later-wins``) says
    which outline a pixel covered twice goes to; wounds left under ``min_area`` pixels are dropped
    (the workspace's minimum wound area, which import applies)."""
    overlap = overlap or ("z-order" if fmt == "cvat" else "later-wins")
    if overlap not in OVERLAP_RULES:
        raise DatasetError(f"unknown overlap rule {overlap!r}; choose one of {', '.join(OVERLAP_RULES)}")
    if not (isinstance(min_area, int) and min_area >= 0):
        raise DatasetError(f"the minimum wound area must be a whole number of pixels ≥ 0, got {min_area!r}")
    src = Path(src)
    skipped = 0
    if fmt == "coco":
        path = _one(src, "annotations.json", ".json")
        photos = read_coco(path)
        files = [path]
    elif fmt == "geojson":
        files = _files(src, ".geojson")
        photos = read_geojson(files)
    elif fmt == "labelstudio":
        files = [_one(src, "result.json", ".json")]
        photos = read_labelstudio(files[0])
    elif fmt == "cvat":
        files = [_one(src, "annotations.xml", ".xml")]
        photos, skipped = read_cvat(files[0])
    else:
        raise DatasetError(f"unknown source format {fmt!r}; choose one of {', '.join(SOURCES)}")
    base = files[0].parent
    folders = [Path(images)] if images is not None else [base, base / "images"]
    summary = _write(photos, folders, Path(out), name or base.name or "converted", synthetic, overlap, min_area,
                     skipped)
    return {"from": fmt, **summary}
