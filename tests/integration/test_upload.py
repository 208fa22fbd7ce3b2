"""Photo upload in the browser, its data layer (annotations.io.upload): a visit's photos checked as ``import``
checks them, stored all or nothing, upright and stripped, by role, and a known patient's new visit in the
follow-up flow. The page itself: tests/browser/test_browser_upload.py (AppTest cannot upload files)."""
from __future__ import annotations

import io
import tomllib
from datetime import date, timedelta
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageFilter
from streamlit.testing.v1 import AppTest

from annotations.accounts import accounts, session
from annotations.accounts.accounts import Account, AuthError
from annotations.followup import followup
from annotations.infra.workspace import Workspace
from annotations.io import upload
from annotations.io.dataset import import_dataset
from annotations.io.readers import DatasetError
from annotations.io.upload import MAX_PHOTO_BYTES, MAX_PHOTO_MB, MAX_PHOTOS, upload_photos

REPO = Path(__file__).resolve().parents[2]
NURSE = Account("Nurse Kim", "annotator")
RNG = np.random.default_rng(3)
SKIN = np.asarray(Image.fromarray(np.clip(RNG.normal(150, 40, (40, 60, 3)), 0, 255).astype(np.uint8))
                  .filter(ImageFilter.GaussianBlur(2)))  # 60 wide, 40 high
IDENTIFYING = (b"SERIAL-4711", b"Dr. Smith", b"PhoneMaker")


def jpeg(orientation: int = 1, pixels: np.ndarray = SKIN) -> bytes:
    """A phone photo: JPEG with EXIF orientation, maker, serial, artist and GPS."""
    exif = Image.Exif()
    exif[0x0112], exif[0x010F], exif[0xA431], exif[0x013B] = orientation, "PhoneMaker", "SERIAL-4711", "Dr. Smith"
    exif.get_ifd(0x8825)[1] = "N"
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="JPEG", exif=exif, quality=92)
    return buf.getvalue()


def png16() -> bytes:
    """A 16-bit greyscale PNG (scaled to 8 bits when stored)."""
    buf = io.BytesIO()
    Image.fromarray((np.arange(40 * 60).reshape(40, 60) * 27).astype(np.uint16)).save(buf, format="PNG")
    return buf.getvalue()


def state(ws: Workspace) -> tuple:
    """What an upload may change: counts, rows, the photos folder, the marker, swap folders left."""
    return (ws.store.counts(), ws.store.patients(), ws.store.images(), sorted(p.name for p in ws.images_dir.iterdir()),
            ws.store.get_meta("marker"), sorted(p.name for p in ws.root.iterdir() if p.name.startswith(".import-")))


@pytest.fixture
def ws(tmp_path) -> Workspace:
    return Workspace(tmp_path / "ws")


def test_a_batch_is_stored_as_one_visit_of_a_new_patient(ws):
    added = upload_photos(ws, [("day1-a.jpg", jpeg()), ("day1-b.JPG", jpeg(6)), ("scan.png", png16())],
                          " P-017 ", date(2024, 5, 6), account=NURSE)
    assert added == {"images": ["day1-a", "day1-b", "scan"], "patient": "P-017", "new_patient": True,
                     "visit_date": "2024-05-06", "earlier_visits": [], "tracks": []}
    rows = {i["image_id"]: i for i in ws.store.images()}
    assert {i: (r["file"], r["patient_id"], r["metadata"]) for i, r in rows.items()} == {
        "day1-a": ("day1-a.jpg", "P-017", {"visit_date": "2024-05-06"}),
        "day1-b": ("day1-b.jpg", "P-017", {"visit_date": "2024-05-06", "exif_orientation": 6}),
        "scan": ("scan.png", "P-017", {"visit_date": "2024-05-06"})}
    assert Image.open(ws.image_path("scan")).mode == "L"
    assert [p["patient_id"] for p in ws.store.patients()] == ["P-017"]
    assert {r["actor"] for r in ws.store.revisions("images")} == {"Nurse Kim"}
    assert not [p for p in ws.root.iterdir() if p.name.startswith(".import-")]  # the swap folder is gone
    assert session.overview(ws)["images"] == 3


def test_photos_are_stored_upright_and_stripped_as_import_stores_them(ws, tmp_path):
    upload_photos(ws, [("turned.jpg", jpeg(6))], "P1", "2024-05-06", account=NURSE)
    stored = ws.image_path("turned").read_bytes()
    assert not any(s in stored for s in IDENTIFYING)
    im = Image.open(io.BytesIO(stored))
    assert im.size == (40, 60) and im.getexif().get(0x0112, 1) == 1  # upright: 40 wide, 60 high
    upright = np.asarray(Image.fromarray(SKIN).transpose(Image.Transpose.ROTATE_270), float)
    assert np.abs(np.asarray(im.convert("RGB"), float) - upright).mean() < 3
    folder = tmp_path / "d" / "images"
    folder.mkdir(parents=True)
    (folder / "turned.jpg").write_bytes(jpeg(6))
    imported = Workspace(tmp_path / "imported")
    import_dataset(imported, tmp_path / "d")
    assert imported.image_path("turned").read_bytes() == stored  # byte for byte what import stores


def test_one_bad_file_stores_nothing_and_says_which_with_the_import_message(ws, tmp_path):
    upload_photos(ws, [("before.jpg", jpeg())], "P1", "2024-05-01", account=NURSE)
    before = state(ws)
    with pytest.raises(DatasetError) as err:
        upload_photos(ws, [("a.jpg", jpeg()), ("b.jpg", b"\xff\xd8 not a photo"), ("c.jpg", jpeg())], "P2",
                      "2024-05-06", account=NURSE)
    assert str(err.value) == "b.jpg: cannot be read as a JPEG image (not a JPEG file, or a damaged one)"
    assert state(ws) == before
    (tmp_path / "d" / "images").mkdir(parents=True)
    (tmp_path / "d" / "images" / "b.jpg").write_bytes(b"\xff\xd8 not a photo")
    with pytest.raises(DatasetError) as imported:
        import_dataset(Workspace(tmp_path / "other"), tmp_path / "d")
    assert str(imported.value) == f"images/{err.value}"  # import's message, the folder aside


@pytest.mark.parametrize(("files", "message"), [
    ([("a.heic", b"....ftypheic")], "a.heic: unsupported file type (expected .png, .jpg, .jpeg, .tif, .tiff); "
                                    "HEIC/HEIF photos are not read: save them as JPEG"),
    ([("notes.txt", b"hello")], "notes.txt: unsupported file type (expected .png, .jpg, .jpeg, .tif, .tiff)"),
    ([("my photo.jpg", jpeg())], "my photo.jpg: image id 'my photo' is not a valid id"),
    ([("a.jpg", jpeg()), ("a.png", png16())], "a.png: a second image with id 'a' (also a.jpg)"),
    ([("../a.jpg", jpeg())], "../a.jpg: a file name may not hold a folder"),
    ([("big.jpg", b"\0" * (MAX_PHOTO_BYTES + 1))],
     f"big.jpg: {MAX_PHOTO_BYTES + 1:,} bytes, more than the {MAX_PHOTO_BYTES:,} allowed ({MAX_PHOTO_MB} MB a photo)"),
    ([(f"p{n}.jpg", b"") for n in range(MAX_PHOTOS + 1)], f"{MAX_PHOTOS + 1} photos, more than the {MAX_PHOTOS}"),
    ([], "no photos to upload"),
])
def test_bad_files_are_one_clear_error_naming_the_file(ws, files, message):
    before = state(ws)
    with pytest.raises(DatasetError) as err:
        upload_photos(ws, files, "P1", "2024-05-06", account=NURSE)
    assert str(err.value).startswith(message)
    assert state(ws) == before


@pytest.mark.parametrize(("patient", "day", "marker", "message"), [
    ("P 1", "2024-05-06", None, "patient: patient id 'P 1' is not a valid id"),
    (" ", "2024-05-06", None, "patient: give the patient's id"),
    ("P1", None, None, "visit date: give the day the photos were taken"),
    ("P1", (date.today() + timedelta(days=2)).isoformat(), None, "visit date: visit_date"),
    ("P1", "06/05/2024", None, "visit date: visit_date '06/05/2024' is not an ISO 8601 date"),
    ("P1", "2024-05-06", {"dictionary": "DICT_4X4_50", "id": 7, "side_cm": 40}, "marker: side_cm must be"),
])
def test_a_bad_patient_date_or_marker_stores_nothing(ws, patient, day, marker, message):
    with pytest.raises(DatasetError, match=f"^{message}"):
        upload_photos(ws, [("a.jpg", jpeg())], patient, day, marker, account=NURSE)
    assert ws.store.counts()["images"] == 0 and not ws.store.patients()


def test_the_size_limit_is_streamlits_too():
    config = tomllib.loads((REPO / ".streamlit" / "config.toml").read_text(encoding="utf-8"))
    assert config["server"]["maxUploadSize"] == MAX_PHOTO_MB


def test_a_photo_id_already_in_the_workspace_is_refused(ws):
    upload_photos(ws, [("IMG_0001.jpg", jpeg())], "P1", "2024-05-01", account=NURSE)
    before = state(ws)
    with pytest.raises(DatasetError, match=r"^IMG_0001.png: photo 'IMG_0001' is already in the workspace"):
        upload_photos(ws, [("IMG_0002.jpg", jpeg()), ("IMG_0001.png", png16())], "P2", "2024-05-02", account=NURSE)
    assert state(ws) == before


@pytest.mark.parametrize("at", ["a row", "the commit"])
def test_a_failure_while_storing_rolls_everything_back(ws, monkeypatch, at):
    """A full disk at the second photo's row, or at the commit (the photos already moved in): nothing stays."""
    upload_photos(ws, [("before.jpg", jpeg())], "P1", "2024-05-01", account=NURSE)
    before = state(ws)
    method = "upsert_image" if at == "a row" else "set_meta"
    real, calls = getattr(ws.store, method), []

    def full_disk(*args, **kwargs):
        calls.append(args[0])
        if (at == "a row" and len(calls) == 2) or str(args[0]).startswith("swap:"):
            assert at == "a row" or (ws.images_dir / "b.jpg").exists()  # the photos are in place by then
            raise OSError(28, "No space left on device")
        return real(*args, **kwargs)

    monkeypatch.setattr(ws.store, method, full_disk)
    with pytest.raises(DatasetError, match=r"the disk is full \(No space left on device\); nothing was uploaded"):
        upload_photos(ws, [("a.jpg", jpeg()), ("b.jpg", jpeg())], "P2", "2024-05-06", account=NURSE)
    monkeypatch.undo()
    assert state(ws) == before


@pytest.mark.parametrize("role", ["viewer", "researcher"])
def test_only_admins_and_annotators_upload(ws, role):
    found = Account("Dr Vue", role)
    assert upload.refusal(ws, found).startswith(f"Dr Vue ({role}) may not upload photos")
    with pytest.raises(AuthError, match="only admins and annotators"):
        upload_photos(ws, [("a.jpg", jpeg())], "P1", "2024-05-06", account=found)
    assert ws.store.counts()["images"] == 0
    assert upload.refusal(ws, Account("Ann", "admin")) is None and upload.refusal(ws, NURSE) is None


def test_no_real_photos_into_the_synthetic_demo(demo_workspace):
    assert "SYNTHETIC demo" in upload.refusal(demo_workspace, NURSE)
    with pytest.raises(DatasetError, match="holds the SYNTHETIC demo"):
        upload_photos(demo_workspace, [("a.jpg", jpeg())], "P1", "2024-05-06", account=NURSE)


def test_the_marker_is_set_once_and_an_other_one_refused(ws):
    marker = {"dictionary": "DICT_4X4_50", "id": "7", "side_cm": 4}
    upload_photos(ws, [("a.jpg", jpeg())], "P1", "2024-05-01", marker, account=NURSE)
    assert followup.workspace_marker(ws) == followup.MarkerSpec("DICT_4X4_50", 7, 4.0)
    upload_photos(ws, [("b.jpg", jpeg())], "P1", "2024-05-02", {**marker, "id": 7}, account=NURSE)  # the same
    with pytest.raises(DatasetError, match=r"^marker: this workspace measures with DICT_4X4_50 id 7, 4 cm, not "
                                           r"DICT_4X4_50 id 9, 4 cm"):
        upload_photos(ws, [("c.jpg", jpeg())], "P1", "2024-05-03", {**marker, "id": 9}, account=NURSE)
    assert ws.store.image("c") is None


def wound_disc(ws: Workspace, image_id: str, cx: int = 20, cy: int = 30, r: int = 8) -> int:
    """Outline a round wound on the photo, as the outline page does."""
    h, w = ws.load_mask(image_id).shape
    yy, xx = np.mgrid[:h, :w]
    return session.add_wound(ws, image_id, (xx - cx) ** 2 + (yy - cy) ** 2 <= r * r, actor="Nurse Kim")


def test_a_known_patients_new_visit_lands_in_the_follow_up_flow(ws):
    first = upload_photos(ws, [("p1-v1.jpg", jpeg(6))], "P1", "2024-04-01", account=NURSE)
    assert first["new_patient"] and first["earlier_visits"] == []
    followup.set_track(ws.store, "p1-v1", wound_disc(ws, "p1-v1"), "P1-T1")
    upload_photos(ws, [("p2-v1.jpg", jpeg(6))], "P2", "2024-04-01", account=NURSE)
    followup.set_track(ws.store, "p2-v1", wound_disc(ws, "p2-v1", cy=10), "P2-T1")

    second = upload_photos(ws, [("p1-v2.jpg", jpeg(6))], "P1", "2024-04-15", account=NURSE)
    assert second == {"images": ["p1-v2"], "patient": "P1", "new_patient": False, "visit_date": "2024-04-15",
                      "earlier_visits": ["2024-04-01"], "tracks": ["P1-T1"]}
    assert [p["patient_id"] for p in ws.store.patients()] == ["P1", "P2"]
    index = wound_disc(ws, "p1-v2", cx=21, r=7)  # outlined on the Wound masks page: a link to confirm
    (pending,) = followup.pending_links(followup.followup_rows(ws, unlinked=True))
    assert (pending["image_id"], pending["wound_index"], pending["patient"], pending["visit_date"]) == \
        ("p1-v2", index, "P1", "2024-04-15")
    assert pending["proposals"][0][0] == "P1-T1"  # the patient's track, never the other patient's
    assert "P2-T1" not in [t for t, _ in pending["proposals"]]
    followup.set_track(ws.store, "p1-v2", index, "P1-T1")
    (heal,) = [h for h in followup.healing(followup.followup_rows(ws)) if h["track"] == "P1-T1"]
    assert heal["visits"] == 2 and heal["last_date"] == "2024-04-15"


def home(ws: Workspace, role: str) -> AppTest:
    """Home signed in as an account of ``role`` ($TRIDERM_WORKSPACE is ``ws``)."""
    found = accounts.add_account(ws.store, f"Dr {role}", role, "correct horse battery", "test")
    at = AppTest.from_file(str(REPO / "app.py"), default_timeout=60)
    at.session_state["account"] = found
    at.session_state["_cookie"] = accounts.issue_token(ws.store, accounts.secret_key(ws.root), found)
    return at.run()


@pytest.mark.parametrize(("role", "shown"), [("admin", True), ("annotator", True), ("researcher", False),
                                             ("viewer", False)])
def test_home_shows_the_upload_to_admins_and_annotators(ws, monkeypatch, role, shown):
    monkeypatch.setenv("TRIDERM_WORKSPACE", str(ws.root))
    upload_photos(ws, [("a.jpg", jpeg())], "P-9", "2024-05-01", account=NURSE)
    at = home(ws, role)
    assert not at.exception, at.exception
    assert any(e.label == "Upload photos" for e in at.expander) == shown
    if shown:
        assert "P-9" in at.selectbox(key="upload_patient").options
        assert f"{MAX_PHOTO_MB} MB" in "\n".join(c.value for c in at.caption)
