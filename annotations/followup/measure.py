"""Physical wound size: area in cm², clinical length × perpendicular width, from a calibration marker
or a ruler segment; without either, pixels only (never an invented cm²).

- **Marker**: a printed ArUco square of known side (:class:`MarkerSpec`) found with OpenCV's
  ``cv2.aruco``; the homography from its four corners to the marker's plane (in cm) corrects the
  perspective, so a wound lying in the marker's plane is measured at its true size at any tilt.
- **Ruler**: a segment the clinician draws along a ruler in the photo with its length in cm
  (:class:`Ruler`): one scale, no perspective correction. Two ends on one line cannot show the photo's
  tilt, so a ruler's uncertainty allows for any tilt up to :data:`RULER_MAX_TILT_DEG`: the foreshortening
  that tilt can cause, and the change of scale with depth between the ruler and the wound (growing with
  their distance in the photo over an assumed focal length, :data:`FOCAL_PER_SIDE`). Use the printed
  marker for a tilted photo.

Every :class:`Measurement` says how it was measured and carries a relative uncertainty of its area with
the reasons that raise it (marker small in the frame, far from the wound, steep tilt; a wound far from
the ruler). The marker's is a stated heuristic (corner localisation of ±0.5 px, a planarity allowance
growing with the wound's distance from the marker), not a calibrated interval; the ruler's is the first-order
error a tilt up to :data:`RULER_MAX_TILT_DEG` can cause (``python -m benchmarks.followup`` reports how often
it covers the measured error).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import cv2
import numpy as np

from annotations.io.readers import DatasetError

#: Corner localisation error of a detected marker or a drawn ruler end (pixels, one sigma).
CORNER_PX = 0.5
#: Reasons and their thresholds: a marker side under SMALL_MARKER_PX, a wound more than FAR_SIDES marker
#: sides away, or a tilt over STEEP_TILT_DEG are reported with the value.
SMALL_MARKER_PX = 40.0
FAR_SIDES = 6.0
STEEP_TILT_DEG = 35.0
#: Relative area error per marker side of distance (skin is not a plane).
PLANARITY_PER_SIDE = 0.003
#: The tilt a ruler photo's uncertainty allows for (degrees): a ruler cannot see it, a marker can.
RULER_MAX_TILT_DEG = 30.0
#: The focal length assumed for a ruler photo, per pixel of its longer side (a phone's main camera, ~65° across).
FOCAL_PER_SIDE = 0.8


class MeasureError(DatasetError):
    """Bad calibration input (a marker that is not the configured one, a ruler of length 0)."""


#: Physically plausible ranges; a value outside is refused (input) or flagged (a measurement).
#: A printed marker's side and a ruler segment's length, in cm (a close-up's field is tens of cm).
MARKER_SIDE_CM = (0.5, 20.0)
RULER_CM = (0.5, 50.0)
#: The scale a calibration may give at the wound, in cm per pixel (10 µm to 1 cm a pixel).
SCALE_CM_PER_PX = (1e-3, 1.0)
#: The largest plausible single wound, in cm² (beyond the largest burns and ulcers photographed).
MAX_WOUND_CM2 = 2000.0
#: The ArUco dictionaries OpenCV predefines (``cv2.aruco.DICT_*``): the only names a marker may give.
ARUCO_DICTIONARIES = tuple(sorted(n for n in dir(cv2.aruco)
                                  if n.startswith("DICT_") and isinstance(getattr(cv2.aruco, n), int)))


def in_range(value: float, bounds: tuple[float, float]) -> bool:
    """Whether ``value`` is a finite number within ``bounds`` (inclusive)."""
    return math.isfinite(value) and bounds[0] <= value <= bounds[1]


@dataclass(frozen=True)
class MarkerSpec:
    """The configured printed marker: ArUco dictionary name (one of :data:`ARUCO_DICTIONARIES`), a
    whole id of it and the black square's side in cm (within :data:`MARKER_SIDE_CM`)."""

    dictionary: str = "DICT_4X4_50"
    marker_id: int = 7
    side_cm: float = 4.0

    def __post_init__(self) -> None:
        if self.dictionary not in ARUCO_DICTIONARIES:
            raise MeasureError(f"dictionary {self.dictionary!r} is not an OpenCV ArUco dictionary "
                               f"(one of {', '.join(ARUCO_DICTIONARIES[:3])}, …)")
        if isinstance(self.marker_id, bool) or not isinstance(self.marker_id, int) or self.marker_id < 0:
            raise MeasureError(f"id must be a whole number ≥ 0, got {self.marker_id!r}")
        if isinstance(self.side_cm, bool) or not isinstance(self.side_cm, (int, float)) \
                or not in_range(float(self.side_cm), MARKER_SIDE_CM):
            raise MeasureError(f"side_cm must be a number of {MARKER_SIDE_CM[0]:g} to {MARKER_SIDE_CM[1]:g} cm, "
                               f"got {self.side_cm!r}")

    def detector(self, refine: bool = False) -> cv2.aruco.ArucoDetector:
        """OpenCV's detector; ``refine`` fits the corners AprilTag's way (unbiased where SUBPIX reads
        them ~0.3 px inside the square, but slow: run it on the marker's neighbourhood only)."""
        params = cv2.aruco.DetectorParameters()
        if refine:
            params.cornerRefinementMethod = cv2.aruco.CORNER_REFINE_APRILTAG
        return cv2.aruco.ArucoDetector(cv2.aruco.getPredefinedDictionary(getattr(cv2.aruco, self.dictionary)),
                                       params)

    def image(self, side_px: int) -> np.ndarray:
        """The marker drawn ``side_px`` pixels wide (uint8, black and white, no quiet zone)."""
        dictionary = cv2.aruco.getPredefinedDictionary(getattr(cv2.aruco, self.dictionary))
        return cv2.aruco.generateImageMarker(dictionary, self.marker_id, int(side_px))


@dataclass(frozen=True)
class Ruler:
    """A segment drawn on the photo (pixel end points) and its length in cm."""

    x1: float
    y1: float
    x2: float
    y2: float
    length_cm: float

    @classmethod
    def parse(cls, text: str, where: str, size: tuple[int, int] | None = None) -> Ruler:
        """``"x1 y1 x2 y2 length_cm"`` (the ``ruler`` column of images.csv), checked (:meth:`check`)."""
        parts = str(text).replace(",", " ").split()
        try:
            values = [float(p) for p in parts]
        except ValueError:
            values = []
        if len(values) != 5 or not all(math.isfinite(v) for v in values):
            raise MeasureError(f"{where}: ruler must be 'x1 y1 x2 y2 length_cm', got {text!r}")
        ruler = cls(*values)
        ruler.check(where, size)
        return ruler

    @property
    def length_px(self) -> float:
        """The segment's length in pixels."""
        return math.hypot(self.x2 - self.x1, self.y2 - self.y1)

    def check(self, where: str, size: tuple[int, int] | None = None) -> None:
        """Raise MeasureError, naming ``where``, for a length outside :data:`RULER_CM`, a zero-length
        segment, or (given the photo's ``size``, width × height) an end outside the photo."""
        if not self.length_cm > 0:
            raise MeasureError(f"{where}: ruler length must be > 0 cm, got {self.length_cm!r}")
        if not in_range(self.length_cm, RULER_CM):
            raise MeasureError(f"{where}: ruler length must be {RULER_CM[0]:g} to {RULER_CM[1]:g} cm, "
                               f"got {self.length_cm!r}")
        if self.length_px < 1:
            raise MeasureError(f"{where}: ruler segment has length 0 px (both ends at "
                               f"({self.x1:g}, {self.y1:g}))")
        if size is not None:
            for x, y in ((self.x1, self.y1), (self.x2, self.y2)):
                if not (0 <= x <= size[0] and 0 <= y <= size[1]):
                    raise MeasureError(f"{where}: ruler end ({x:g}, {y:g}) is outside the photo "
                                       f"({size[0]} × {size[1]} px)")

    def text(self) -> str:
        """The ruler as text: ``x1 y1 x2 y2 length_cm``."""
        return f"{self.x1:g} {self.y1:g} {self.x2:g} {self.y2:g} {self.length_cm:g}"


@dataclass
class Calibration:
    """Image pixels → plane cm: ``homography`` (3×3) maps (x, y, 1) to plane (X, Y, w)."""

    method: str  # "marker" | "ruler"
    homography: np.ndarray
    #: marker: its four corners in the image and side in pixels; ruler: its two ends and length in pixels
    corners: np.ndarray | None = None
    side_px: float = 0.0
    tilt_deg: float = 0.0

    def to_plane(self, points: np.ndarray) -> np.ndarray:
        """Image points (n×2) → plane points in cm (n×2)."""
        return cv2.perspectiveTransform(np.asarray(points, np.float64).reshape(-1, 1, 2),
                                        self.homography).reshape(-1, 2)


@dataclass
class Measurement:
    """One wound's size; cm values are None when the photo has no calibration."""

    area_px: int
    method: str  # "marker" | "ruler" | "pixels"
    area_cm2: float | None = None
    length_cm: float | None = None
    width_cm: float | None = None
    #: relative, of the area: a marker's 1 sigma; a ruler's the error a tilt up to RULER_MAX_TILT_DEG can cause
    uncertainty: float | None = None
    reasons: list[str] = field(default_factory=list)
    #: the wound's centroid: cm on the calibration's plane, else pixels
    centre: tuple[float, float] | None = None
    #: why the calibrated size is implausible and not given (see :func:`measure`), else None
    flag: str | None = None


def find_marker(image: np.ndarray, spec: MarkerSpec, where: str) -> Calibration | None:
    """The configured marker's calibration in ``image`` (RGB or grey), or None when no marker shows.

    A marker of the configured dictionary with another id raises :class:`MeasureError` naming it."""
    grey = image if image.ndim == 2 else cv2.cvtColor(np.ascontiguousarray(image), cv2.COLOR_RGB2GRAY)
    corners, ids, _ = spec.detector().detectMarkers(grey)
    if ids is None or len(ids) == 0:
        return None
    found = [int(i) for i in ids.ravel()]
    if spec.marker_id not in found:
        raise MeasureError(f"{where}: marker id {', '.join(map(str, found))} is not the configured marker "
                           f"(id {spec.marker_id} of {spec.dictionary})")
    quad = _refined(grey, corners[found.index(spec.marker_id)].reshape(4, 2), spec)
    s = spec.side_cm
    plane = np.array([[0, 0], [s, 0], [s, s], [0, s]], np.float64)  # ArUco's corner order: TL, TR, BR, BL
    homography = cv2.getPerspectiveTransform(quad.astype(np.float32), plane.astype(np.float32)).astype(np.float64)
    sides = np.linalg.norm(quad - np.roll(quad, -1, axis=0), axis=1)
    return Calibration("marker", homography, quad, float(sides.mean()), _tilt(sides))


def _refined(grey: np.ndarray, quad: np.ndarray, spec: MarkerSpec) -> np.ndarray:
    """The marker's corners refined on a crop around it (half a side of margin)."""
    side = float(np.linalg.norm(quad - np.roll(quad, -1, axis=0), axis=1).max())
    x0, y0 = np.maximum(np.floor(quad.min(axis=0) - side / 2), 0).astype(int)
    x1, y1 = np.ceil(quad.max(axis=0) + side / 2).astype(int)
    crop = np.ascontiguousarray(grey[y0:y1, x0:x1])
    corners, ids, _ = spec.detector(refine=True).detectMarkers(crop)
    if ids is not None and spec.marker_id in ids.ravel():
        quad = corners[ids.ravel().tolist().index(spec.marker_id)].reshape(4, 2) + [x0, y0]
    return quad.astype(np.float64)


def _tilt(sides: np.ndarray) -> float:
    """A tilt estimate from the marker's foreshortening: arccos of its shortest over longest side
    pair (opposite sides averaged); 0 for a square seen face-on."""
    a, b = (sides[0] + sides[2]) / 2, (sides[1] + sides[3]) / 2
    return float(math.degrees(math.acos(min(1.0, min(a, b) / max(a, b)))))


def ruler_calibration(ruler: Ruler, where: str, size: tuple[int, int] | None = None) -> Calibration:
    """One scale (cm per pixel) from a drawn ruler; raises :class:`MeasureError` on a ruler that fails
    :meth:`Ruler.check` (``size``: the photo's width × height) or a scale outside :data:`SCALE_CM_PER_PX`."""
    ruler.check(where, size)
    k = ruler.length_cm / ruler.length_px
    if not in_range(k, SCALE_CM_PER_PX):
        raise MeasureError(f"{where}: ruler gives {k:.3g} cm per pixel ({ruler.length_cm:g} cm over "
                           f"{ruler.length_px:.0f} px), outside {SCALE_CM_PER_PX[0]:g} to {SCALE_CM_PER_PX[1]:g}")
    ends = np.array([[ruler.x1, ruler.y1], [ruler.x2, ruler.y2]], np.float64)
    return Calibration("ruler", np.diag([k, k, 1.0]), corners=ends, side_px=ruler.length_px)


def measure(mask: np.ndarray, calibration: Calibration | None) -> Measurement:
    """Area, clinical length (longest extent) and perpendicular width of the wound ``mask`` (bool).

    An implausible result (a scale at the wound outside :data:`SCALE_CM_PER_PX`, an area over
    :data:`MAX_WOUND_CM2`, or not finite) keeps no cm value: its ``flag`` says why."""
    mask = np.asarray(mask, bool)
    area_px = int(mask.sum())
    ys, xs = np.nonzero(mask)
    centre = (float(xs.mean()), float(ys.mean())) if area_px else None
    if calibration is None or area_px == 0:
        return Measurement(area_px, "pixels" if calibration is None else calibration.method,
                           area_cm2=None if calibration is None else 0.0, centre=centre)
    cx, cy = calibration.to_plane(np.array([centre]))[0]
    centre = (float(cx), float(cy))
    area = float(_pixel_areas(calibration.homography, xs, ys).sum())
    contours, _ = cv2.findContours(mask.astype(np.uint8), cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
    hull = cv2.convexHull(np.concatenate(contours).reshape(-1, 2)).reshape(-1, 2).astype(np.float64)
    corners = (hull[:, None, :] + np.array([[-.5, -.5], [.5, -.5], [.5, .5], [-.5, .5]])).reshape(-1, 2)
    length, width = _length_width(calibration.to_plane(corners))  # on the pixels' outer edges
    flag = _implausible(area, area_px, length, width)
    if flag is not None:
        return Measurement(area_px, calibration.method, flag=flag)
    m = Measurement(area_px, calibration.method, area_cm2=area, length_cm=length, width_cm=width, centre=centre)
    _uncertainty(m, calibration, xs, ys, max(mask.shape))
    return m


def _implausible(area: float, area_px: int, length: float, width: float) -> str | None:
    """Why a calibrated size cannot be right, or None."""
    if not all(math.isfinite(v) for v in (area, length, width)):
        return "calibration gives no finite size"
    scale = math.sqrt(area / area_px)
    if not in_range(scale, SCALE_CM_PER_PX):
        return (f"calibration gives {scale:.3g} cm per pixel at the wound, outside {SCALE_CM_PER_PX[0]:g} to "
                f"{SCALE_CM_PER_PX[1]:g}")
    if area > MAX_WOUND_CM2:
        return f"area {area:.4g} cm² is over the plausible {MAX_WOUND_CM2:g} cm²"
    return None


def _pixel_areas(h: np.ndarray, xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """Plane area (cm²) of each pixel (x, y): the homography's Jacobian determinant, det(H) / w³."""
    w = h[2, 0] * xs + h[2, 1] * ys + h[2, 2]
    return np.abs(np.linalg.det(h) / w ** 3)


def _length_width(points: np.ndarray) -> tuple[float, float]:
    """Longest extent (Feret diameter) and the extent perpendicular to it, on the hull."""
    hull = cv2.convexHull(points.astype(np.float32)).reshape(-1, 2).astype(np.float64)
    if len(hull) < 2:
        return 0.0, 0.0
    d = np.linalg.norm(hull[:, None] - hull[None], axis=2)
    i, j = np.unravel_index(int(d.argmax()), d.shape)
    axis = (hull[j] - hull[i]) / max(d[i, j], 1e-12)
    normal = np.array([-axis[1], axis[0]])
    across = hull @ normal
    return float(d[i, j]), float(across.max() - across.min())


def ruler_uncertainty(length_px: float, distance_px: float, photo_side_px: int) -> tuple[float, float, float]:
    """(relative area uncertainty, its tilt term, its depth term) of a wound measured with a ruler ``length_px``
    long whose centre is ``distance_px`` from the wound's, in a photo whose longer side is ``photo_side_px``.

    The ruler's ends (±:data:`CORNER_PX`) give the scale; a tilt up to :data:`RULER_MAX_TILT_DEG`, unseen by the
    ruler, can foreshorten the wound against it by up to 1/cos − 1 and, with the focal length taken as
    :data:`FOCAL_PER_SIDE` × ``photo_side_px``, change the depth (the area scales with depth²) between the ruler
    and the wound by up to tan(tilt) × distance / focal; the three combine in quadrature (their worst cases
    need different tilt axes)."""
    tilt = math.radians(RULER_MAX_TILT_DEG)
    corner = 2 * math.sqrt(2) * CORNER_PX / length_px
    foreshortening = 1 / math.cos(tilt) - 1
    depth = 2 * math.tan(tilt) * distance_px / (FOCAL_PER_SIDE * photo_side_px)
    return float(math.sqrt(corner ** 2 + foreshortening ** 2 + depth ** 2)), foreshortening, depth


def _uncertainty(m: Measurement, cal: Calibration, xs: np.ndarray, ys: np.ndarray, photo_side_px: int) -> None:
    assert cal.corners is not None  # a calibration keeps its marker's corners or its ruler's ends
    centre = cal.corners.mean(axis=0)
    distance_px = float(math.hypot(xs.mean() - centre[0], ys.mean() - centre[1]))
    if cal.method == "marker":
        corner = 2 * math.sqrt(2) * CORNER_PX / cal.side_px  # area ~ scale²; scale error ~ corner error / side
        distance_sides = distance_px / cal.side_px
        planarity = PLANARITY_PER_SIDE * distance_sides
        tilt = 0.0 if cal.tilt_deg <= STEEP_TILT_DEG else 0.02 * (cal.tilt_deg - STEEP_TILT_DEG) / 10
        m.uncertainty = float(math.sqrt(corner ** 2 + planarity ** 2 + tilt ** 2))
        if cal.side_px < SMALL_MARKER_PX:
            m.reasons.append(f"marker small in the frame ({cal.side_px:.0f} px a side)")
        if distance_sides > FAR_SIDES:
            m.reasons.append(f"marker far from the wound ({distance_sides:.1f} marker sides)")
        if cal.tilt_deg > STEEP_TILT_DEG:
            m.reasons.append(f"steep tilt (~{cal.tilt_deg:.0f}°)")
    else:
        m.uncertainty, _, depth = ruler_uncertainty(cal.side_px, distance_px, photo_side_px)
        m.reasons.append(f"ruler: no perspective correction; a tilt up to {RULER_MAX_TILT_DEG:g}° is allowed for "
                         "(use the printed marker for a tilted photo)")
        if distance_px > cal.side_px:
            m.reasons.append(f"wound far from the ruler ({distance_px / cal.side_px:.1f} ruler lengths: "
                             f"±{100 * depth:.0f}% from depth alone)")
