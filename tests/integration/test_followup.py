"""Wound follow-up (issue 32): visit dates and tracks in the store, physical size from a marker or a
ruler, phantom visits, healing, the follow-up export and track-link proposals."""
from __future__ import annotations

import csv
import itertools
import json
import shutil
import sqlite3
from datetime import date, timedelta

import cv2
import numpy as np
import pytest
from PIL import Image

from annotations.accounts.privacy import erase_patient
from annotations.followup import followup
from annotations.followup.align import align_views, track_views
from annotations.followup.measure import (
    MarkerSpec,
    MeasureError,
    Ruler,
    find_marker,
    measure,
    ruler_calibration,
    ruler_uncertainty,
)
from annotations.infra.backup import backup, restore
from annotations.infra.workspace import Workspace
from annotations.io.dataset import export_dataset, import_dataset
from annotations.io.readers import DatasetError
from annotations.store.store import MIGRATIONS, Store
from core.phantoms.visits import build_visits, read_truth


@pytest.fixture(scope="module")
def visits_dataset(tmp_path_factory):
    out = tmp_path_factory.mktemp("visits") / "ds"
    summary = build_visits(out, visits=4, patients=3, seed=4)  # seed 4: 10 tracks, one closes, three new
    return out, summary


@pytest.fixture(scope="module")
def visits_template(visits_dataset, tmp_path_factory):
    root = tmp_path_factory.mktemp("visits_ws") / "ws"
    ws = Workspace(root)
    import_dataset(ws, visits_dataset[0])
    rows = followup.followup_rows(ws)
    ws.store.close()
    return root, rows


@pytest.fixture(scope="module")
def visits_rows(visits_template):
    """The imported phantom visits' follow-up rows (measured once)."""
    return visits_template[1]


@pytest.fixture
def visits_ws(visits_template, tmp_path):
    root = tmp_path / "ws"
    shutil.copytree(visits_template[0], root)
    return Workspace(root)


def _copy(src, tmp_path):
    dst = tmp_path / "copy"
    shutil.copytree(src, dst)
    return dst


def _rewrite(path, edit):
    with path.open(encoding="utf-8") as fh:
        rows = list(csv.reader(fh))
    edit(rows)
    with path.open("w", newline="", encoding="utf-8") as fh:
        csv.writer(fh, lineterminator="\n").writerows(rows)


# -- A: the store -----------------------------------------------------------------------------------
def test_phantom_visits_import_with_tracks_and_dates(visits_dataset, visits_ws):
    _, summary = visits_dataset
    tracks = followup.tracks(visits_ws.store)
    assert len(tracks) == summary["tracks"]
    truth = read_truth(visits_dataset[0])
    by_track = {}
    for t in truth:
        by_track.setdefault(t["track_id"], set()).add(t["patient_id"])
    assert {t["track_id"]: {t["patient_id"]} for t in tracks} == by_track
    assert all(t["first_visit"] <= t["last_visit"] for t in tracks)
    assert visits_ws.store.schema_version == len(MIGRATIONS)


@pytest.mark.parametrize(("value", "message"), [
    ((date.today() + timedelta(days=40)).isoformat(), "is in the future"),
    ("12/03/2024", "is not an ISO 8601 date"),
])
def test_bad_visit_date_is_one_clear_error_and_imports_nothing(visits_dataset, tmp_path, value, message):
    src = _copy(visits_dataset[0], tmp_path)
    _rewrite(src / "images.csv", lambda rows: rows[2].__setitem__(2, value))
    ws = Workspace(tmp_path / "ws")
    with pytest.raises(DatasetError, match=rf"images\.csv: line 3: visit_date '{value}' {message}"):
        import_dataset(ws, src)
    assert ws.store.images() == []


def test_two_wounds_of_one_photo_on_one_track_is_an_error(visits_dataset, tmp_path):
    src = _copy(visits_dataset[0], tmp_path)

    def same_track(rows):
        first = next(r for r in rows[1:] if any(o[0] == r[0] and o[1] != r[1] for o in rows[1:]))
        second = next(r for r in rows[1:] if r[0] == first[0] and r[1] != first[1])
        second[3] = first[3]

    _rewrite(src / "wounds.csv", same_track)
    with pytest.raises(DatasetError, match=r"wounds\.csv: line \d+: wounds 1 and 2 of photo .* are both on track"):
        import_dataset(Workspace(tmp_path / "ws"), src)


def test_a_track_across_patients_is_an_error(visits_dataset, tmp_path):
    src = _copy(visits_dataset[0], tmp_path)

    def borrow(rows):
        other = next(r for r in rows[1:] if r[0].split("_")[0] != rows[1][0].split("_")[0])
        other[3] = rows[1][3]

    _rewrite(src / "wounds.csv", borrow)
    with pytest.raises(DatasetError, match="holds wounds of patient 'V001'"):
        import_dataset(Workspace(tmp_path / "ws"), src)


def test_a_ruler_of_length_zero_is_an_error(visits_dataset, tmp_path):
    src = _copy(visits_dataset[0], tmp_path)
    _rewrite(src / "images.csv", lambda rows: rows[1].__setitem__(3, "10 10 90 10 0"))
    with pytest.raises(DatasetError, match=r"images\.csv: line 2: ruler: ruler length must be > 0 cm"):
        import_dataset(Workspace(tmp_path / "ws"), src)
    with pytest.raises(MeasureError, match="segment has length 0 px"):
        ruler_calibration(Ruler(5, 5, 5, 5, 10), "photo a.png")


def test_follow_up_fields_round_trip_export_merge_backup_and_erase(visits_ws, tmp_path):
    store = visits_ws.store
    before = {(w["image_id"], w["wound_index"]): w["metadata"] for w in store.wounds()}
    dates = {i["image_id"]: i["metadata"]["visit_date"] for i in store.images()}
    export_dataset(visits_ws, tmp_path / "out")
    assert json.loads((tmp_path / "out" / "dataset.json").read_text())["marker"]["id"] == 7
    again = Workspace(tmp_path / "ws2")
    import_dataset(again, tmp_path / "out")
    assert {(w["image_id"], w["wound_index"]): w["metadata"] for w in again.store.wounds()} == before
    assert {i["image_id"]: i["metadata"]["visit_date"] for i in again.store.images()} == dates
    assert again.store.get_meta("marker") == store.get_meta("marker")

    # an edit in the app is a revision, and a re-import keeps it (changed in the app only)
    image_id, index = next(iter(before))
    followup.set_track(store, image_id, index, "renamed", actor="dr_a")
    rev = store.revisions("wounds", {"image_id": image_id, "wound_index": index})[-1]
    assert (rev["actor"], rev["field"], rev["new"]["track_id"]) == ("dr_a", "metadata", "renamed")
    summary = import_dataset(visits_ws, tmp_path / "out")
    assert summary["merge"]["keep-app"] == 1
    assert store.wound(image_id, index)["metadata"]["track_id"] == "renamed"

    backup(visits_ws, tmp_path / "bk")
    restore(tmp_path / "bk", tmp_path / "ws3")
    assert len(followup.tracks(Workspace(tmp_path / "ws3").store)) == len(followup.tracks(store))

    patient = store.images()[0]["patient_id"]
    erase_patient(visits_ws, patient)
    assert all(t["patient_id"] != patient for t in followup.tracks(store))


def test_set_track_refuses_a_second_wound_of_the_photo_and_changes_nothing(visits_ws):
    store = visits_ws.store
    photo = next(i for i in store.images() if len(store.wounds(i["image_id"])) >= 2)["image_id"]
    w1, w2 = store.wounds(photo)[:2]
    with pytest.raises(DatasetError, match="are both on track"):
        followup.set_track(store, photo, w2["wound_index"], w1["metadata"]["track_id"], actor="dr_a")
    assert store.wound(photo, w2["wound_index"])["metadata"] == w2["metadata"]
    with pytest.raises(DatasetError, match="in the future"):
        followup.set_visit_date(store, photo, (date.today() + timedelta(days=1)).isoformat())
    followup.set_visit_date(store, photo, "2024-02-03T10:30", actor="dr_a")
    assert store.image(photo)["metadata"]["visit_date"] == "2024-02-03"


def test_the_migration_upgrades_an_older_store(tmp_path):
    path = tmp_path / "old.sqlite"
    conn = sqlite3.connect(path)
    for statements in MIGRATIONS[:-1]:
        for statement in statements:
            conn.execute(statement)
    conn.execute(f"PRAGMA user_version = {len(MIGRATIONS) - 1}")
    conn.execute("INSERT INTO images (image_id, file, sha256, width, height) VALUES ('a', 'a.png', 'x', 4, 4)")
    conn.execute("INSERT INTO wounds (image_id, wound_index, area, bbox, metadata) VALUES "
                 "('a', 1, 3, '[0,0,1,1]', '{\"track_id\": 12, \"site\": \"shin\"}')")
    conn.commit()
    conn.close()
    store = Store(path)
    assert store.schema_version == len(MIGRATIONS)
    assert followup.tracks(store) == [{"track_id": "12", "patient_id": None, "site": "shin", "wounds": 1,
                                       "first_visit": None, "last_visit": None}]


# -- B: physical size --------------------------------------------------------------------------------
def _scene(tilt_deg: float, marker_id: int = 7, ppc: float = 20.0):
    """A 4 cm marker and a 3 × 2 cm rectangle on a plane seen at ``tilt_deg``: photo, wound mask."""
    spec = MarkerSpec(marker_id=marker_id)
    size = (900, 700)
    plane_ppc = 40
    plane = np.full((20 * plane_ppc, 30 * plane_ppc), 200, np.uint8)
    tile = cv2.copyMakeBorder(spec.image(4 * plane_ppc), 27, 27, 27, 27, cv2.BORDER_CONSTANT, value=255)
    plane[4 * plane_ppc - 27:4 * plane_ppc - 27 + tile.shape[0], 4 * plane_ppc - 27:4 * plane_ppc - 27 + tile.shape[1]] = tile
    rvec = np.array([np.radians(tilt_deg), 0, 0])
    r, _ = cv2.Rodrigues(rvec)
    k = np.array([[1000.0, 0, size[0] / 2], [0, 1000.0, size[1] / 2], [0, 0, 1]])
    h = k @ np.column_stack([r[:, 0], r[:, 1], [0, 0, 1000.0 / ppc]]) @ np.array([[1, 0, -13], [0, 1, -8], [0, 0, 1]])
    photo = cv2.warpPerspective(plane, h @ np.diag([1 / plane_ppc, 1 / plane_ppc, 1]), size, flags=cv2.INTER_LINEAR)
    ys, xs = np.mgrid[:size[1], :size[0]]
    plane_pts = cv2.perspectiveTransform(np.stack([xs, ys], -1).reshape(-1, 1, 2).astype(np.float64),
                                         np.linalg.inv(h)).reshape(size[1], size[0], 2)
    mask = (plane_pts[..., 0] >= 14) & (plane_pts[..., 0] < 17) & (plane_pts[..., 1] >= 7) & (plane_pts[..., 1] < 9)
    return photo, mask, spec


@pytest.mark.parametrize("tilt", [0.0, 30.0])
def test_marker_area_length_and_width_correct_the_perspective(tilt):
    photo, mask, spec = _scene(tilt)
    cal = find_marker(photo, spec, "scene.png")
    m = measure(mask, cal)
    assert m.method == "marker"
    assert m.area_cm2 == pytest.approx(6.0, rel=0.03)
    assert m.length_cm == pytest.approx(np.hypot(3, 2), rel=0.05)  # a rectangle's longest extent: its diagonal
    assert m.uncertainty is not None and 0 < m.uncertainty < 0.05
    # the plain pixel count with a face-on scale is wrong under tilt: the homography matters
    face_on = mask.sum() / cal.side_px ** 2 * spec.side_cm ** 2
    assert (abs(face_on - 6.0) / 6.0 > 0.05) == (tilt > 0)


def test_a_marker_that_is_not_the_configured_one_is_an_error():
    photo, _, _ = _scene(0.0, marker_id=3)
    with pytest.raises(MeasureError, match=r"scene\.png: marker id 3 is not the configured marker \(id 7"):
        find_marker(photo, MarkerSpec(marker_id=7), "scene.png")


def test_without_marker_or_ruler_only_pixels():
    photo, mask, spec = _scene(0.0)
    m = measure(mask, followup.calibrate(np.zeros_like(photo), {}, spec, "blank.png"))
    assert (m.method, m.area_cm2, m.length_cm, m.area_px) == ("pixels", None, None, int(mask.sum()))


def test_a_ruler_scales_without_perspective_and_says_so():
    _, mask, _ = _scene(0.0)
    m = measure(mask, ruler_calibration(Ruler(0, 0, 200, 0, 10), "a.png"))  # 20 px per cm, as rendered
    assert m.area_cm2 == pytest.approx(6.0, rel=0.03) and m.method == "ruler"
    assert "no perspective correction" in m.reasons[0]


def test_a_rulers_stated_uncertainty_covers_its_error_on_tilted_phantom_visits(visits_dataset, visits_ws):
    """Phantom visits photographed at a tilt of 0–30° (SYNTHETIC): the ruler's stated uncertainty covers its
    measured area error for at least 90 % of the open wounds (a fixed 5 % covered under half of them), and it
    grows with the wound's distance from the ruler."""
    from benchmarks.followup import coverage

    truth = {(t["image_id"], t["wound_index"]): t for t in read_truth(visits_dataset[0])}
    images = {i["image_id"]: i for i in visits_ws.store.images()}
    errors, stated = [], []
    for (image_id, index), t in truth.items():
        mask = visits_ws.load_mask(image_id) == index
        if t["closed"] or not mask.any():
            continue
        m = measure(mask, ruler_calibration(Ruler.parse(images[image_id]["metadata"]["ruler"], image_id), image_id))
        errors.append(m.area_cm2 / t["area_cm2"] - 1)
        stated.append(m.uncertainty)
        assert "use the printed marker" in m.reasons[0]
    assert len(errors) >= 20 and max(np.abs(errors)) > 0.05  # the tilt matters: some errors exceed 5 %
    assert coverage(errors, stated) >= 0.9
    assert coverage(errors, [0.05] * len(errors)) < 0.6
    near, _, _ = ruler_uncertainty(200, 0, 1024)
    far, tilt, depth = ruler_uncertainty(200, 400, 1024)
    assert near >= tilt > 0.15 and far > near and depth == pytest.approx(2 * np.tan(np.radians(30)) * 400 / 819.2)


def test_uncertainty_names_a_small_far_marker():
    photo, mask, spec = _scene(0.0, ppc=8.0)
    m = measure(mask, find_marker(photo, spec, "far.png"))
    assert any("small in the frame" in r for r in m.reasons)


# -- C + D: phantom visits, healing, export, links ----------------------------------------------------
def test_marker_areas_match_the_planted_cm2(visits_dataset, visits_rows):
    truth = {(t["image_id"], t["wound_index"]): t for t in read_truth(visits_dataset[0])}
    rows = visits_rows
    errors = [abs(r["area_cm2"] - truth[(r["image_id"], r["wound_index"])]["area_cm2"])
              / truth[(r["image_id"], r["wound_index"])]["area_cm2"]
              for r in rows if not truth[(r["image_id"], r["wound_index"])]["closed"]]
    assert len(errors) >= 10 and np.median(errors) < 0.03
    assert all(r["method"] == "marker" for r in rows)
    assert {r["closed"] for r in rows} == {t["closed"] for t in truth.values()}


def test_measurements_are_cached_per_photo_until_its_mask_changes(visits_ws, visits_rows, monkeypatch):
    measured = []
    calibrate = followup.calibrate
    monkeypatch.setattr(followup, "calibrate", lambda *a: measured.append(a[-1]) or calibrate(*a))
    assert followup.followup_rows(visits_ws) == visits_rows and measured == []  # the template measured them
    first = visits_rows[0]
    labels = visits_ws.load_mask(first["image_id"])
    ys, xs = np.nonzero(labels == first["wound_index"])
    labels[ys[: len(ys) // 2], xs[: len(xs) // 2]] = 0  # an edited outline: half the wound
    visits_ws.save_mask(first["image_id"], labels)
    again = {(r["image_id"], r["wound_index"]): r for r in followup.followup_rows(visits_ws)}
    assert measured == [f"photo {visits_ws.store.image(first['image_id'])['file']}"]  # that photo only
    assert again[(first["image_id"], first["wound_index"])]["area_px"] == len(ys) - len(ys) // 2
    (visits_ws.cache_dir / followup.MEASURE_CACHE).write_text("{damaged", encoding="utf-8")
    assert followup.followup_rows(visits_ws) == list(again.values())  # a damaged cache is measured again


def test_healing_and_the_followup_export(visits_ws, visits_rows, tmp_path):
    summary = followup.export_followup(visits_ws, tmp_path / "fu")
    with (tmp_path / "fu" / "followup.csv").open(encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0])[:9] == ["patient", "track", "visit_date", "area_cm2", "length_cm", "width_cm", "closed",
                                 "measured_by", "method"]
    assert summary["rows"] == len(rows) and rows[0]["measured_by"] == "import"
    firsts = {}
    for r in rows:
        firsts.setdefault(r["track"], r)
    assert all(float(r["pct_change"]) == 0.0 for r in firsts.values())
    heal = {h["track"]: h for h in followup.healing(visits_rows)}
    assert any(h["closed"] for h in heal.values())
    for h in heal.values():
        if h["closed"]:
            assert h["days_to_closure"] == (date.fromisoformat(h["closure_date"])
                                            - date.fromisoformat(h["baseline_date"])).days > 0
    with pytest.raises(DatasetError, match="not empty"):
        followup.export_followup(visits_ws, tmp_path / "fu")


def test_healing_closure_and_patient_totals_on_known_rows():
    rows = [{"patient": "p", "track": "t", "visit_date": d, "area_cm2": a, "area_px": 0, "closed": c,
             "pct_change": None, "site": "shin"}
            for d, a, c in (("2024-01-01", 10.0, False), ("2024-01-29", 4.0, False), ("2024-02-26", 0.0, True))]
    for r in rows:
        r["pct_change"] = 100 * (r["area_cm2"] - 10.0) / 10.0
    (h,) = followup.healing(rows)
    assert (h["closed"], h["days_to_closure"], h["pct_change"]) == (True, 56, -100.0)
    assert [t["open_area_cm2"] for t in followup.patient_totals(rows)] == [10.0, 4.0, 0.0]


def test_link_proposals_recover_the_planted_tracks(visits_rows):
    result = followup.link_accuracy(visits_rows)
    assert result["wounds"] >= 10 and result["top1"] >= 0.9


def test_two_wounds_of_one_photo_are_never_proposed_the_same_track():
    last = [followup.Sighting(("old", 1), "p", "2024-01-01", "shin", (0.0, 0.0), 5.0, "T1")]
    new = [followup.Sighting(("new", 1), "p", "2024-02-01", "shin", (0.2, 0.0), 5.0),
           followup.Sighting(("new", 2), "p", "2024-02-01", "shin", (0.5, 0.0), 5.0)]
    proposals = followup.propose_links(new, last)
    assert sorted(p[0][0] or "" for p in proposals.values()) == ["", "T1"]
    other = followup.propose_links([followup.Sighting(("x", 1), "q", "2024-02-01", "shin", (0, 0), 5.0)], last)
    assert other[("x", 1)] == [(None, followup.NEW_TRACK)]


def test_phantom_cli_writes_visits(tmp_path):
    from core.phantoms.__main__ import main

    assert main(["--out", str(tmp_path / "v"), "--visits", "2", "--patients", "1", "--seed", "3"]) == 0
    info = json.loads((tmp_path / "v" / "dataset.json").read_text())
    assert info["synthetic"] is True and info["marker"]["side_cm"] == 4.0
    with Image.open(next((tmp_path / "v" / "images").iterdir())) as im:
        assert im.size == (1024, 768)


def test_cli_export_format_followup(visits_ws, tmp_path, capsys):
    from annotations.__main__ import main

    assert main(["export", str(tmp_path / "fu"), "--format", "followup", "--workspace", str(visits_ws.root)]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] > 0
    assert (tmp_path / "fu" / "followup.csv").exists() and (tmp_path / "fu" / "healing.csv").exists()
    visits_ws.store.set_meta("marker", {"dictionary": "DICT_4X4_50", "id": 9, "side_cm": 4})
    assert main(["export", str(tmp_path / "fu2"), "--format", "followup", "--workspace", str(visits_ws.root)]) == 2
    assert "is not the configured marker (id 9" in capsys.readouterr().err
    assert not (tmp_path / "fu2").exists()


def test_benchmark_quick(tmp_path):
    from benchmarks.followup import main

    out = tmp_path / "results"
    assert main(["--quick", "--results", str(out), "--data", str(tmp_path / "no-data")]) == 0
    record = json.loads((out / "followup.json").read_text(encoding="utf-8"))
    assert record["title"].endswith("[quick]") and record["synthetic"] is True
    area, _, stated, links, real, speed = record["tables"]
    assert stated["rows"][0][0] == area["rows"][1][1] and stated["rows"][0][1] >= 90  # the ruler's coverage %
    assert [r[0] for r in area["rows"]] == ["marker (homography)", "ruler (one scale)"] and area["rows"][0][1] > 0
    assert links["rows"][0][0] > 0 and real["rows"] == []
    assert speed["columns"] == ["render", "seconds", "× baseline"] and len(speed["rows"]) == 3
    assert speed["rows"][0][2] == 1 and all(r[1] > 0 for r in speed["rows"])  # the first render is the baseline
    assert any(n.startswith("Page speed: ") for n in record["notes"])
    with pytest.raises(SystemExit):
        main(["--visits", "1", "--results", str(out)])


# -- aligned photos of a track --------------------------------------------------------------------------
def test_a_tracks_photos_align_on_the_body(visits_dataset, visits_ws):
    """Body points around each wound land on the same view pixels at every visit (the planted camera
    homographies): the marker plane, the wound centred and ECC registration undo camera distance and tilt."""
    truth = {(t["image_id"], t["wound_index"]): t for t in read_truth(visits_dataset[0])}
    errors, moved = [], []
    for track in followup.tracks(visits_ws.store):
        visits = [(i, w) for i, w, _ in followup.track_visits(visits_ws.store, track["track_id"])]
        if len(visits) < 2:
            continue
        views = track_views(visits_ws, visits)
        cams = [np.asarray(truth[v]["homography"], np.float64) for v in visits]
        first = cv2.perspectiveTransform(np.array([[[110.0, 110.0]]]), np.linalg.inv(views[0].transform))
        centre = cv2.perspectiveTransform(first, np.linalg.inv(cams[0])).reshape(2)
        body = (centre + np.array([[0, 0], [1.5, 0], [0, 1.5], [-1.5, 0], [0, -1.5]])).reshape(-1, 1, 2)
        at = [cv2.perspectiveTransform(cv2.perspectiveTransform(body, cam), v.transform).reshape(-1, 2)
              for cam, v in zip(cams, views)]
        per_cm = np.linalg.norm(at[0][1] - at[0][0]) / 1.5
        errors += [float(np.linalg.norm(b - a, axis=1).mean() / per_cm) for a, b in itertools.pairwise(at)]
        photo = [cv2.perspectiveTransform(body, cam).reshape(-1, 2) for cam in cams]  # unaligned: photo pixels
        moved += [float(np.linalg.norm(b - a, axis=1).mean() / per_cm) for a, b in itertools.pairwise(photo)]
        assert all(v.image.shape == (220, 220, 3) and v.method.startswith("marker plane") for v in views)
    assert len(errors) >= 8 and np.median(errors) < 0.05 and np.percentile(errors, 90) < 0.3  # cm
    assert np.median(moved) > 10 * np.median(errors)


def test_align_views_without_calibration_centres_the_wound_in_pixels():
    rng = np.random.default_rng(0)
    image = cv2.GaussianBlur(rng.integers(0, 255, (200, 300, 3), dtype=np.uint8), (0, 0), 3)
    mask = np.zeros((200, 300), bool)
    mask[80:100, 150:190] = True
    views = align_views([image, image], [mask, np.roll(mask, 30, axis=1)], [None, None], size=100)
    assert all(v.method.startswith("pixels, wound centred") for v in views)
    for v in views:
        ys, xs = np.nonzero(v.mask)
        assert abs(xs.mean() - 49.5) < 2 and abs(ys.mean() - 49.5) < 2
    with pytest.raises(ValueError, match="one image, mask and calibration per visit"):
        align_views([image], [mask, mask], [None])


# -- the visit date asked at import ----------------------------------------------------------------------
def test_import_visit_dates_the_new_photos_and_refuses_a_future_date(visits_dataset, tmp_path):
    src = _copy(visits_dataset[0], tmp_path)
    _rewrite(src / "images.csv", lambda rows: [r.pop(2) for r in rows])  # no visit_date column
    ws = Workspace(tmp_path / "ws")
    tomorrow = (date.today() + timedelta(days=2)).isoformat()
    with pytest.raises(DatasetError, match="in the future"):
        followup.import_visit(ws, src, tomorrow)
    assert ws.store.counts()["images"] == 0  # nothing imported
    summary = followup.import_visit(ws, src, "2024-05-06")
    assert summary["dated"] == summary["images"] > 0
    assert {i["metadata"].get("visit_date") for i in ws.store.images()} == {"2024-05-06"}
    assert followup.import_visit(ws, src, "2024-06-01")["dated"] == 0  # re-imported photos keep their date


def test_embedding_similarity_decides_between_equally_placed_tracks():
    def row(image_id, track, day, x):
        return {"image_id": image_id, "wound_index": 1, "patient": "p", "visit_date": day, "site": "shin",
                "xy": (x, 0.0), "size": 4.0, "track": track, "closed": False}

    rows = [row("a1", "p-T1", "2024-01-01", 0.0), row("b1", "p-T2", "2024-01-01", 1.0),
            row("c2", None, "2024-01-29", 0.5)]  # halfway between the two tracks, same size and site
    e1, e2 = np.array([1.0, 0.0, 0.0]), np.array([0.0, 3.0, 0.0])  # any length: normalised
    like = {t: followup.pending_links(rows, {("a1", 1): e1, ("b1", 1): e2, ("c2", 1): e})[0]["proposals"][0][0]
            for t, e in (("p-T1", e1 + 0.1), ("p-T2", e2 + 0.1))}
    assert like == {"p-T1": "p-T1", "p-T2": "p-T2"}  # site, size and position alone tie: the embedding decides


def test_the_followup_export_says_which_areas_are_the_models_own_outline(visits_ws, visits_rows, tmp_path):
    first = visits_rows[0]
    w = visits_ws.store.wound(first["image_id"], first["wound_index"])
    visits_ws.store.upsert_wound(first["image_id"], first["wound_index"], w["area"], w["bbox"],
                                 metadata={**w["metadata"], "origin": "suggested"})
    followup.export_followup(visits_ws, tmp_path / "fu")
    with (tmp_path / "fu" / "followup.csv").open(encoding="utf-8") as fh:
        rows = {(r["image_id"], r["wound_index"]): r["outline"] for r in csv.DictReader(fh)}
    assert rows.pop((first["image_id"], str(first["wound_index"]))) == "suggested"  # accepted unedited: the model's area
    assert set(rows.values()) <= {"import", ""}  # the other outlines came in with the dataset
