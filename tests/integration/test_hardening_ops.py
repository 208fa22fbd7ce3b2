"""Issue 49 (hardening, round two), operations: follow-up figures that cannot be silently wrong,
spreadsheet-safe CSV exports, backups in progress, workspace holders and account names."""
from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from annotations.followup import followup
from annotations.followup.measure import Calibration, MarkerSpec, measure
from annotations.infra.workspace import Workspace
from annotations.io.dataset import export_dataset, import_dataset
from annotations.io.readers import DatasetError

WIDTH = 2000  # a wide strip: a 2 cm ruler across it is 1e-3 cm per pixel


def visits(root: Path, rulers: list[str], dates: list[str], closed: list[bool], *, site: str = "shin",
           marker: dict | None = None) -> Path:
    """One patient's visits of one wound (a 5×5 px square) on track T1: photo ``v<n>`` per visit."""
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    images, wounds = ["image_id,patient_id,visit_date,ruler"], ["image_id,wound_index,description,track_id,site,closed"]
    for n, (ruler, day, shut) in enumerate(zip(rulers, dates, closed), start=1):
        Image.fromarray(np.full((20, WIDTH, 3), 90, np.uint8)).save(root / "images" / f"v{n}.png")
        mask = np.zeros((20, WIDTH), np.uint8)
        mask[5:10, 5:10] = 1
        Image.fromarray(mask).save(root / "masks" / f"v{n}.png")
        images.append(f"v{n},p1,{day},{ruler}")
        wounds.append(f"v{n},1,ulcer,T1,{site},{str(shut).lower()}")
    (root / "images.csv").write_text("\n".join(images) + "\n")
    (root / "wounds.csv").write_text("\n".join(wounds) + "\n")
    (root / "patients.csv").write_text("patient_id\np1\n")
    (root / "dataset.json").write_text(json.dumps({"name": "fu", **({"marker": marker} if marker else {})}))
    return root


def read(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8", newline="") as fh:
        return list(csv.DictReader(fh))


# -- follow-up figures ---------------------------------------------------------------------------------
def test_a_wound_closed_then_reopened_is_not_exported_as_closed(tmp_path):
    src = visits(tmp_path / "ds", ["0 0 2000 0 20"] * 3, ["2024-01-01", "2024-02-01", "2024-03-01"],
                 [False, True, False])
    ws = Workspace(tmp_path / "ws")
    import_dataset(ws, src)
    followup.export_followup(ws, tmp_path / "out")
    (heal,) = read(tmp_path / "out" / "healing.csv")
    assert (heal["closed"], heal["closure_date"], heal["days_to_closure"], heal["reopened"]) == ("False", "", "", "1")


def test_closure_is_the_first_visit_of_the_final_closed_run():
    rows = [{"patient": "p", "track": "t", "visit_date": d, "area_cm2": a, "area_px": 0, "closed": c,
             "pct_change": None, "site": "shin"}
            for d, a, c in (("2024-01-01", 10.0, False), ("2024-01-15", 0.0, True), ("2024-02-01", 3.0, False),
                            ("2024-03-01", 0.0, True), ("2024-03-15", 0.0, True))]
    (h,) = followup.healing(rows)
    assert (h["closed"], h["closure_date"], h["days_to_closure"], h["reopened"]) == (True, "2024-03-01", 60, 1)


def test_a_reopened_track_is_proposed_again():
    def seen(day, closed, track="t"):
        return followup.Sighting(("a" + day, 1), "p", day, "shin", (1.0, 1.0), 4.0, track, closed)

    history = [seen("2024-01-01", False), seen("2024-02-01", True), seen("2024-03-01", False)]
    new = followup.Sighting(("n", 1), "p", "2024-04-01", "shin", (1.0, 1.0), 4.0)
    assert followup.propose_links([new], history)[("n", 1)][0][0] == "t"


def test_tiny_calibrated_sizes_are_not_rounded_to_zero(tmp_path):
    src = visits(tmp_path / "ds", ["0 0 2000 0 2"] * 2, ["2024-01-01", "2024-02-01"], [False, False])
    ws = Workspace(tmp_path / "ws")
    import_dataset(ws, src)
    rows = followup.followup_rows(ws)
    assert [r["area_cm2"] for r in rows] == [pytest.approx(25e-6)] * 2  # 25 px at 1e-3 cm a pixel


@pytest.mark.parametrize(("ruler", "message"), [
    ("0 0 5000 0 5", r"ruler end \(5000, 0\) is outside the photo \(2000 × 20 px\)"),
    ("-3 0 100 0 5", r"ruler end \(-3, 0\) is outside the photo"),
    ("0 0 1 0 40", r"ruler gives 40 cm per pixel"),
    ("0 0 2000 0 0.001", r"ruler length must be 0\.5 to 50 cm, got 0\.001"),
    ("0 0 2000 0 1e300", r"ruler length must be 0\.5 to 50 cm"),
])
def test_an_implausible_ruler_is_one_clear_error_and_imports_nothing(tmp_path, ruler, message):
    src = visits(tmp_path / "ds", ["0 0 2000 0 20", ruler], ["2024-01-01", "2024-02-01"], [False, False])
    ws = Workspace(tmp_path / "ws")
    with pytest.raises(DatasetError, match=r"images\.csv: line 3: ruler: " + message):
        import_dataset(ws, src)
    assert ws.store.images() == []


@pytest.mark.parametrize("day", ["0001-01-01", "1899-12-31"])
def test_an_implausibly_early_visit_date_is_refused(tmp_path, day):
    src = visits(tmp_path / "ds", ["0 0 2000 0 20"] * 2, ["2024-01-01", day], [False, False])
    ws = Workspace(tmp_path / "ws")
    with pytest.raises(DatasetError, match=rf"images\.csv: line 3: visit_date '{day}' is before 1900-01-01"):
        import_dataset(ws, src)
    assert ws.store.images() == []


@pytest.mark.parametrize(("marker", "message"), [
    ({"dictionary": "DICT_4X4_50", "id": 7, "side_cm": math.inf}, "side_cm must be a number of 0.5 to 20 cm"),
    ({"dictionary": "DICT_4X4_50", "id": 7, "side_cm": 1e300}, "side_cm must be a number of 0.5 to 20 cm"),
    ({"dictionary": "DICT_4X4_50", "id": 7, "side_cm": 0.01}, "side_cm must be a number of 0.5 to 20 cm"),
    ({"dictionary": "ArucoDetector", "id": 7, "side_cm": 4}, "dictionary 'ArucoDetector' is not an OpenCV ArUco"),
    ({"dictionary": "CORNER_REFINE_NONE", "id": 7, "side_cm": 4}, "dictionary 'CORNER_REFINE_NONE' is not"),
    ({"dictionary": "DICT_4X4_50", "id": 3.5, "side_cm": 4}, r"id must be a whole number ≥ 0, got 3\.5"),
    ({"dictionary": "DICT_4X4_50", "id": "3.5", "side_cm": 4}, r"id must be a whole number ≥ 0, got '3\.5'"),
])
def test_a_bad_marker_is_one_clear_error_and_imports_nothing(tmp_path, marker, message):
    src = visits(tmp_path / "ds", ["0 0 2000 0 20"], ["2024-01-01"], [False], marker=marker)
    ws = Workspace(tmp_path / "ws")
    with pytest.raises(DatasetError, match=r"dataset\.json: marker: " + message):
        import_dataset(ws, src)
    assert ws.store.images() == []


def test_a_marker_id_in_text_is_a_whole_number():
    assert followup.marker_spec({"id": "3", "side_cm": 4}) == MarkerSpec("DICT_4X4_50", 3, 4.0)


#: a ruler's two ends in the image (a 100-px ruler beside the wound), as a ruler calibration keeps them
ENDS = np.array([[0.0, 35.0], [100.0, 35.0]])


def test_an_implausible_size_is_flagged_never_a_bare_number():
    mask = np.zeros((40, 40), bool)
    mask[5:30, 5:30] = True
    for k in (5.0, 1e-6):  # cm per pixel: 625 px are 15,625 cm², or a speck no photo shows
        m = measure(mask, Calibration("ruler", np.diag([k, k, 1.0]), corners=ENDS, side_px=100))
        assert (m.area_cm2, m.length_cm, m.width_cm) == (None, None, None)
        assert "cm per pixel at the wound" in (m.flag or "")
    m = measure(mask, Calibration("ruler", np.diag([0.01, 0.01, 1.0]), corners=ENDS, side_px=100))
    assert m.flag is None and m.area_cm2 == pytest.approx(0.0625)


def test_the_followup_export_has_a_flag_column_beside_the_sizes():
    assert followup.COLUMNS.index("flag") < followup.COLUMNS.index("pct_change")


# -- spreadsheet-safe CSV ------------------------------------------------------------------------------
FORMULAS = ["=HYPERLINK(\"http://x\",\"y\")", "+1+1", "-2+3", "@SUM(A1)", "'=quoted", "''+twice"]


def test_the_followup_export_neutralises_formulas(tmp_path):
    src = visits(tmp_path / "ds", ["0 0 2000 0 20"] * 2, ["2024-01-01", "2024-02-01"], [False, False],
                 site="=cmd|' /C calc'!A0")
    ws = Workspace(tmp_path / "ws")
    import_dataset(ws, src)
    followup.export_followup(ws, tmp_path / "out")
    rows = read(tmp_path / "out" / "followup.csv")
    assert {r["site"] for r in rows} == {"'=cmd|' /C calc'!A0"}
    assert [r["site"] for r in read(tmp_path / "out" / "healing.csv")] == ["'=cmd|' /C calc'!A0"]


def test_the_dataset_export_neutralises_formulas_and_imports_back_losslessly(tmp_path):
    src = visits(tmp_path / "ds", ["0 0 2000 0 20"] * len(FORMULAS), ["2024-01-01"] * len(FORMULAS),
                 [False] * len(FORMULAS))
    lines = (src / "wounds.csv").read_text().splitlines()
    with (src / "wounds.csv").open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(lines[0].split(",") + ["score"])
        for line, text in zip(lines[1:], FORMULAS):
            cells = line.split(",")
            writer.writerow([*cells[:2], text, *cells[3:], "-3.5"])
    ws = Workspace(tmp_path / "ws")
    import_dataset(ws, src)
    before = {w["image_id"]: (w["description"], w["metadata"]) for w in ws.store.wounds()}
    # a file's one leading quote before a formula character is the neutralising one, as export writes it
    assert sorted(d for d, _ in before.values()) == sorted(["=HYPERLINK(\"http://x\",\"y\")", "+1+1", "-2+3",
                                                            "@SUM(A1)", "=quoted", "'+twice"])
    export_dataset(ws, tmp_path / "out")
    cells = {r["image_id"]: r for r in read(tmp_path / "out" / "wounds.csv")}
    assert all(cells[i]["description"] == "'" + d for i, (d, _) in before.items())
    assert {r["score"] for r in cells.values()} == {"-3.5"}  # a number stays a number
    again = Workspace(tmp_path / "ws2")
    import_dataset(again, tmp_path / "out")
    assert {w["image_id"]: (w["description"], w["metadata"]) for w in again.store.wounds()} == before


# -- restore under a running app or job -------------------------------------------------------------
#: What the app does with its workspace (app.auth.workspace), and what a job does (a run record).
APP = ("import sys; from annotations.infra import holders; from annotations.infra.workspace import Workspace; "
       "holders.register(Workspace(sys.argv[1]).root); print('ready', flush=True); sys.stdin.read()")
JOB = ("import sys; from annotations.infra.workspace import Workspace; Workspace(sys.argv[1]).store.start_run('train', {}); "
       "print('ready', flush=True); sys.stdin.read()")


@pytest.mark.parametrize(("program", "named"), [(APP, r"\(python -c\)"), (JOB, r"\(run #\d+ train\)")])
def test_restore_refuses_while_the_app_or_a_job_holds_the_workspace_force_included(tmp_path, program, named):
    from test_bad_inputs import small_dataset

    from annotations.infra import holders
    from annotations.infra.backup import BackupError, backup, restore
    from annotations.infra.jobs import STALE_S

    ws = Workspace(tmp_path / "ws")
    import_dataset(ws, small_dataset(tmp_path / "ds"))
    backup(ws, tmp_path / "bk")
    ws.store.close()
    holder = subprocess.Popen([sys.executable, "-c", program, str(tmp_path / "ws"), "PATIENTX9"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parents[2])
    try:
        assert holder.stdout.readline().strip() == "ready"
        for force in (False, True):
            with pytest.raises(BackupError, match=rf"in use by pid {holder.pid} on .* {named}; stop the app"):
                restore(tmp_path / "bk", tmp_path / "ws", force=force)
        if program == APP:
            (record,) = (tmp_path / "ws" / "cache" / "holders").glob(f"*-{holder.pid}.json")
            assert "PATIENTX9" not in record.read_text()  # a holder's arguments may name a patient: never kept
            assert holders.live(tmp_path / "ws", now=time.time() + STALE_S + 1) == []  # silent too long
    finally:
        holder.kill()  # killed: its holder file or running run record stays behind, stale
        holder.wait()
    assert restore(tmp_path / "bk", tmp_path / "ws", force=True)["images"] == 3


# -- erase-patient during a backup --------------------------------------------------------------------
def test_erase_patient_names_a_backup_that_started_before_it_and_ends_after(tmp_path, monkeypatch):
    import threading

    from test_bad_inputs import small_dataset

    from annotations.accounts.privacy import erase_patient
    from annotations.infra import backup as backups

    Workspace(tmp_path / "ws").store.close()
    import_dataset(Workspace(tmp_path / "ws"), small_dataset(tmp_path / "ds"))
    copying, resume = threading.Event(), threading.Event()
    copy_folder = backups._copy_folder

    def slow_copy(src, dst):
        if src.name == "runs":  # the store, masks and photos are copied: the backup holds the patient
            copying.set()
            resume.wait(30)
        copy_folder(src, dst)

    monkeypatch.setattr(backups, "_copy_folder", slow_copy)
    done = {}
    worker = threading.Thread(target=lambda: done.update(backups.backup(Workspace(tmp_path / "ws"), tmp_path / "bk")))
    worker.start()
    try:
        assert copying.wait(30)
        out = erase_patient(Workspace(tmp_path / "ws"), "p1")
    finally:
        resume.set()
        worker.join(30)
    bk = str((tmp_path / "bk").resolve())
    assert done["out"] == bk and out["backups"] == out["backups_in_progress"] == [bk]
    assert f"still in progress and will hold the patient: {bk}" in out["note"]
    again = Workspace(tmp_path / "ws")
    assert again.store.get_meta("backups") == [bk] and backups.backups_in_progress(again) == []


# -- account names and passwords ----------------------------------------------------------------------
PW = "correct horse battery"


@pytest.fixture
def store(tmp_path):
    from annotations.store.store import Store

    return Store(tmp_path / "triderm.sqlite")


@pytest.mark.parametrize(("first", "second"), [("éva", "ÉVA"), ("eva", "ＥＶＡ"), ("Straße", "STRASSE"),
                                               ("e\u0301va", "éva")])
def test_account_names_are_one_account_in_every_script_and_form(store, first, second):
    from annotations.accounts import accounts

    accounts.add_account(store, first, "annotator", PW, "test")
    with pytest.raises(accounts.AuthError, match="already exists"):
        accounts.add_account(store, second, "viewer", PW, "test")
    assert accounts.authenticate(store, second, PW).role == "annotator"


@pytest.mark.parametrize(("name", "look_alike"), [("Boss", "Вoss"), ("boss", "ВОSS"), ("ocean", "осеаn"),
                                                  ("paco", "расо"), ("Kay", "Κay")])
def test_a_look_alike_of_an_existing_name_is_refused(store, name, look_alike):
    from annotations.accounts import accounts

    accounts.add_account(store, name, "admin", PW, "test")
    with pytest.raises(accounts.AuthError, match=rf"looks like the account '{name}'|mixes"):
        accounts.add_account(store, look_alike, "viewer", PW, "test")
    assert [a["name"] for a in accounts.list_accounts(store)] == [name]


@pytest.mark.parametrize("name", ["Вoss", "Pαul", "Иван Petrov"])
def test_a_name_mixing_latin_greek_and_cyrillic_is_refused(store, name):
    from annotations.accounts import accounts

    with pytest.raises(accounts.AuthError, match=r"mixes .* letters; use one alphabet"):
        accounts.add_account(store, name, "viewer", PW, "test")


def test_names_of_one_alphabet_stay_apart_unless_they_look_alike(store):
    from annotations.accounts import accounts

    for name in ("Иван", "Ivan", "Ελένη", "eva"):
        accounts.add_account(store, name, "viewer", PW, "test")
    assert {a["name"] for a in accounts.list_accounts(store)} == {"Иван", "Ivan", "Ελένη", "eva"}


def test_a_password_is_the_same_composed_or_decomposed(store):
    from annotations.accounts import accounts

    accounts.add_account(store, "Dr A", "annotator", "caf\u00e9 au lait noir", "test")
    assert accounts.authenticate(store, "Dr A", "cafe\u0301 au lait noir").name == "Dr A"
    assert accounts.authenticate(store, "Dr A", "caf\u00e9 au lait noir").name == "Dr A"


def test_an_earlier_hash_of_a_decomposed_password_still_verifies_and_is_renewed(store):
    from argon2 import PasswordHasher

    from annotations.accounts import accounts

    accounts.add_account(store, "Dr A", "annotator", PW, "test")
    typed = "cafe\u0301 au lait noir"
    store.db.execute("UPDATE accounts SET password_hash = ? WHERE name = 'Dr A'", [PasswordHasher().hash(typed)])
    assert accounts.authenticate(store, "Dr A", typed).name == "Dr A"
    assert accounts.authenticate(store, "Dr A", "caf\u00e9 au lait noir").name == "Dr A"  # renewed as NFKC


@pytest.mark.parametrize("password", [" " * 10, " " * 12 + "abc", "\u3000" * 10 + "x"])
def test_a_password_of_spaces_is_refused(store, password):
    from annotations.accounts import accounts

    with pytest.raises(accounts.AuthError, match="not spaces"):
        accounts.add_account(store, "Dr A", "annotator", password, "test")
    assert accounts.list_accounts(store) == []


def test_the_agreement_report_csv_neutralises_a_run_named_as_a_formula(tmp_path):
    from core.eval.metrics import METRICS
    from core.eval.report import write_report

    row = {"modality": "vision", "run_id": 3, "kind": "embed", "label": "#3 embed (=HYPERLINK(\"x\"))",
           "protocol": "-all", "n_images": 4, "n": 10, "n_anchors": 4, "n_skipped": 0, "n_missing": 0,
           "per_anchor": [], **{m: -0.25 for m in METRICS}, "ci": {m: (-0.5, 0.1) for m in METRICS}}
    paths = write_report(Workspace(tmp_path / "ws"), [row], 10, 100)
    (cells,) = read(Path(paths["csv"]))
    assert (cells["label"], cells["protocol"], cells["kappa"]) == ("#3 embed (=HYPERLINK(\"x\"))", "'-all", "-0.25")


def test_the_study_id_mapping_neutralises_formula_names_and_reads_them_back(tmp_path):
    from annotations.accounts.privacy import StudyIds

    ws = Workspace(tmp_path / "ws")
    ids = StudyIds(ws, tmp_path / "ids.csv")
    for name in ("=cmd|' /C calc'!A0.png", "-x.png", "plain.png"):
        ids.study_id(name)
    ids.save()
    assert [r["original"] for r in read(tmp_path / "ids.csv")] == ["'=cmd|' /C calc'!A0.png", "'-x.png", "plain.png"]
    assert StudyIds(ws, tmp_path / "ids.csv").ids == ids.ids


def test_a_failed_backup_is_no_longer_in_progress(tmp_path, monkeypatch):
    import errno

    from test_bad_inputs import small_dataset

    from annotations.infra import backup as backups

    ws = Workspace(tmp_path / "ws")
    import_dataset(ws, small_dataset(tmp_path / "ds"))

    def full_disk(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device", str(dst))

    monkeypatch.setattr(backups, "_copy_folder", full_disk)
    with pytest.raises(DatasetError, match="the disk is full"):
        backups.backup(ws, tmp_path / "bk")
    assert ws.store.get_meta(backups.IN_PROGRESS) == [] and ws.store.get_meta("backups") is None
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".bk.")] == []  # no staging left
