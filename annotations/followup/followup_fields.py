"""The follow-up fields (:mod:`annotations.followup`): their names and their checked values.

Below both :mod:`annotations.io.dataset` (which checks them on import) and :mod:`annotations.followup`
(which edits, measures and links them), so neither imports the other to check a value.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterable
from datetime import date, datetime, timezone
from typing import Any

from annotations.followup.measure import MarkerSpec, MeasureError
from annotations.io.readers import DatasetError, parse_bool

VISIT_DATE, RULER, TRACK, SITE, CLOSED = "visit_date", "ruler", "track_id", "site", "closed"
#: The earliest visit date accepted (a date before it is a typing or a default-value slip).
EARLIEST_VISIT = date(1900, 1, 1)


def parse_visit_date(value: Any, where: str, today: date | None = None) -> date:
    """An ISO 8601 date or date-time → its date; unparseable, before :data:`EARLIEST_VISIT` or later than
    ``today`` (UTC) raises."""
    text = str(value).strip()
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise DatasetError(f"{where}: visit_date {text!r} is not an ISO 8601 date (YYYY-MM-DD)") from None
    day = parsed.date()
    today = today or datetime.now(timezone.utc).date()
    if day > today:
        raise DatasetError(f"{where}: visit_date {text!r} is in the future (today is {today.isoformat()})")
    if day < EARLIEST_VISIT:
        raise DatasetError(f"{where}: visit_date {text!r} is before {EARLIEST_VISIT.isoformat()}; "
                           "not a plausible visit")
    return day


def track_of(metadata: dict[str, Any]) -> str | None:
    """A wound's track id (text), or None."""
    value = metadata.get(TRACK)
    return None if value is None or str(value).strip() == "" else str(value).strip()


def is_closed(metadata: dict[str, Any], where: str = "closed") -> bool:
    """Whether the photo's metadata marks its wound closed (a bad value raises, naming ``where``)."""
    return parse_bool(metadata[CLOSED], where) if metadata.get(CLOSED) not in (None, "") else False


def marker_spec(value: Any, where: str = "dataset.json: marker") -> MarkerSpec:
    """``{"dictionary", "id", "side_cm"}`` → :class:`MarkerSpec`: a dictionary of
    :data:`~annotations.followup.measure.ARUCO_DICTIONARIES`, a whole id (``3`` or ``"3"``, never ``3.5``) and
    a side in :data:`~annotations.followup.measure.MARKER_SIDE_CM` (one clear error naming the field otherwise)."""
    if not isinstance(value, dict) or not {"id", "side_cm"} <= set(value):
        raise DatasetError(f"{where}: must be {{\"dictionary\": \"DICT_4X4_50\", \"id\": 7, \"side_cm\": 4}}, "
                           f"got {value!r}")
    marker_id, side = value["id"], value["side_cm"]
    if isinstance(marker_id, str) and marker_id.strip().isascii() and marker_id.strip().isdigit():
        marker_id = int(marker_id.strip())
    if isinstance(side, str):
        with contextlib.suppress(ValueError):  # "4" reads as 4; other text is refused below
            side = float(side)
    try:
        return MarkerSpec(value.get("dictionary", "DICT_4X4_50"), marker_id, side)
    except MeasureError as err:
        raise MeasureError(f"{where}: {err}") from None


def check_tracks(wounds: Iterable[tuple[str, int, dict[str, Any], str]], patients: dict[str, str | None]) -> None:
    """The track rules on ``(image_id, wound_index, metadata, where)`` wounds, ``patients`` each photo's
    patient: closed flags parse, one wound per photo per track, one patient per track."""
    on_track: dict[tuple[str, str], int] = {}
    track_patient: dict[str, tuple[str | None, str]] = {}
    for image_id, index, metadata, where in wounds:
        if CLOSED in metadata:
            is_closed(metadata, f"{where}: closed")
        track = track_of(metadata)
        if track is None:
            continue
        other = on_track.setdefault((image_id, track), index)
        if other != index:
            raise DatasetError(f"{where}: wounds {other} and {index} of photo {image_id!r} are both on track "
                               f"{track!r}; a track is one wound, seen once per photo")
        patient = patients.get(image_id)
        first = track_patient.setdefault(track, (patient, image_id))
        if first[0] != patient:
            raise DatasetError(f"{where}: track {track!r} holds wounds of patient {first[0]!r} (photo {first[1]!r}) "
                               f"and of patient {patient!r} (photo {image_id!r}); a track is one patient's wound")
