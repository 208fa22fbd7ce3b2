"""Wound follow-up across visits: visit dates, wound tracks, physical size, healing and links.

The follow-up fields ride in the metadata the store already carries everywhere (import, export,
re-import merge, revisions, erase-patient, backup), with fixed names and checked values:

- ``images.csv`` ``visit_date``: ISO 8601 date (or date-time) of the visit, never in the future;
  ``ruler``: ``"x1 y1 x2 y2 length_cm"``, a segment drawn along a ruler in the photo;
- ``wounds.csv`` ``track_id``: the physical wound across visits (a *track*: one patient, one
  anatomical ``site``); ``closed``: the clinician marked the wound closed at this visit (its open
  area counts as 0, the outline keeps where it was);
- ``dataset.json`` ``marker``: ``{"dictionary", "id", "side_cm"}``, the printed calibration marker.

A track's patient is its photos' patient; the schema's ``tracks`` view lists them. Two wounds of one
photo on one track, or a track across patients, is one clear error. Sizes come from
:mod:`annotations.followup.measure`; :func:`followup_rows` is the tidy table behind ``export --format followup``
and the Follow-up page, :func:`healing` its per-track summary, :func:`propose_links` the track
proposals for the wounds of a new visit.
"""
from __future__ import annotations

import csv
import hashlib
import itertools
import json
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from datetime import date
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from annotations.infra.fileio import atomic_write
from annotations.io import csvsafe
from annotations.io.dataset import import_dataset
from annotations.followup.followup_fields import (CLOSED, RULER, SITE, TRACK, VISIT_DATE, check_tracks, is_closed,
                                                  marker_spec, parse_visit_date, track_of)
from annotations.followup.measure import (Calibration, MarkerSpec, Measurement, Ruler, find_marker, measure,
                                          ruler_calibration)
from annotations.io.readers import DatasetError
from annotations.store.rows import SYSTEM_ACTOR, key_json, wound_key
from annotations.store.store import Store

if TYPE_CHECKING:
    from annotations.infra.workspace import Workspace

#: The tidy export's columns, in order (``export --format followup``).
#: ``flag`` says why a calibrated size was withheld (``area_cm2``, ``length_cm``, ``width_cm`` empty; see
#: :func:`annotations.followup.measure.measure`). ``outline`` says how the measured outline was made (wound metadata
#: ``origin``): ``drawn``, ``edited``, ``import`` (from a dataset folder), or ``suggested`` — the segmenter's outline
#: accepted without an edit, so the area is the model's, not a person's; empty when not recorded.
COLUMNS = ("patient", "track", "visit_date", "area_cm2", "length_cm", "width_cm", "closed", "measured_by", "method",
           "uncertainty", "flag", "pct_change", "area_px", "site", "image_id", "wound_index", "notes", "outline")


def check_store(store: Store) -> None:
    """The track rules on the whole store (after an edit in the app)."""
    patients = {i["image_id"]: i["patient_id"] for i in store.images()}
    check_tracks(((w["image_id"], w["wound_index"], w["metadata"], f"wound {w['wound_index']} of {w['image_id']!r}")
                   for w in store.wounds()), patients)


# -- edits in the app --------------------------------------------------------------------------------
def set_visit_date(store: Store, image_id: str, value: str, *, actor: str = SYSTEM_ACTOR) -> None:
    """Set (or with ``""`` clear) a photo's visit date; a revision records it."""
    img = store.image(image_id)
    if img is None:
        raise DatasetError(f"photo {image_id!r} is not in the workspace")
    metadata = dict(img["metadata"])
    if str(value).strip():
        metadata[VISIT_DATE] = parse_visit_date(value, f"photo {image_id!r}").isoformat()
    else:
        metadata.pop(VISIT_DATE, None)
    store.upsert_image(image_id, img["file"], img["sha256"], img["width"], img["height"], img["patient_id"],
                       metadata, actor=actor)


def import_visit(ws: Workspace, folder: str | Path, visit_date: str | date | None = None, *,
                 actor: str = "import") -> dict[str, Any]:
    """Import a dataset folder (:func:`annotations.io.dataset.import_dataset`) and give ``visit_date`` to
    its new photos that carry none in ``images.csv``. The date is checked first: an unparseable or
    future date is one clear error and imports nothing. The summary adds ``dated`` (photos dated)."""
    day = None if visit_date in (None, "") else parse_visit_date(
        visit_date.isoformat() if isinstance(visit_date, date) else visit_date, "visit date")
    before = {i["image_id"] for i in ws.store.images()}
    summary = import_dataset(ws, folder, actor=actor)
    new = [i["image_id"] for i in ws.store.images() if i["image_id"] not in before and VISIT_DATE not in i["metadata"]]
    if day is not None:
        with ws.store.transaction():
            for image_id in new:
                set_visit_date(ws.store, image_id, day.isoformat(), actor=actor)
    return {**summary, "dated": len(new) if day is not None else 0}


def set_track(store: Store, image_id: str, wound_index: int, track_id: str | None, *, site: str | None = None,
              closed: bool | None = None, actor: str = SYSTEM_ACTOR) -> None:
    """Put one wound on ``track_id`` (None: off any track), optionally with its site and closed flag;
    a second wound of the photo on that track, or a track of another patient, raises and changes nothing."""
    with store.transaction():
        w = store.wound(image_id, wound_index)
        if w is None:
            raise DatasetError(f"wound {wound_index} of {image_id!r} is not in the workspace")
        metadata = dict(w["metadata"])
        if track_id is None or not str(track_id).strip():
            metadata.pop(TRACK, None)
        else:
            metadata[TRACK] = str(track_id).strip()
        if site is not None:
            metadata[SITE] = site
        if closed is not None:
            metadata[CLOSED] = bool(closed)
        patients = {i["image_id"]: i["patient_id"] for i in store.images()}
        others = [(o["image_id"], o["wound_index"], o["metadata"], f"wound {o['wound_index']} of {o['image_id']!r}")
                  for o in store.wounds() if (o["image_id"], o["wound_index"]) != (image_id, int(wound_index))]
        check_tracks([*others, (image_id, int(wound_index), metadata, f"wound {wound_index} of {image_id!r}")],
                      patients)
        store.upsert_wound(image_id, wound_index, w["area"], w["bbox"], w["description"], metadata, actor=actor)


def tracks(store: Store) -> list[dict[str, Any]]:
    """Every track: id, patient, site, wounds, first and last visit (the schema's ``tracks`` view)."""
    return store.tracks()


def track_visits(store: Store, track_id: str) -> list[tuple[str, int, str]]:
    """The wounds of one track as ``(image_id, wound_index, visit_date)``, by visit date (undated last)."""
    dates = {i["image_id"]: str(i["metadata"].get(VISIT_DATE) or "") for i in store.images()}
    out = [(w["image_id"], int(w["wound_index"]), dates.get(w["image_id"], "")) for w in store.wounds()
           if track_of(w["metadata"]) == str(track_id)]
    return sorted(out, key=lambda v: (v[2] == "", v[2], v[0]))


def next_track_id(store: Store, patient_id: str | None) -> str:
    """A new track id for ``patient_id`` (``<patient>-T<n>``), not used yet."""
    used = {t["track_id"] for t in tracks(store)}
    n = 1
    while f"{patient_id or 'track'}-T{n}" in used:
        n += 1
    return f"{patient_id or 'track'}-T{n}"


# -- measuring ---------------------------------------------------------------------------------------
def calibrate(image: np.ndarray, metadata: dict[str, Any], marker: MarkerSpec | None, where: str
              ) -> Calibration | None:
    """The photo's calibration: the configured marker when it shows, else its drawn ruler, else None."""
    if marker is not None:
        found = find_marker(image, marker, where)
        if found is not None:
            return found
    if metadata.get(RULER) not in (None, ""):
        size = (image.shape[1], image.shape[0])
        return ruler_calibration(Ruler.parse(metadata[RULER], f"{where}: ruler", size), f"{where}: ruler", size)
    return None


def workspace_marker(ws: Workspace) -> MarkerSpec | None:
    """The workspace's calibration marker, or None when none is set."""
    value = ws.store.get_meta("marker")
    return None if value is None else marker_spec(value, "workspace marker")


#: The measurement cache (``cache/`` of the workspace): per photo, keyed by what its sizes depend on.
MEASURE_CACHE = "followup_measures.json"
MEASURE_VERSION = 3  # bump when :func:`annotations.followup.measure.measure` changes what it returns


def _photo_key(ws: Workspace, img: dict[str, Any], marker: MarkerSpec | None, known: list[int]) -> str:
    """What a photo's measurements depend on: its pixels, its mask file's bytes, its wounds, its ruler
    and the workspace's marker."""
    h = hashlib.blake2b(digest_size=16)
    h.update(json.dumps([MEASURE_VERSION, img["sha256"], sorted(known), img["metadata"].get(RULER),
                         None if marker is None else asdict(marker)], default=str).encode())
    path = ws.mask_path(img["image_id"])
    h.update(path.read_bytes() if path.exists() else b"")
    return h.hexdigest()


def measure_photos(ws: Workspace, image_ids: list[str], progress: Callable[[float], None] | None = None
                   ) -> dict[str, dict[int, Measurement]]:
    """Every wound of each photo measured (marker, else ruler, else pixels), from the workspace's
    measurement cache where the photo, its mask, its ruler and the marker are unchanged; the rest is
    measured (the marker detection and the mask's pixels: the slow part) and cached."""
    store = ws.store
    marker = workspace_marker(ws)
    path = ws.cache_dir / MEASURE_CACHE
    try:
        cache = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    except (OSError, ValueError):
        cache = {}  # a damaged cache is measured again
    images = {i["image_id"]: i for i in store.images()}
    wounds: dict[str, list[int]] = defaultdict(list)
    for w in store.wounds():
        wounds[w["image_id"]].append(w["wound_index"])
    out, fresh = {}, {}
    for n, image_id in enumerate(image_ids):
        img = images[image_id]
        key = _photo_key(ws, img, marker, wounds[image_id])
        if key in cache:
            out[image_id] = {int(i): Measurement(**{**m, "centre": None if m["centre"] is None else tuple(m["centre"])})
                             for i, m in cache[key].items()}
        else:
            where = f"photo {img['file']}"
            cal = calibrate(np.asarray(ws.load_image(image_id)), img["metadata"], marker, where)
            labels = ws.load_mask(image_id)
            out[image_id] = {i: measure(labels == i, cal) for i in wounds[image_id]}
            fresh[key] = {str(i): asdict(m) for i, m in out[image_id].items()}
        if progress is not None:
            progress((n + 1) / len(image_ids))
    if fresh:
        with atomic_write(path, "w") as fh:
            json.dump({**cache, **fresh}, fh)
    return out


def followup_rows(ws: Workspace, progress: Callable[[float], None] | None = None,
                  unlinked: bool = False) -> list[dict[str, Any]]:
    """One row per wound on a track: its size at that visit, how it was measured, by whom, and its %
    change from the track's first visit; ordered by patient, track, date. ``unlinked`` adds the wounds
    on no track of photos with a visit date (``track`` None), for :func:`pending_links`. Sizes come
    from :func:`measure_photos` (cached per photo)."""
    store = ws.store
    images = {i["image_id"]: i for i in store.images()}
    by_image: dict[str, list[dict]] = defaultdict(list)
    for w in store.wounds():
        if track_of(w["metadata"]) is not None or (unlinked and VISIT_DATE in images[w["image_id"]]["metadata"]):
            by_image[w["image_id"]].append(w)
    authors = store.outline_authors()
    sizes = measure_photos(ws, sorted(by_image), progress)
    rows = []
    for image_id, wounds in sorted(by_image.items()):
        img = images[image_id]
        where = f"photo {img['file']}"
        visit = img["metadata"].get(VISIT_DATE)
        shape = (img["height"], img["width"])
        for w in wounds:
            closed = is_closed(w["metadata"])
            m = sizes[image_id][w["wound_index"]]
            area = 0.0 if closed and m.area_cm2 is not None else m.area_cm2
            rows.append({
                "patient": img["patient_id"], "track": track_of(w["metadata"]),
                "visit_date": None if visit is None else parse_visit_date(visit, where).isoformat(),
                "area_cm2": _round(area), "length_cm": _round(m.length_cm), "width_cm": _round(m.width_cm),
                "closed": closed or m.area_px == 0,
                "measured_by": authors.get(key_json(wound_key(image_id, w["wound_index"])), SYSTEM_ACTOR),
                "method": m.method, "uncertainty": _round(m.uncertainty, 4), "flag": m.flag or "", "pct_change": None,
                "area_px": 0 if closed else m.area_px, "site": w["metadata"].get(SITE, ""), "image_id": image_id,
                "wound_index": w["wound_index"], "notes": "; ".join(m.reasons),
                "outline": w["metadata"].get("origin", ""),
                "xy": _position(m, shape), "size": m.area_px if m.area_cm2 is None else m.area_cm2})
    rows.sort(key=lambda r: (str(r["patient"]), r["track"] or "", r["visit_date"] or "", r["image_id"]))
    for _, group in _by_track([r for r in rows if r["track"] is not None]).items():
        base = group[0]
        unit = "area_cm2" if all(r["area_cm2"] is not None for r in group) else "area_px"
        for r in group:
            if base[unit]:
                r["pct_change"] = _round(100.0 * (r[unit] - base[unit]) / base[unit], 2)
    return rows


def _position(m: Measurement, shape: tuple[int, ...]) -> tuple[float, float] | None:
    """The linker's position: cm on the calibration's plane, else the photo fraction × PHOTO_CM."""
    if m.centre is None:
        return None
    if m.method == "pixels":
        return (m.centre[0] / shape[1] * PHOTO_CM, m.centre[1] / shape[0] * PHOTO_CM)
    return m.centre


def _round(value: float | None, digits: int = 3) -> float | None:
    """``value`` to ``digits`` decimals, or to ``digits`` significant digits where that would give 0."""
    if value is None:
        return None
    rounded = round(float(value), digits)
    return rounded if rounded or not value else float(f"{value:.{digits}g}")


def _by_track(rows: list[dict[str, Any]]) -> dict[tuple[Any, str], list[dict[str, Any]]]:
    groups: dict[tuple[Any, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[(r["patient"], r["track"])].append(r)
    return groups


def healing(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per track: baseline and last area, % change from baseline, closure and days to closure.

    The status follows the latest visit: a track is closed when its last dated visit is marked
    closed (or has no open area); its closure is the first visit of that final closed run (a wound
    closed, then reopened, then closed again, closed at the second closure), and ``reopened`` counts
    the times it opened again after a closed visit."""
    out = []
    for (patient, track), group in _by_track(rows).items():
        dated = sorted((r for r in group if r["visit_date"]), key=lambda r: r["visit_date"])
        if not dated:
            continue
        unit = "area_cm2" if all(r["area_cm2"] is not None for r in dated) else "area_px"
        first, last = dated[0], dated[-1]
        reopened = sum(1 for a, b in itertools.pairwise(dated) if a["closed"] and not b["closed"])
        closure = None
        for r in reversed(dated):
            if not r["closed"]:
                break
            closure = r
        days = None if closure is None else (date.fromisoformat(closure["visit_date"])
                                             - date.fromisoformat(first["visit_date"])).days
        out.append({"patient": patient, "track": track, "site": first["site"], "unit": unit,
                    "visits": len(dated), "baseline_date": first["visit_date"], "baseline_area": first[unit],
                    "last_date": last["visit_date"], "last_area": last[unit], "pct_change": last["pct_change"],
                    "closed": closure is not None, "closure_date": None if closure is None else closure["visit_date"],
                    "days_to_closure": days, "reopened": reopened})
    return out


def patient_totals(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per patient and visit date: the total open area in cm² (None when a wound lacks a calibration)."""
    totals: dict[tuple[Any, str], list[float | None]] = defaultdict(list)
    for r in rows:
        if r["visit_date"]:
            totals[(r["patient"], r["visit_date"])].append(r["area_cm2"])
    return [{"patient": p, "visit_date": d,
             "open_area_cm2": None if any(a is None for a in areas) else _round(sum(a for a in areas if a is not None))}
            for (p, d), areas in sorted(totals.items(), key=lambda kv: (str(kv[0][0]), kv[0][1]))]


def write_csv(fh: IO[str], table: Iterable[Mapping[str, Any]], columns: Iterable[str]) -> None:
    """``table``'s ``columns`` as CSV to ``fh`` (None as an empty cell; text that a spreadsheet would run
    as a formula neutralised, :mod:`annotations.io.csvsafe`)."""
    columns = list(columns)
    writer = csv.DictWriter(fh, fieldnames=columns)
    writer.writeheader()
    for r in table:
        writer.writerow(csvsafe.safe_row({k: "" if r.get(k) is None else r[k] for k in columns}))


def export_followup(ws: Workspace, out: str | Path, force: bool = False) -> dict[str, Any]:
    """``export OUT --format followup``: ``followup.csv`` (one tidy row per wound and visit),
    ``healing.csv`` (per track) and ``patients.csv`` (total open area per patient and visit)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise DatasetError(f"{out}: not a folder")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise DatasetError(f"{out}: not empty; export into a new folder or give --force")
    rows = followup_rows(ws)
    out.mkdir(parents=True, exist_ok=True)
    heal = healing(rows)
    totals = patient_totals(rows)
    for name, table, columns in (("followup.csv", rows, COLUMNS),
                                 ("healing.csv", heal, list(heal[0]) if heal else ["patient", "track"]),
                                 ("patients.csv", totals, ["patient", "visit_date", "open_area_cm2"])):
        with (out / name).open("w", newline="", encoding="utf-8") as fh:
            write_csv(fh, table, columns)
    return {"rows": len(rows), "tracks": len(heal), "closed": sum(h["closed"] for h in heal), "out": str(out)}


# -- linking -----------------------------------------------------------------------------------------
@dataclass
class Sighting:
    """One wound at one visit, as the linker sees it: ``xy`` its position (cm on the marker's plane
    when calibrated, else the fraction of the photo's width/height), ``area`` its size in the same
    unit squared, ``embedding`` optional (L2-normalised)."""

    key: tuple[str, int]
    patient: str | None
    visit_date: str
    site: str
    xy: tuple[float, float]
    area: float
    track: str | None = None
    closed: bool = False
    embedding: np.ndarray | None = None


#: Linker weights: position spread (cm), log-area spread, the cost of another site, the weight of
#: embedding cosine distance, and the cost above which a wound starts a new track. An uncalibrated
#: photo's positions are its width/height fractions times PHOTO_CM (about a close-up's field).
POSITION_SCALE = 2.0
LOG_AREA_SCALE = 0.7
OTHER_SITE = 6.0
EMBEDDING_WEIGHT = 4.0
NEW_TRACK = 8.0
PHOTO_CM = 30.0


def link_cost(new: Sighting, last: Sighting, shift: tuple[float, float] = (0.0, 0.0)) -> float:
    """How unlikely ``new`` continues the track last seen as ``last`` (∞ for another patient); ``shift``
    registers the new photo's positions onto the earlier ones (the marker moves between visits)."""
    if new.patient != last.patient:
        return math.inf
    moved = (new.xy[0] + shift[0] - last.xy[0], new.xy[1] + shift[1] - last.xy[1])
    cost = 0.5 * (math.hypot(*moved) / POSITION_SCALE) ** 2
    cost += 0.5 * (math.log(max(new.area, 1e-6) / max(last.area, 1e-6)) / LOG_AREA_SCALE) ** 2
    cost += 0.0 if _site(new.site) == _site(last.site) else OTHER_SITE
    if new.embedding is not None and last.embedding is not None:
        cost += EMBEDDING_WEIGHT * (1.0 - float(np.dot(new.embedding, last.embedding)))
    return cost


def _site(text: str) -> str:
    return " ".join(str(text or "").lower().split())


def _assign(group: list[Sighting], options: list[Sighting], shift: tuple[float, float]
            ) -> tuple[float, np.ndarray, dict[int, int]]:
    """The optimal one-to-one assignment of ``group`` to ``options`` or new tracks under ``shift``."""
    cost = np.array([[link_cost(s, c, shift) for c in options] for s in group]).reshape(len(group), len(options))
    full = np.hstack([np.minimum(cost, 1e6), np.where(np.eye(len(group)) > 0, NEW_TRACK, 1e6)])
    from scipy.optimize import linear_sum_assignment  # here, not at import: --help stays fast

    rows, cols = linear_sum_assignment(full)
    return float(full[rows, cols].sum()), cost, {int(r): int(c) for r, c in zip(rows, cols)}


def propose_links(new: list[Sighting], history: list[Sighting], k: int = 3
                  ) -> dict[tuple[str, int], list[tuple[str | None, float]]]:
    """For each wound of ``new`` (one visit), its ranked proposals ``(track, cost)``, best first;
    ``None`` proposes a new track.

    Per photo, the positions are first registered onto the patient's open tracks (the shift, among
    those that lay one new wound on one track, with the cheapest assignment); the first proposals are
    that optimal one-to-one assignment, so two wounds of one photo never share a track."""
    last: dict[str, Sighting] = {}
    for s in sorted(history, key=lambda s: s.visit_date):
        if s.track is not None:
            last[s.track] = s
    candidates = [s for s in last.values() if not s.closed]  # a track is closed while its latest visit is
    out: dict[tuple[str, int], list[tuple[str | None, float]]] = {}
    groups: dict[Any, list[Sighting]] = defaultdict(list)
    for s in new:
        groups[(s.patient, s.key[0])].append(s)
    for group in groups.values():
        options = [c for c in candidates if c.patient == group[0].patient]
        shifts = {(0.0, 0.0)} | {(c.xy[0] - s.xy[0], c.xy[1] - s.xy[1]) for s in group for c in options}
        _, cost, chosen = min((_assign(group, options, shift) for shift in shifts), key=lambda a: a[0])
        for i, s in enumerate(group):
            ranked = sorted(((options[j].track, float(cost[i, j])) for j in range(len(options))
                             if math.isfinite(cost[i, j])), key=lambda t: t[1])
            ranked.append((None, NEW_TRACK))
            pick = options[chosen[i]].track if chosen[i] < len(options) else None
            best = next(t for t in ranked if t[0] == pick)
            out[s.key] = [best, *[t for t in ranked if t[0] != pick]][:k]
    return out


#: Wound key ``(image_id, wound_index)`` → its embedding (any length; normalised here), e.g. a run's
#: ``wound_emb`` rows by its ``wound_keys`` (precomputed: this module never runs a model).
Embeddings = Mapping[tuple[str, int], np.ndarray]


def _unit(vector: np.ndarray | None) -> np.ndarray | None:
    if vector is None:
        return None
    v = np.asarray(vector, np.float64).ravel()
    norm = float(np.linalg.norm(v))
    return v / norm if norm > 0 and np.isfinite(norm) else None


def sightings(rows: list[dict[str, Any]], embeddings: Embeddings | None = None) -> list[Sighting]:
    """:func:`followup_rows` rows as the linker's sightings (with their recorded tracks); with
    ``embeddings``, each wound's (L2-normalised) embedding is a linking cue (:func:`link_cost`)."""
    embeddings = embeddings or {}
    return [Sighting((r["image_id"], r["wound_index"]), r["patient"], r["visit_date"] or "", r["site"],
                     r["xy"] or (0.0, 0.0), r["size"], r["track"], r["closed"],
                     _unit(embeddings.get((r["image_id"], int(r["wound_index"])))))
            for r in rows]


def pending_links(rows: list[dict[str, Any]], embeddings: Embeddings | None = None) -> list[dict[str, Any]]:
    """The wounds on no track (rows of :func:`followup_rows` with ``unlinked``), each with its ranked
    proposals (``proposals``: [(track or None, cost)]) against the tracks seen before its visit;
    ``embeddings`` add embedding similarity to the cues."""
    seen = sightings(rows, embeddings)
    history = [s for s in seen if s.track is not None]
    todo = [(r, s) for r, s in zip(rows, seen) if r["track"] is None]
    out = []
    for day in sorted({r["visit_date"] for r, _ in todo}):
        visit = [(r, s) for r, s in todo if r["visit_date"] == day]
        proposals = propose_links([s for _, s in visit], [s for s in history if s.visit_date < day])
        out += [{**r, "proposals": proposals[(r["image_id"], r["wound_index"])]} for r, _ in visit]
    return out


def link_accuracy(rows: list[dict[str, Any]], embeddings: Embeddings | None = None) -> dict[str, Any]:
    """Top-1 accuracy of :func:`propose_links` replayed visit by visit on recorded tracks: each visit's
    wounds (tracks hidden) against all earlier visits; "new track" is right for a track's first wound."""
    seen = sightings(rows, embeddings)
    right = total = new_right = new_total = 0
    for patient in sorted({s.patient for s in seen}, key=str):
        mine = [s for s in seen if s.patient == patient]
        for day in sorted({s.visit_date for s in mine})[1:]:
            history = [s for s in mine if s.visit_date < day]
            visit = [s for s in mine if s.visit_date == day]
            known = {s.track for s in history}
            proposals = propose_links([Sighting(s.key, s.patient, s.visit_date, s.site, s.xy, s.area,
                                                embedding=s.embedding) for s in visit], history)
            for s in visit:
                truth = s.track if s.track in known else None
                hit = proposals[s.key][0][0] == truth
                right, total = right + hit, total + 1
                if truth is None:
                    new_right, new_total = new_right + hit, new_total + 1
    return {"top1": right / total if total else None, "wounds": total, "new_tracks": new_total,
            "new_track_top1": new_right / new_total if new_total else None}
