"""Phantom visits (SYNTHETIC): every patient's wounds photographed at N visits, healing or growing at
planted rates, some closing, some new, beside a printed ArUco marker of known size, under a camera whose
distance, tilt (0–30°) and roll change from visit to visit.

The body is a plane (the skin around the wounds, in cm); each wound is an irregular outline on it whose
area follows ``area0 · exp(rate · months)``. A photo is that plane seen through a pinhole camera (the
homography ``K [r1 r2 t]``), so the planted cm² are exact and the outlines (``masks/``, the expert's) are
the planted shapes projected into the photo. A wound under ``CLOSE_CM2`` is closed at that visit: a pale
scar outlined and marked ``closed``, its track ends. The dataset folder carries the follow-up columns
(``images.csv`` visit_date and ruler, ``wounds.csv`` track_id, site, closed; ``dataset.json`` marker) and
``truth/visits.csv`` the planted truth (track, cm², camera).
"""
from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from datetime import date, timedelta
from pathlib import Path
from typing import Any, TypedDict

import cv2
import numpy as np
from PIL import Image
from tqdm import tqdm


class MarkerSpec(TypedDict):
    """The printed marker: its ArUco dictionary's name in ``cv2.aruco``, its id and side."""

    dictionary: str
    id: int
    side_cm: float


MARKER: MarkerSpec = {"dictionary": "DICT_4X4_50", "id": 7, "side_cm": 4.0}
SIZE = (1024, 768)         # photo width, height
TEXTURE_PPC = 30           # plane texture, pixels per cm
PLANE_CM = (32.0, 24.0)    # the body plane's extent
FOCAL = 1000.0             # pinhole focal length (px)
PPC_RANGE = (11.0, 22.0)   # photo pixels per cm at the plane's centre (camera distance)
MAX_TILT = 30.0            # degrees
CLOSE_CM2 = 0.6            # a wound smaller than this closes
MAX_CM2 = 20.0             # a growing wound stops here (it stays clear of its neighbours)
MAX_TRACKS = 4             # per patient
INTERVAL_DAYS = 28
RULER_CM = 10.0
SITES = ("left shin", "right shin", "left knee", "right forearm", "left hand", "upper back", "right foot",
         "left buttock", "abdomen", "right elbow")


@dataclass
class Track:
    """One planted wound across visits."""

    track_id: str
    patient_id: str
    site: str
    centre: np.ndarray      # cm on the plane
    shape: np.ndarray       # unit outline (n×2), area 1 cm²
    area0: float            # cm² at its first visit
    rate: float             # log-area change per month
    first: int              # visit index it appears at
    closed_at: int | None = None

    def area(self, days: float) -> float:
        """The wound's area (cm²) ``days`` after the first visit, capped at ``MAX_CM2``."""
        return min(self.area0 * math.exp(self.rate * days / 30.0), MAX_CM2)

    def outline(self, area: float) -> np.ndarray:
        """The wound's outline (photo coordinates) scaled to ``area``."""
        return self.centre + self.shape * math.sqrt(area)


@dataclass
class Camera:
    """Plane cm → photo px: the homography and how it was made."""

    homography: np.ndarray
    ppc: float
    tilt_deg: float
    roll_deg: float


@dataclass
class Patient:
    """A phantom patient and the wound tracks followed over visits."""

    patient_id: str
    tracks: list[Track] = field(default_factory=list)
    start: date = date(2024, 1, 8)


def _unit_shape(rng: np.random.Generator) -> np.ndarray:
    theta = np.linspace(0, 2 * np.pi, 240, endpoint=False)
    r = np.ones_like(theta)
    for k in (2, 3, 4):
        r += rng.uniform(0.0, 0.18 / k) * np.cos(k * theta + rng.uniform(0, 2 * np.pi))
    aspect = rng.uniform(1.0, 2.2)
    pts = np.stack([r * np.cos(theta) * aspect, r * np.sin(theta)], axis=1)
    angle = rng.uniform(0, np.pi)
    rot = np.array([[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]])
    pts = pts @ rot.T
    return pts / math.sqrt(abs(_shoelace(pts)))


def _shoelace(p: np.ndarray) -> float:
    return 0.5 * float(np.dot(p[:, 0], np.roll(p[:, 1], -1)) - np.dot(p[:, 1], np.roll(p[:, 0], -1)))


def _free_spot(rng: np.random.Generator, taken: list[np.ndarray], gap: float, margin: float = 4.0) -> np.ndarray:
    """A point of the plane at least ``gap`` cm from every point of ``taken`` (arrays of points)."""
    for _ in range(2000):
        p = np.array([rng.uniform(margin, PLANE_CM[0] - margin), rng.uniform(margin, PLANE_CM[1] - margin)])
        if all(np.min(np.linalg.norm(np.atleast_2d(q) - p, axis=1)) >= gap for q in taken):
            return p
    raise ValueError("no free spot on the phantom plane")


def plan_patients(rng: np.random.Generator, n_patients: int, visits: int) -> list[Patient]:
    """Each patient's tracks: 1–4 at the first visit, new ones later; sites repeat within a patient
    sometimes (two wounds on one shin), so linking needs position and size, not the site alone."""
    patients = []
    for p in range(n_patients):
        patient = Patient(f"V{p + 1:03d}", start=date(2024, 1, 8) + timedelta(days=int(rng.integers(0, 60))))
        taken: list[np.ndarray] = []
        n_first = int(rng.integers(1, MAX_TRACKS))
        starts = ([0] * n_first + [v for v in range(1, visits) if rng.random() < 0.15])[:MAX_TRACKS]
        for t, first in enumerate(starts):
            same_site = patient.tracks and rng.random() < 0.35
            site = patient.tracks[-1].site if same_site else SITES[int(rng.integers(len(SITES)))]
            kind = rng.random()
            rate = (rng.uniform(-1.2, -0.6) if kind < 0.3 else rng.uniform(-0.35, -0.05) if kind < 0.8
                    else rng.uniform(0.02, 0.12))
            patient.tracks.append(Track(f"{patient.patient_id}-T{t + 1}", patient.patient_id, site,
                                        _free_spot(rng, taken, 9.0), _unit_shape(rng), float(rng.uniform(2.0, 15.0)),
                                        float(rate), first))
            taken.append(patient.tracks[-1].centre)
        patients.append(patient)
    return patients


def _square(at: np.ndarray, side: float) -> np.ndarray:
    """The marker's tile (quiet zone included) as its corner and edge points."""
    pad = side / 6
    t = np.linspace(-pad, side + pad, 9)
    return np.concatenate([np.stack([t, np.full_like(t, a)], 1) for a in (-pad, side + pad)]
                          + [np.stack([np.full_like(t, a), t], 1) for a in (-pad, side + pad)]) + at


def _ruler_spot(rng: np.random.Generator, taken: list[np.ndarray]) -> np.ndarray:
    """The ruler's zero end: its strip (RULER_CM long, 1 cm wide) clear of ``taken`` by 1 cm."""
    for _ in range(2000):
        p = np.array([rng.uniform(1.0, PLANE_CM[0] - RULER_CM - 1.5), rng.uniform(1.0, PLANE_CM[1] - 1.0)])
        strip = p + np.stack([np.linspace(-0.5, RULER_CM + 0.5, 23), np.zeros(23)], 1)
        if all(np.min(np.linalg.norm(q[:, None] - strip[None], axis=2)) >= 1.5 for q in taken):
            return p
    raise ValueError("no free spot for the ruler on the phantom plane")


def _in_view(h: np.ndarray, pts: np.ndarray, margin: float = 8.0) -> bool:
    px = _project(h, pts)
    return bool((px >= margin).all() and (px[:, 0] < SIZE[0] - margin).all() and (px[:, 1] < SIZE[1] - margin).all())


def camera(rng: np.random.Generator, look_at: np.ndarray, max_tilt: float = MAX_TILT, ppc: float | None = None,
           tilt: float | None = None, size: tuple[int, int] = SIZE) -> Camera:
    """A pinhole camera looking at ``look_at`` (cm) from a random distance (``ppc``: photo pixels per cm
    at the plane's centre), tilt (about a random axis in the plane) and roll."""
    ppc = float(rng.uniform(*PPC_RANGE)) if ppc is None else float(ppc)
    tilt = float(rng.uniform(0.0, max_tilt)) if tilt is None else float(tilt)
    roll = float(rng.uniform(-25.0, 25.0))
    axis_angle = rng.uniform(0, 2 * np.pi)
    rvec = np.array([math.cos(axis_angle), math.sin(axis_angle), 0.0]) * math.radians(tilt)
    tilt_r, _ = cv2.Rodrigues(rvec)
    roll_r, _ = cv2.Rodrigues(np.array([0.0, 0.0, math.radians(roll)]))
    r = roll_r @ tilt_r
    k = np.array([[FOCAL, 0, size[0] / 2], [0, FOCAL, size[1] / 2], [0, 0, 1]])
    t = np.array([0.0, 0.0, FOCAL / ppc])
    centre = np.array([[1, 0, -look_at[0]], [0, 1, -look_at[1]], [0, 0, 1]])
    h = k @ np.column_stack([r[:, 0], r[:, 1], t]) @ centre
    return Camera(h / h[2, 2], ppc, tilt, roll)


def _project(h: np.ndarray, pts: np.ndarray) -> np.ndarray:
    return cv2.perspectiveTransform(np.asarray(pts, np.float64).reshape(-1, 1, 2), h).reshape(-1, 2)


def _fill(img: np.ndarray, pts: np.ndarray, value: Any) -> None:
    cv2.fillPoly(img, [np.round(pts * 16).astype(np.int32)], value, lineType=cv2.LINE_8, shift=4)


def _skin(rng: np.random.Generator) -> np.ndarray:
    h, w = int(PLANE_CM[1] * TEXTURE_PPC), int(PLANE_CM[0] * TEXTURE_PPC)
    tone = np.array([rng.uniform(150, 235), rng.uniform(110, 175), rng.uniform(95, 150)])
    noise = cv2.GaussianBlur(rng.normal(0, 1, (h, w)).astype(np.float32), (0, 0), 6) * 40
    return np.clip(tone[None, None] + noise[..., None], 0, 255).astype(np.uint8)


def _marker_tile(side_px: int) -> np.ndarray:
    """The marker with a white quiet zone of one module all round (RGB)."""
    d = cv2.aruco.getPredefinedDictionary(getattr(cv2.aruco, MARKER["dictionary"]))
    marker = cv2.aruco.generateImageMarker(d, MARKER["id"], side_px)
    pad = side_px // 6
    return cv2.cvtColor(cv2.copyMakeBorder(marker, pad, pad, pad, pad, cv2.BORDER_CONSTANT, value=255),
                        cv2.COLOR_GRAY2RGB)


def render_visit(rng: np.random.Generator, texture: np.ndarray, wounds: list[tuple[np.ndarray, bool]],
                 marker_at: np.ndarray, ruler_at: np.ndarray, cam: Camera) -> tuple[np.ndarray, np.ndarray]:
    """The photo and its label map: ``wounds`` are (outline in cm, closed) in label order."""
    plane = texture.copy()
    for outline, closed in wounds:
        px = outline * TEXTURE_PPC
        if closed:
            _fill(plane, px, (232, 190, 185))
            continue
        _fill(plane, px, (150, 30, 35))
        inner = px.mean(axis=0) + (px - px.mean(axis=0)) * 0.55
        _fill(plane, inner, (200, 170, 60) if rng.random() < 0.5 else (120, 20, 30))
    side = int(MARKER["side_cm"] * TEXTURE_PPC)
    tile = _marker_tile(side)
    x0, y0 = (marker_at * TEXTURE_PPC).astype(int) - side // 6
    plane[y0:y0 + tile.shape[0], x0:x0 + tile.shape[1]] = tile
    rx, ry = (ruler_at * TEXTURE_PPC).astype(int)
    plane[ry - TEXTURE_PPC // 2:ry + TEXTURE_PPC // 2, rx - 10:rx + int((RULER_CM + 1) * TEXTURE_PPC)] = 245
    for cm in range(int(RULER_CM) + 1):
        x = rx + cm * TEXTURE_PPC
        plane[ry - TEXTURE_PPC // 2:ry, x - 1:x + 2] = 20
    scale = np.diag([1.0 / TEXTURE_PPC, 1.0 / TEXTURE_PPC, 1.0])
    photo = cv2.warpPerspective(plane, cam.homography @ scale, SIZE, flags=cv2.INTER_AREA,
                                borderMode=cv2.BORDER_CONSTANT, borderValue=(40, 40, 45))
    photo = cv2.GaussianBlur(photo, (0, 0), 0.7)
    photo = np.clip(photo + rng.normal(0, 3, photo.shape), 0, 255).astype(np.uint8)
    labels = np.zeros(SIZE[::-1], np.uint8)
    for n, (outline, _) in enumerate(wounds, start=1):
        labels[_inside(_project(cam.homography, outline), labels.shape)] = n
    return photo, labels


def _inside(poly: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """Pixels whose centre lies inside ``poly`` (even-odd rule): an unbiased outline, where
    ``cv2.fillPoly`` also fills the pixels its edges cross (a +0.5 px rim, +5% on a 25 px wound)."""
    x0, y0 = np.floor(poly.min(axis=0)).astype(int)
    x1, y1 = np.ceil(poly.max(axis=0)).astype(int)
    ys, xs = np.mgrid[max(y0, 0):min(y1 + 1, shape[0]), max(x0, 0):min(x1 + 1, shape[1])]
    px, py = xs.ravel().astype(np.float64), ys.ravel().astype(np.float64)
    inside = np.zeros(px.shape, bool)
    a, b = poly, np.roll(poly, -1, axis=0)
    for (ax, ay), (bx, by) in zip(a, b):
        crosses = (ay > py) != (by > py)
        with np.errstate(divide="ignore", invalid="ignore"):
            x_at = ax + (py - ay) * (bx - ax) / (by - ay)
        inside ^= crosses & (px < x_at)
    out = np.zeros(shape, bool)
    out[ys.ravel()[inside], xs.ravel()[inside]] = True
    return out


def build_visits(out: str | Path, visits: int, patients: int = 21, seed: int = 0,
                 progress: bool = False) -> dict[str, Any]:
    """Write the phantom-visits dataset folder to ``out``; return a summary."""
    if visits < 2:
        raise ValueError(f"--visits must be at least 2, got {visits}")
    if patients < 1:
        raise ValueError(f"--patients must be at least 1, got {patients}")
    out = Path(out)
    for sub in ("images", "masks", "truth"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    people = plan_patients(rng, patients, visits)
    image_rows, wound_rows, truth_rows = [], [], []
    bar = tqdm(total=patients * visits, desc="phantom visits", disable=not progress)
    for patient in people:
        texture = _skin(rng)
        for v in range(visits):
            day = patient.start + timedelta(days=v * INTERVAL_DAYS + int(rng.integers(-3, 4)))
            drawn = []
            for track in patient.tracks:
                if v < track.first or (track.closed_at is not None and v > track.closed_at):
                    continue
                days = (v - track.first) * INTERVAL_DAYS
                area = track.area(days)
                closed = area < CLOSE_CM2
                if closed:
                    track.closed_at = v
                drawn.append((track, track.outline(max(area, 1.0) if closed else area), closed,
                              0.0 if closed else area))
            bar.update()
            if not drawn:
                continue
            outlines = [o for _, o, *_ in drawn]
            side = MARKER["side_cm"]
            marker_mid = _free_spot(rng, outlines, side * 0.95 + 0.5, margin=side)
            marker_at = marker_mid - side / 2
            ruler_at = _ruler_spot(rng, [*outlines, _square(marker_at, side)])
            look_at = np.mean([*(t.centre for t, *_ in drawn), marker_mid], axis=0)
            everything = np.concatenate([*outlines, _square(marker_at, side), ruler_at + [[0, 0], [RULER_CM, 0]]])
            cam = camera(rng, look_at)
            while not _in_view(cam.homography, everything):
                cam = camera(rng, look_at)
            photo, labels = render_visit(rng, texture, [(o, c) for _, o, c, _ in drawn], marker_at, ruler_at, cam)
            image_id = f"{patient.patient_id}_v{v + 1:02d}"
            Image.fromarray(photo).save(out / "images" / f"{image_id}.png", compress_level=1)
            Image.fromarray(labels).save(out / "masks" / f"{image_id}.png")
            ends = _project(cam.homography, np.array([ruler_at, ruler_at + [RULER_CM, 0.0]]))
            ends += rng.normal(0, 0.5, ends.shape)
            ruler = " ".join(f"{x:.1f}" for x in ends.ravel()) + f" {RULER_CM:g}"
            image_rows.append([image_id, patient.patient_id, day.isoformat(), ruler])
            for n, (track, _, closed, area) in enumerate(drawn, start=1):
                wound_rows.append([image_id, n, f"SYNTHETIC follow-up wound, {track.site}", track.track_id,
                                   track.site, "true" if closed else "false"])
                truth_rows.append([image_id, n, track.track_id, patient.patient_id, day.isoformat(), v + 1,
                                   round(area, 4), int(closed), int(v == track.first and v > 0),
                                   round(cam.ppc, 3), round(cam.tilt_deg, 2), round(cam.roll_deg, 2),
                                   json.dumps(np.round(cam.homography, 8).tolist())])
    bar.close()
    _csv(out / "images.csv", ["image_id", "patient_id", "visit_date", "ruler"], image_rows)
    _csv(out / "wounds.csv", ["image_id", "wound_index", "description", "track_id", "site", "closed"], wound_rows)
    _csv(out / "patients.csv", ["patient_id"], [[p.patient_id] for p in people])
    _csv(out / "truth" / "visits.csv", ["image_id", "wound_index", "track_id", "patient_id", "visit_date", "visit",
                                        "area_cm2", "closed", "new_track", "ppc", "tilt_deg", "roll_deg",
                                        "homography"], truth_rows)
    (out / "dataset.json").write_text(json.dumps(
        {"name": "phantom-visits", "synthetic": True, "mask_format": "label", "marker": MARKER,
         "columns": {"track_id": "str", "site": "str", "closed": "bool", "visit_date": "str", "ruler": "str"}},
        indent=2))
    tracks = [t for p in people for t in p.tracks]
    return {"synthetic": True, "patients": patients, "visits": visits, "photos": len(image_rows),
            "wounds": len(wound_rows), "tracks": len(tracks), "closed": sum(t.closed_at is not None for t in tracks),
            "new_after_baseline": sum(t.first > 0 for t in tracks), "out": str(out)}


def _csv(path: Path, header: list[str], rows: list[list[Any]]) -> None:
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(rows)


def read_truth(root: str | Path) -> list[dict[str, Any]]:
    """``truth/visits.csv`` rows with typed values."""
    with (Path(root) / "truth" / "visits.csv").open(encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    for r in rows:
        r["wound_index"], r["visit"] = int(r["wound_index"]), int(r["visit"])
        r["area_cm2"], r["ppc"], r["tilt_deg"] = float(r["area_cm2"]), float(r["ppc"]), float(r["tilt_deg"])
        r["closed"], r["new_track"] = r["closed"] == "1", r["new_track"] == "1"
        r["homography"] = np.array(json.loads(r["homography"]))
    return rows
