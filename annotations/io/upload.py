"""Photos uploaded in the browser: one visit of one patient, stored all or nothing.

Each file is checked as ``import`` checks a dataset folder's photos, with the same messages
(:func:`annotations.io.readers.photo_id`, :func:`annotations.io.readers.normalise_photo`: type and id,
pixel budget, EXIF orientation applied, 16-bit scaled, identifying metadata stripped), plus a size
limit per photo (:data:`MAX_PHOTO_MB`, Streamlit's ``server.maxUploadSize``) and a photo count per
upload (:data:`MAX_PHOTOS`). The patient id, the visit date and the calibration marker are checked
by the follow-up rules (:mod:`annotations.followup`). Every file is checked before anything is
written; the photos then go in through a journalled swap committed with the store's rows, as an
import does (:mod:`annotations.infra.journal`), so an error or a crash leaves the workspace as it was.

A photo of a known patient is a new visit of that patient: dated, it joins the follow-up flow, where
its outlined wounds wait to be linked to the patient's tracks (:func:`annotations.followup.followup.pending_links`).
"""
from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import date
from pathlib import Path
from typing import Any

from annotations.accounts.accounts import Account, AuthError
from annotations.followup import followup
from annotations.infra.journal import Swap
from annotations.infra.workspace import Workspace
from annotations.io.dataset import check_kind
from annotations.io.readers import DatasetError, Photo, check_id, clear_error, normalise_photo, photo_id
from annotations.store.rows import StoreError

#: Largest photo accepted, in megabytes of 1024 × 1024 bytes (``.streamlit/config.toml`` sets Streamlit's
#: ``server.maxUploadSize`` to the same).
MAX_PHOTO_MB = 50
MAX_PHOTO_BYTES = MAX_PHOTO_MB * 1024 * 1024
#: Most photos in one upload.
MAX_PHOTOS = 50
#: What an account needs to upload (admins and annotators).
PERMISSION = "annotate"


def refusal(ws: Workspace, account: Account) -> str | None:
    """Why ``account`` may not upload photos into ``ws`` (None: it may)."""
    if not account.can(PERMISSION):
        return _role_refusal(account)
    try:
        check_kind(ws, synthetic=False)
    except DatasetError as err:
        return str(err)
    return None


def upload_photos(ws: Workspace, files: Sequence[tuple[str, bytes]], patient_id: str | None,
                  visit_date: str | date | None, marker: Mapping[str, Any] | None = None, *,
                  account: Account) -> dict[str, Any]:
    """Store ``files`` (``(file name, bytes)`` pairs) as one visit of ``patient_id`` on ``visit_date``.

    ``marker`` (``{"dictionary", "id", "side_cm"}``) is the printed calibration marker the photos show:
    it becomes the workspace's marker when it has none and must be the workspace's otherwise. A role
    without ``annotate`` raises :class:`~annotations.accounts.accounts.AuthError`; any bad value or file raises one
    :class:`DatasetError` naming the file (or the field) and stores nothing. Returns what was added:
    ``images`` (ids), ``patient``, ``new_patient``, ``visit_date``, ``earlier_visits`` (the patient's
    other visit dates) and ``tracks`` (the patient's wound tracks, to which the new wounds will link)."""
    if not account.can(PERMISSION):
        raise AuthError(_role_refusal(account))
    if not str(patient_id or "").strip():
        raise DatasetError("patient: give the patient's id (a known patient, or a new one)")
    patient = check_id(str(patient_id).strip(), "patient", "patient id")
    if visit_date in (None, ""):
        raise DatasetError("visit date: give the day the photos were taken")
    day = followup.parse_visit_date(visit_date.isoformat() if isinstance(visit_date, date) else visit_date,
                                    "visit date")
    spec = _marker(ws, marker)
    check_kind(ws, synthetic=False)
    if not files:
        raise DatasetError("no photos to upload: choose one or more photo files")
    if len(files) > MAX_PHOTOS:
        raise DatasetError(f"{len(files)} photos, more than the {MAX_PHOTOS} one upload takes; upload them in parts")
    store = ws.store
    checked: dict[str, tuple[str, bytes]] = {}  # image id → (file name as given, bytes)
    for name, data in files:
        where = _shown(name)
        if Path(name).name != name:
            raise DatasetError(f"{where}: a file name may not hold a folder")
        image_id = photo_id(name, where)
        if image_id in checked:
            raise DatasetError(f"{where}: a second image with id {image_id!r} (also {checked[image_id][0]})")
        if len(data) > MAX_PHOTO_BYTES:
            raise DatasetError(f"{where}: {len(data):,} bytes, more than the {MAX_PHOTO_BYTES:,} allowed "
                               f"({MAX_PHOTO_MB} MB a photo)")
        checked[image_id] = (name, data)
    _refuse_taken(ws, checked)
    swap = Swap(ws.root, "import")
    try:
        photos = _spool(checked, swap.dir / "images")
        with store.transaction():
            _refuse_taken(ws, checked)  # again, under the write lock: another upload may have come first
            known = store.patient(patient) is not None
            if not known:
                store.upsert_patient(patient, {}, actor=account.name)
            for image_id, (file, photo) in photos.items():
                store.upsert_image(image_id, file, photo.sha256, photo.width, photo.height, patient,
                                   {**photo.metadata, followup.VISIT_DATE: day.isoformat()}, actor=account.name)
            if spec is not None and store.get_meta("marker") is None:
                store.set_meta("marker", {"dictionary": spec.dictionary, "id": spec.marker_id,
                                          "side_cm": spec.side_cm})
            swap.plan([(swap.dir / "images" / file, ws.images_dir / file) for file, _ in photos.values()],
                      commit="meta")
            swap.forward()
            store.set_meta(swap.meta_key, True)  # commits the swap with the rows
        swap.done()
        with contextlib.suppress(StoreError), store.transaction():  # the upload stands; a key left is inert
            store.delete_meta(swap.meta_key)
    except BaseException as err:
        if swap.entries and not swap.settled:  # the transaction rolled back
            swap.backward()
            swap.done()
        clear = clear_error(err, ws.root, "nothing was uploaded")
        if clear is None:
            raise
        raise clear from None
    finally:
        swap.close()
    earlier = sorted({str(i["metadata"][followup.VISIT_DATE]) for i in store.images()
                      if i["patient_id"] == patient and i["image_id"] not in photos
                      and i["metadata"].get(followup.VISIT_DATE)})
    return {"images": list(photos), "patient": patient, "new_patient": not known, "visit_date": day.isoformat(),
            "earlier_visits": earlier,
            "tracks": [t["track_id"] for t in followup.tracks(store) if t["patient_id"] == patient]}


def _role_refusal(account: Account) -> str:
    return (f"{account.name} ({account.role}) may not upload photos: only admins and annotators do "
            "(ask an admin if you need it)")


def _shown(name: str) -> str:
    """A file name as messages show it (quoted when it holds a control character)."""
    return name if name.isprintable() else repr(name)


def _refuse_taken(ws: Workspace, checked: Mapping[str, tuple[str, bytes]]) -> None:
    """An id already in the workspace is an error naming the file."""
    for image_id, (name, _) in checked.items():
        if ws.store.image(image_id) is not None:
            raise DatasetError(f"{_shown(name)}: photo {image_id!r} is already in the workspace; rename the file "
                               "(a photo id names one photo)")


def _marker(ws: Workspace, marker: Mapping[str, Any] | None) -> followup.MarkerSpec | None:
    """The checked marker (None: none given); one other than the workspace's is an error."""
    if marker is None:
        return None
    spec = followup.marker_spec(dict(marker), "marker")
    current = followup.workspace_marker(ws)
    if current is not None and current != spec:
        raise DatasetError(f"marker: this workspace measures with {current.dictionary} id {current.marker_id}, "
                           f"{current.side_cm:g} cm, not {spec.dictionary} id {spec.marker_id}, {spec.side_cm:g} cm "
                           "(one marker per workspace: every size depends on it)")
    return spec


def _spool(checked: Mapping[str, tuple[str, bytes]], folder: Path) -> dict[str, tuple[str, Photo]]:
    """Each photo checked and normalised (upright, 8-bit, stripped) and its stored form written to
    ``folder``: image id → (workspace file name, photo without its bytes)."""
    folder.mkdir()
    out = {}
    for image_id, (name, data) in checked.items():
        suffix = Path(name).suffix.lower()
        photo = normalise_photo(data, _shown(name), suffix)
        file = f"{image_id}{suffix}"
        (folder / file).write_bytes(photo.data)
        out[image_id] = (file, replace(photo, data=b""))
    return out
