"""Outlines from other annotation tools → a TriDerm dataset folder (then ``python -m annotations import``).

``convert(fmt, src, out, images=…)`` reads one of

- **coco**: a COCO instance-segmentation file (``annotations.json``, or the folder holding it);
  ``segmentation`` as polygons (pixel-corner coordinates, COCO's convention), compressed RLE or
  uncompressed RLE (pycocotools). The TriDerm keys our export writes (``triderm_image_id``,
  ``triderm_wound_index``, ``description``) are read back, so our export converts back losslessly.
- **geojson**: a ``.geojson`` file or a folder of them (our export: ``<image_id>.geojson``; QuPath's
  "Export objects as GeoJSON"): Polygon/MultiPolygon features, holes kept; the photo is the
  feature's ``image_id`` property or else the file's name.
- **labelstudio**: a Label Studio JSON export (a list of tasks): ``polygonlabels`` results (points
  in percent of ``original_width``/``original_height``) and ``brushlabels`` results (Label Studio's
  own bit-packed RLE, decoded by :func:`decode_brush_rle`). Of several annotations of one task the
  one marked ``ground_truth`` is read, else the last one not cancelled.
- **cvat**: a CVAT XML 1.1 file ("CVAT for images"): ``<polygon>`` and ``<mask>`` (RLE inside
  its ``left``/``top``/``width``/``height`` box) shapes; boxes, polylines and points are not
  outlines and are counted as ``skipped``; video tracks are refused.

Polygons are rasterised the way :mod:`annotations.formats` defines (a pixel is inside when its
centre is). The photos are looked up in ``images`` (default: the annotation file's folder, then
its ``images/`` subfolder) by the file name the annotation gives (Label Studio's upload prefix
``1a2b3c4d-`` is dropped when the plain name is what exists; a name without a photo suffix, as
GeoJSON gives, matches any). Image ids are the photos' names
without suffix (characters outside ``A-Z a-z 0-9 _ . -`` become ``_``) unless the file gives a
TriDerm id. Wounds are numbered in file order unless the file gives TriDerm indices.

The folder written: ``images/`` (the photos, byte for byte), ``masks/`` (label maps, one wound per
pixel), ``wounds.csv`` (``image_id, wound_index, description`` and ``label`` when the file uses
more than one label) and ``dataset.json``. Everything is read and checked before ``out`` appears:
bad input raises one :class:`~annotations.readers.DatasetError` naming the file and the field, and
``out`` is left as it was. Two outlines covering the same pixel are refused (a label map holds one
wound per pixel).
"""
from __future__ import annotations

import csv
import json
import math
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import shapely
from PIL import Image, UnidentifiedImageError
from shapely.geometry import MultiPolygon, Polygon, shape
from shapely.validation import make_valid

from annotations.dataset import copy_photo
from annotations.fileio import staged_folder, write_text
from annotations.formats import rasterize
from annotations.readers import IMAGE_SUFFIXES, MAX_PIXELS, DatasetError, valid_id

SOURCES = ("coco", "geojson", "labelstudio", "cvat")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
_LS_PREFIX = re.compile(r"^[0-9a-f]{8}-")


@dataclass
class _Wound:
    """One outline as read: a geometry (pixel coordinates) or a bool mask of the photo's size."""

    where: str
    geometry: Polygon | MultiPolygon | None = None
    mask: np.ndarray | None = None
    label: str = ""
    description: str = ""
    index: int | None = None


@dataclass
class _Photo:
    where: str  # file and field naming this photo, for errors
    name: str  # the file name the annotation gives
    size: tuple[int, int] | None = None  # (width, height) the annotation declares
    image_id: str | None = None
    wounds: list[_Wound] = field(default_factory=list)


def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DatasetError(f"{path}: not a readable JSON file ({err})") from None


def _need(obj: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise DatasetError(f"{where}: missing field {key!r}")
    if not isinstance(obj[key], kind) or isinstance(obj[key], bool):
        raise DatasetError(f"{where}: field {key!r} has the wrong type ({type(obj[key]).__name__})")
    return obj[key]


def _whole(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _size(obj: dict, wkey: str, hkey: str, where: str) -> tuple[int, int]:
    w, h = _need(obj, wkey, int, where), _need(obj, hkey, int, where)
    if not (w > 0 and h > 0 and w * h <= MAX_PIXELS):
        raise DatasetError(f"{where}: size {w}×{h} is not a photo size")
    return w, h


def _polygon(coords: list, where: str) -> Polygon:
    """A polygon from a flat [x1, y1, x2, y2, …] list, repaired when it crosses itself."""
    if (not isinstance(coords, list) or len(coords) < 6 or len(coords) % 2
            or not all(isinstance(c, (int, float)) and not isinstance(c, bool) and math.isfinite(c) for c in coords)):
        raise DatasetError(f"{where}: a polygon needs at least three x, y pairs of finite numbers")
    poly = Polygon(np.asarray(coords, float).reshape(-1, 2))
    return poly if poly.is_valid else make_valid(poly)


# --- COCO --------------------------------------------------------------------------------------

def read_coco(path: Path) -> list[_Photo]:
    """The photos and outlines of a COCO file."""
    from pycocotools import mask as mask_utils

    doc = _load_json(path)
    name = path.name
    images = _need(doc, "images", list, name)
    categories = {c.get("id"): str(c.get("name", "")) for c in doc.get("categories", []) if isinstance(c, dict)}
    photos: dict[Any, _Photo] = {}
    for n, img in enumerate(images):
        here = f"{name}: images[{n}]"
        image_id = _need(img, "id", (int, str), here)
        if image_id in photos:
            raise DatasetError(f"{here}: id {image_id!r} is used twice")
        tid = img.get("triderm_image_id")
        photos[image_id] = _Photo(here, _need(img, "file_name", str, here), _size(img, "width", "height", here),
                                  tid if isinstance(tid, str) else None)
    for n, ann in enumerate(_need(doc, "annotations", list, name)):
        here = f"{name}: annotations[{n}]"
        photo = photos.get(_need(ann, "image_id", (int, str), here))
        if photo is None:
            raise DatasetError(f"{here}: image_id {ann['image_id']!r} is not in images")
        assert photo.size is not None  # a COCO image declares its width and height
        w, h = photo.size
        seg = _need(ann, "segmentation", (list, dict), here)
        wound = _Wound(f"{here}.segmentation", label=categories.get(ann.get("category_id"), ""),
                       description=str(ann.get("description", "")),
                       index=_whole(ann.get("triderm_wound_index")))
        if isinstance(seg, list):
            polys = [_polygon(p, f"{here}.segmentation[{k}]") for k, p in enumerate(seg)]
            wound.geometry = shapely.union_all(polys)
        else:
            if seg.get("size") != [h, w]:
                raise DatasetError(f"{here}.segmentation: size {seg.get('size')!r} is not the photo's [{h}, {w}]")
            counts = seg.get("counts")
            try:
                rle = (mask_utils.frPyObjects(seg, h, w) if isinstance(counts, list)
                       else {"size": [h, w], "counts": counts.encode("ascii")})
                wound.mask = mask_utils.decode(rle).astype(bool)
            except (AttributeError, TypeError, ValueError, UnicodeEncodeError) as err:
                raise DatasetError(f"{here}.segmentation: counts is not a COCO RLE ({err})") from None
        photo.wounds.append(wound)
    return list(photos.values())


# --- GeoJSON -----------------------------------------------------------------------------------

def read_geojson(files: list[Path]) -> list[_Photo]:
    """The photos and outlines of GeoJSON files (FeatureCollections, or lists of features)."""
    photos: dict[str, _Photo] = {}
    for path in files:
        doc = _load_json(path)
        features = doc.get("features") if isinstance(doc, dict) else doc
        if not isinstance(features, list):
            raise DatasetError(f"{path.name}: missing field 'features' (expected a FeatureCollection)")
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
            except (ValueError, TypeError, AttributeError, IndexError) as err:
                raise DatasetError(f"{here}.geometry: not a valid GeoJSON geometry ({err})") from None
            image_id = props.get("image_id") if isinstance(props.get("image_id"), str) else None
            key = image_id or path.stem
            photo = photos.setdefault(key, _Photo(here, key, None, image_id))
            cls = props.get("classification")
            photo.wounds.append(_Wound(f"{here}.geometry", geometry=g if g.is_valid else make_valid(g),
                                       label=str(cls.get("name", "")) if isinstance(cls, dict) else "",
                                       description=str(props.get("description", "")),
                                       index=_whole(props.get("wound_index"))))
    return list(photos.values())


# --- Label Studio ------------------------------------------------------------------------------

def decode_brush_rle(rle: list[int]) -> np.ndarray:
    """Label Studio's brush RLE (the rle-pack format of thi.ng/umbrella) → its flat array of words.

    The stream: 32 bits count, 5 bits word size − 1, four 4-bit run-length sizes − 1, then chunks
    of one bit (1: a repeated word, 0: literal words), 2 bits choosing the run-length size and the
    run length − 1. (Written here because the reference decoder ships inside the label-studio-sdk
    package, whose pinned dependencies this project does not need.)"""
    bits = np.unpackbits(np.asarray(rle, np.uint8))
    pos = 0

    def read(n: int) -> int:
        nonlocal pos
        if pos + n > len(bits):
            raise ValueError("the RLE ends early")
        v = int("".join(map(str, bits[pos:pos + n])) or "0", 2)
        pos += n
        return v

    num, word = read(32), read(5) + 1
    sizes = [read(4) + 1 for _ in range(4)]
    if num > 4 * MAX_PIXELS:
        raise ValueError(f"{num} values is more than a photo holds")
    out = np.zeros(num, np.uint32)
    i = 0
    while i < num:
        repeated = read(1)
        j = min(num, i + 1 + read(sizes[read(2)]))
        if repeated:
            out[i:j] = read(word)
            i = j
        else:
            for k in range(i, j):
                out[k] = read(word)
            i = j
    return out


def _ls_annotation(task: dict, here: str) -> tuple[dict | None, str]:
    anns = [a for a in task.get("annotations") or [] if isinstance(a, dict) and not a.get("was_cancelled")]
    if not anns:
        return None, here
    chosen = next((a for a in anns if a.get("ground_truth")), anns[-1])
    return chosen, f"{here}.annotations[{task['annotations'].index(chosen)}]"


def read_labelstudio(path: Path) -> list[_Photo]:
    """The photos and outlines of a Label Studio JSON export."""
    tasks = _load_json(path)
    if not isinstance(tasks, list):
        raise DatasetError(f"{path.name}: expected a list of tasks (Label Studio's JSON export)")
    photos = []
    for n, task in enumerate(tasks):
        here = f"{path.name}: [{n}]"
        data = _need(task, "data", dict, here)
        url = next((v for v in data.values() if isinstance(v, str)), None)
        if url is None:
            raise DatasetError(f"{here}.data: no image reference")
        photo = _Photo(f"{here}.data", url.split("?")[0].rsplit("/", 1)[-1])
        photos.append(photo)
        ann, where = _ls_annotation(task, here)
        for k, res in enumerate(ann.get("result") or [] if ann else []):
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
            wound = _Wound(f"{rhere}.value", label=str(labels[0]) if labels else "")
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
                try:
                    flat = decode_brush_rle(_need(value, "rle", list, rhere + ".value"))
                except (ValueError, TypeError, OverflowError) as err:
                    raise DatasetError(f"{rhere}.value.rle: not a Label Studio brush RLE ({err})") from None
                if flat.size != w * h * 4:
                    raise DatasetError(f"{rhere}.value.rle: {flat.size} values, expected {w}×{h}×4 (RGBA)")
                wound.mask = flat.reshape(h, w, 4)[:, :, 3] >= 128
            photo.wounds.append(wound)
    return photos


# --- CVAT --------------------------------------------------------------------------------------

def _cvat_int(el: ET.Element, key: str, where: str) -> int:
    try:
        return int(float(el.attrib[key]))
    except (KeyError, ValueError):
        raise DatasetError(f"{where}: attribute {key!r} is missing or not a number") from None


def read_cvat(path: Path) -> tuple[list[_Photo], int]:
    """The photos and outlines of a CVAT XML 1.1 file; also how many non-outline shapes were skipped."""
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
        w, h = _cvat_int(img, "width", here), _cvat_int(img, "height", here)
        photo = _Photo(here, img.attrib["name"], (w, h))
        for k, el in enumerate(img):
            shere = f"{here} <{el.tag}> {k + 1}"
            attrs = {a.get("name"): (a.text or "") for a in el.iter("attribute")}
            wound = _Wound(shere, label=el.get("label", ""), description=attrs.get("description", ""))
            if el.tag == "polygon":
                try:
                    coords = [float(c) for pt in el.attrib["points"].split(";") for c in pt.split(",")]
                except (KeyError, ValueError):
                    raise DatasetError(f"{shere}: attribute 'points' is missing or not 'x,y;x,y;…'") from None
                wound.geometry = _polygon(coords, f"{shere} points")
            elif el.tag == "mask":
                left, top = _cvat_int(el, "left", shere), _cvat_int(el, "top", shere)
                bw, bh = _cvat_int(el, "width", shere), _cvat_int(el, "height", shere)
                try:
                    counts = np.array([int(c) for c in el.attrib["rle"].split(",")], np.int64)
                except (KeyError, ValueError):
                    raise DatasetError(f"{shere}: attribute 'rle' is missing or not comma-separated counts") from None
                inside = left >= 0 and top >= 0 and left + bw <= w and top + bh <= h
                if (counts < 0).any() or counts.sum() != bw * bh or not inside:
                    raise DatasetError(f"{shere}: rle covers {counts.sum()} pixels, its box {bw}×{bh} at "
                                       f"({left}, {top}) inside a {w}×{h} photo")
                box = np.repeat(np.arange(len(counts)) % 2 == 1, counts).reshape(bh, bw)
                wound.mask = np.zeros((h, w), bool)
                wound.mask[top:top + bh, left:left + bw] = box
            else:
                skipped += el.tag in ("box", "polyline", "points", "ellipse", "cuboid", "skeleton")
                continue
            photo.wounds.append(wound)
        photos.append(photo)
    return photos, skipped


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
                return folder / t
    raise DatasetError(f"{where}: photo {name!r} not found in {' or '.join(map(str, images))}")


def _photo_size(path: Path, where: str) -> tuple[int, int]:
    """The photo's upright size (as the import stores it)."""
    try:
        with Image.open(path) as im:
            w, h = im.size
            return (h, w) if im.getexif().get(0x0112, 1) in (5, 6, 7, 8) else (w, h)  # turned a quarter
    except (OSError, UnidentifiedImageError) as err:
        raise DatasetError(f"{where}: {path.name} is not a readable photo ({err})") from None


def _image_id(photo: _Photo, path: Path) -> str:
    image_id = photo.image_id or _UNSAFE.sub("_", path.stem).lstrip("_.-")
    if not valid_id(image_id):
        raise DatasetError(f"{photo.where}: cannot make an image id from {photo.name!r}")
    return image_id


def _label_map(photo: _Photo, shape_hw: tuple[int, int]) -> tuple[np.ndarray, list[tuple[int, _Wound]], int]:
    """The photo's label map, its (index, wound) pairs and how many outlines covered no pixel centre."""
    given = [w.index for w in photo.wounds]
    indices = [i for i in given if isinstance(i, int) and i >= 1]
    use_given = bool(given) and len(indices) == len(given)
    if use_given and len(set(indices)) != len(indices):
        raise DatasetError(f"{photo.where}: wound index {max(indices, key=indices.count)} is given twice")
    labels = np.zeros(shape_hw, np.uint16 if len(given) > 255 or (use_given and max(indices) > 255) else np.uint8)
    out: list[tuple[int, _Wound]] = []
    empty, n = 0, 0
    for k, wound in enumerate(photo.wounds):
        mask = wound.mask if wound.mask is not None else rasterize(wound.geometry, shape_hw)
        if not mask.any():
            empty += 1
            continue
        n += 1
        index = indices[k] if use_given else n
        clash = labels[mask]
        if clash.any():
            raise DatasetError(f"{wound.where}: overlaps wound {int(clash[clash > 0][0])} of {photo.name!r} by "
                               f"{int((clash > 0).sum())} px (a label map holds one wound per pixel)")
        labels[mask] = index
        out.append((index, wound))
    return labels, out, empty


def _write(photos: list[_Photo], images: list[Path], out: Path, name: str, synthetic: bool,
           skipped: int = 0) -> dict[str, Any]:
    out = Path(out)
    with staged_folder(out, DatasetError) as stage:
        (stage / "images").mkdir()
        (stage / "masks").mkdir()
        rows: list[dict[str, Any]] = []
        seen: dict[str, str] = {}
        empty = 0
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
            labels, wounds, n_empty = _label_map(photo, (size[1], size[0]))
            empty += n_empty
            copy_photo(path, stage / "images" / f"{image_id}{path.suffix.lower()}")
            if wounds:
                Image.fromarray(labels).save(stage / "masks" / f"{image_id}.png")
            rows += [{"image_id": image_id, "wound_index": i, "description": w.description, "label": w.label}
                     for i, w in sorted(wounds, key=lambda iw: iw[0])]
        labelled = len({r["label"] for r in rows}) > 1
        with (stage / "wounds.csv").open("w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, ["image_id", "wound_index", "description", *(["label"] if labelled else [])],
                                    extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)
        write_text(stage / "dataset.json", json.dumps({"name": name, "synthetic": synthetic,
                                                       "mask_format": "label"}, indent=2) + "\n")
    return {"images": len(seen), "wounds": len(rows), "empty_outlines_dropped": empty,
            "other_shapes_skipped": skipped, "out": str(out)}


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
            name: str | None = None, synthetic: bool = False) -> dict[str, Any]:
    """Convert ``src`` (format ``fmt``, one of :data:`SOURCES`) into the dataset folder ``out``."""
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
    summary = _write(photos, folders, Path(out), name or base.name or "converted", synthetic, skipped)
    return {"from": fmt, **summary}
