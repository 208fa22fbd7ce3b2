"""Issue 29's classes of fault: re-import never erases without --prune (4), file swaps survive a
SIGKILL (5), restore verifies everything before it swaps (6), copies never follow links (7),
erase-patient leaves no byte of the patient (8), a full disk or a held lock is one error (11)."""
from __future__ import annotations

import errno
import hashlib
import importlib.util
import json
import os
import sqlite3
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from annotations.__main__ import main
from annotations.accounts.privacy import erase_patient
from annotations.infra import backup as backup_module
from annotations.infra import fileio, journal
from annotations.infra.backup import BackupError, backup, restore
from annotations.infra.journal import Swap
from annotations.infra.workspace import Workspace
from annotations.io import dataset
from annotations.io.dataset import DatasetError, export_dataset, import_dataset
from annotations.store import store as store_module

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("crashtest", ROOT / "scripts" / "crashtest.py")
crashtest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(crashtest)


def _dataset(root: Path, names=("photoQ7a", "photoQ7b", "photoR5c"), patients=("PATIENTX9", "PATIENTX9", "PATIENTY4"),
             grey: int = 30) -> Path:
    """Three photos with two wounds each, descriptions, metadata, patient links and judgments."""
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    wounds = ["image_id,wound_index,description,site"]
    for n, name in enumerate(names):
        Image.fromarray(np.full((20, 24, 3), grey + 50 * n, np.uint8)).save(root / "images" / f"{name}.png")
        mask = np.zeros((20, 24), np.uint8)
        mask[1:7, 1:7], mask[10:18, 10:20] = 1, 2
        Image.fromarray(mask).save(root / "masks" / f"{name}.png")
        wounds += [f"{name},1,granulation XYZZY-{name},shin", f"{name},2,fibrin slough {name},back"]
    (root / "wounds.csv").write_text("\n".join(wounds) + "\n")
    (root / "images.csv").write_text("image_id,patient_id,camera\n" + "".join(
        f"{i},{p},phone\n" for i, p in zip(names, patients)))
    (root / "patients.csv").write_text("patient_id,age\n" + "".join(f"{p},{30 + n}\n"
                                                                     for n, p in enumerate(sorted(set(patients)))))
    (root / "triplets.csv").write_text(f"anchor,ref_j,ref_k,choice,annotator\n{names[0]},{names[1]},{names[2]},j,ann\n")
    return root


def _rows(ws: Workspace) -> dict:
    s = ws.store
    return {"patients": s.patients(), "images": s.images(), "wounds": s.wounds(),
            "triplets": [(t["anchor"], t["ref_j"], t["ref_k"], t["choice"]) for t in s.triplets()],
            "photos": {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in ws.images_dir.iterdir()}}


@pytest.fixture
def ws(tmp_path) -> Workspace:
    ws = Workspace(tmp_path / "ws")
    import_dataset(ws, _dataset(tmp_path / "ds"))
    return ws


# -- 4. an absent file is no change; the workspace is never imported into itself -----------------------------
@pytest.mark.parametrize("gone", ["wounds.csv", "images.csv", "patients.csv"])
def test_an_absent_csv_changes_nothing_on_a_reimport(ws, tmp_path, gone):
    before = _rows(ws)
    (tmp_path / "ds" / gone).unlink()
    summary = import_dataset(ws, tmp_path / "ds")
    assert _rows(ws) == before
    assert summary["merge"]["update"] == summary["merge"]["delete"] == 0


def test_importing_the_workspace_or_a_folder_inside_it_is_refused(ws, capsys):
    before = _rows(ws)
    assert main(["import", str(ws.root), "--workspace", str(ws.root)]) == 2
    assert "is the workspace" in capsys.readouterr().err
    inside = _dataset(ws.root / "runs" / "copy")
    with pytest.raises(DatasetError, match="overlaps it"):
        import_dataset(ws, inside)
    assert _rows(ws) == before


# -- 5. crash consistency ------------------------------------------------------------------------------------
def test_an_import_killed_inside_its_file_swap_is_rolled_back_when_the_workspace_opens(ws, tmp_path):
    """SIGKILL at the 2nd photo renamed into images/ (any implementation: os.replace is watched)."""
    ds2 = _dataset(tmp_path / "ds2", grey=90)
    before = _rows(ws)
    ws.store.close()
    pid = os.fork()
    if pid == 0:
        real, seen = os.replace, []

        def watched(src, dst):
            if Path(dst).parent == ws.images_dir and ".import-" in str(src):
                seen.append(dst)
                if len(seen) == 2:
                    os.kill(os.getpid(), 9)
            real(src, dst)

        os.replace = watched
        try:
            import_dataset(Workspace(ws.root), ds2, prefer="file")
        finally:
            os._exit(0)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == -9
    again = Workspace(ws.root)
    assert _rows(again) == before and journal.pending(again.root) == []
    for img in again.store.images():
        assert hashlib.sha256((again.images_dir / img["file"]).read_bytes()).hexdigest() == img["sha256"]


def test_stale_staging_folders_are_removed_when_the_workspace_opens(ws):
    stale = ws.root / ".import-old1234"
    (stale / "spool").mkdir(parents=True)
    (stale / "spool" / "photoQ7a.png").write_bytes(b"a patient's photo")
    old = time.time() - 2 * journal.GRACE_S
    os.utime(stale, (old, old))
    live = Swap(ws.root, "import")  # a running import's folder stays
    try:
        Workspace(ws.root)
        assert not stale.exists() and live.dir.exists()
    finally:
        live.close()


@pytest.mark.parametrize("had", [True, False])
def test_a_swap_resumes_forward_or_backward_from_every_step(tmp_path, had):
    def setup() -> tuple[Swap, Path]:
        root = tmp_path / f"r{time.monotonic_ns()}"
        root.mkdir()
        swap = Swap(root, "import")
        for name in ("x", "y"):
            (swap.dir / name).write_text(f"new {name}")
            if had:
                (root / name).write_text(f"old {name}")
        swap.plan([(swap.dir / "x", root / "x"), (swap.dir / "y", root / "y"), (None, root / "z")], commit="meta")
        return swap, root

    for stop in range(6):
        for ahead in (True, False):
            swap, root = setup()
            calls = []

            def limited(src, dst):
                if len(calls) == stop:
                    raise KeyboardInterrupt  # stands in for the kill
                calls.append(dst)
                os.replace(src, dst)

            journal.replace, saved = limited, journal.replace
            try:
                with pytest.raises(KeyboardInterrupt):
                    swap.forward()
                    raise KeyboardInterrupt
            finally:
                journal.replace = saved
            swap._lock.release()
            assert journal.recover(root, lambda key: ahead) == [swap.dir.name]
            want = {n: ("new" if ahead else "old") + f" {n}" for n in "xy"} if ahead or had else {}
            assert {p.name: p.read_text() for p in root.iterdir()} == want


def test_the_crash_test_finds_no_inconsistent_end_state(tmp_path):
    report = crashtest.crashtest(("reimport", "erase"), 3, tmp_path)
    assert report["reimport"]["steps"] > 10 and report["erase"]["steps"] > 3
    assert report["reimport"]["inconsistent"] == report["erase"]["inconsistent"] == []


# -- 6. restore ----------------------------------------------------------------------------------------------
def _rewrite(bk: Path, rel: str) -> None:
    """Make the manifest agree with a file changed in the backup (a crafted backup)."""
    manifest = json.loads((bk / "manifest.json").read_text())
    data = (bk / rel).read_bytes()
    manifest["files"][rel] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    (bk / "manifest.json").write_text(json.dumps(manifest))


def _refused(bk: Path, ws: Workspace, match: str) -> None:
    before = _rows(ws)
    with pytest.raises(BackupError, match=match):
        restore(bk, ws.root, force=True)
    assert _rows(Workspace(ws.root)) == before and journal.pending(ws.root) == []


@pytest.mark.parametrize(("sql", "match"), [
    ("PRAGMA user_version = 99", "schema version 99"),  # a database newer than this software
    ("CREATE TRIGGER wipe AFTER INSERT ON revisions BEGIN DELETE FROM wounds; END", "trigger 'wipe'"),
])
def test_an_altered_backup_database_is_refused_and_keeps_the_live_workspace(ws, tmp_path, sql, match):
    backup(ws, tmp_path / "bk")
    with sqlite3.connect(tmp_path / "bk" / "triderm.sqlite") as conn:
        conn.execute(sql)
    _rewrite(tmp_path / "bk", "triderm.sqlite")
    _refused(tmp_path / "bk", ws, match)


def test_a_link_inside_a_backup_is_refused_and_nothing_outside_is_copied(ws, tmp_path):
    backup(ws, tmp_path / "bk")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("session key")
    (tmp_path / "bk" / "runs").rename(tmp_path / "runs-old")
    (tmp_path / "bk" / "runs").symlink_to(outside)
    _rewrite(tmp_path / "bk", "runs/secret.txt")
    _refused(tmp_path / "bk", ws, "symbolic link")
    assert not (ws.root / "runs" / "secret.txt").exists()


@pytest.mark.parametrize("manifest", ['{"files": []}', '{"files": {"triderm.sqlite": "x"}}', "[1]",
                                      '{"files": {"triderm.sqlite": {"sha256": "0", "size": 1}, "../x": '
                                      '{"sha256": "0", "size": 1}}}'])
def test_a_malformed_manifest_is_one_clear_error(ws, tmp_path, capsys, manifest):
    backup(ws, tmp_path / "bk")
    (tmp_path / "bk" / "manifest.json").write_text(manifest)
    assert main(["restore", str(tmp_path / "bk"), "--force", "--workspace", str(ws.root)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "manifest.json" in err and len(err.splitlines()) == 1


def test_a_restore_swaps_the_workspace_in_and_drops_the_old(ws, tmp_path):
    backup(ws, tmp_path / "bk")
    before = _rows(ws)
    erase_patient(ws, "PATIENTX9")
    restore(tmp_path / "bk", ws.root, force=True)
    assert _rows(Workspace(ws.root)) == before and journal.pending(ws.root) == []


def test_a_restored_workspace_that_does_not_open_gives_the_old_one_back(ws, tmp_path, monkeypatch):
    backup(ws, tmp_path / "bk")
    erase_patient(ws, "PATIENTX9")
    before = _rows(ws)

    def broken(root):
        raise RuntimeError("does not open")

    monkeypatch.setattr(backup_module, "Workspace", broken)
    with pytest.raises(RuntimeError, match="does not open"):
        restore(tmp_path / "bk", ws.root, force=True)
    assert _rows(Workspace(ws.root)) == before and journal.pending(ws.root) == []


# -- 7. copies never follow links ----------------------------------------------------------------------------
def test_a_truth_file_swapped_for_a_link_after_the_scan_is_refused(tmp_path, monkeypatch):
    ds = _dataset(tmp_path / "ds")
    (ds / "truth").mkdir()
    (ds / "truth" / "latent.json").write_text("{}")
    (tmp_path / "session_key").write_text("SECRET-KEY")
    validate = dataset.validate_dataset

    def then_swap(*args, **kwargs):
        plan = validate(*args, **kwargs)
        (ds / "truth" / "latent.json").unlink()
        (ds / "truth" / "latent.json").symlink_to(tmp_path / "session_key")
        return plan

    monkeypatch.setattr(dataset, "validate_dataset", then_swap)
    ws = Workspace(tmp_path / "ws")
    with pytest.raises(DatasetError, match=r"latent.json: is a symbolic link"):
        import_dataset(ws, ds)
    assert not any(b"SECRET-KEY" in p.read_bytes() for p in ws.root.rglob("*") if p.is_file())


def test_export_and_backup_refuse_a_link_inside_the_workspace(ws, tmp_path):
    (tmp_path / "session_key").write_text("SECRET-KEY")
    ws.truth_dir.mkdir()
    (ws.truth_dir / "latent.json").symlink_to(tmp_path / "session_key")
    with pytest.raises(DatasetError, match="symbolic link"):
        export_dataset(ws, tmp_path / "out")
    (ws.truth_dir / "latent.json").unlink()
    (ws.runs_dir / "1").mkdir()
    (ws.runs_dir / "1" / "key").symlink_to(tmp_path / "session_key")
    with pytest.raises(BackupError, match="symbolic link"):
        backup(ws, tmp_path / "bk")
    assert not (tmp_path / "bk").exists() and not (tmp_path / "out").exists()


# -- 8. erase-patient: not one byte left ---------------------------------------------------------------------
def test_erase_patient_leaves_no_byte_of_the_patient_under_the_workspace(ws, tmp_path):
    # photoR5c belonged to PATIENTX9 before: its revision history names the patient
    (tmp_path / "ds" / "images.csv").write_text("image_id,patient_id,camera\nphotoQ7a,PATIENTX9,phone\n"
                                                "photoQ7b,PATIENTX9,phone\nphotoR5c,PATIENTX9,phone\n")
    import_dataset(ws, tmp_path / "ds")
    (tmp_path / "ds" / "images.csv").write_text("image_id,patient_id,camera\nphotoQ7a,PATIENTX9,phone\n"
                                                "photoQ7b,PATIENTX9,phone\nphotoR5c,PATIENTY4,phone\n")
    import_dataset(ws, tmp_path / "ds")
    backup(ws, tmp_path / "bk")
    with sqlite3.connect(ws.cache_dir / "scheduler.sqlite") as con:  # the scheduler's leases
        for statement in crashtest_schema():
            con.execute(statement)
        con.execute("INSERT INTO served VALUES ('ann', 'photoQ7a', 'photoQ7b', 'photoR5c', 0, 'new', 'photoQ7b', "
                    "'photoR5c', 1.0)")
    run = ws.store.start_run("embed", {"photos": ["photoQ7a", "photoR5c"]})
    ws.store.finish_run(run, "done")
    (ws.run_dir(run) / "ids.npy").write_bytes(np.array(["photoQ7a", "photoR5c"]).tobytes())
    (ws.run_dir(run) / "notes.txt").write_text("kept: nothing of the patient here\n")
    stale = ws.root / ".import-stale99"
    (stale / "spool").mkdir(parents=True)
    (stale / "spool" / "photoQ7b.png").write_bytes(b"photoQ7b bytes")
    os.utime(stale, (time.time() - 2 * journal.GRACE_S,) * 2)
    (ws.root / "notes").mkdir()
    (ws.root / "notes" / "list.txt").write_text("photoQ7a,S1\n")  # the user's own file: named, not deleted
    ws.store.close()
    out = erase_patient(Workspace(tmp_path / "ws"), "PATIENTX9")
    assert out["photos"] == ["photoQ7a", "photoQ7b"] and out["backups"] == [str((tmp_path / "bk").resolve())]
    assert out["deleted_files"] == [f"runs/{run}/ids.npy"] and out["leases"] == 1
    assert out["files_still_naming"] == ["notes/list.txt"]
    (ws.root / "notes" / "list.txt").unlink()
    needles = ["PATIENTX9", "photoQ7a", "photoQ7b", "XYZZY-photoQ7a", "fibrin slough photoQ7b"]
    for path in (tmp_path / "ws").rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            for needle in needles:
                for enc in ("utf-8", "utf-16-le", "utf-32-le"):
                    assert needle.encode(enc) not in data, f"{path} holds {needle!r} ({enc})"
    assert (tmp_path / "ws" / "runs" / str(run) / "notes.txt").exists()
    left = Workspace(tmp_path / "ws")
    assert [i["image_id"] for i in left.store.images()] == ["photoR5c"]
    assert any(r["entity"] == "images" for r in left.store.revisions())  # the other photo keeps its history


def crashtest_schema() -> list[str]:
    from annotations.store.leases import _SCHEMA
    return [s for s in _SCHEMA.split(";") if s.strip()]


# -- 11. one error, exit 2, nothing changed ------------------------------------------------------------------
def _full(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device", "spool.png")


@pytest.mark.parametrize("where", ["staging", "commit"])
def test_a_full_disk_is_one_error_and_changes_nothing(ws, tmp_path, monkeypatch, capsys, where):
    ds2 = _dataset(tmp_path / "ds2", grey=90)
    before = _rows(ws)
    if where == "staging":
        monkeypatch.setattr(dataset, "_stage_photos", _full)
    else:
        def full_at_commit(*args, **kwargs):
            raise sqlite3.OperationalError("database or disk is full")
        monkeypatch.setattr(dataset, "_apply", full_at_commit)
    assert main(["import", str(ds2), "--prefer", "file", "--workspace", str(ws.root)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "disk is full" in err and "free some space" in err
    assert _rows(Workspace(ws.root)) == before and journal.pending(ws.root) == []


def test_a_write_lock_held_too_long_is_one_error(ws, tmp_path, monkeypatch, capsys):
    before = _rows(ws)
    monkeypatch.setattr(store_module.Store.__init__, "__defaults__", (0.2,))
    holder = sqlite3.connect(ws.root / "triderm.sqlite", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        assert main(["import", str(_dataset(tmp_path / "ds2", grey=90)), "--prefer", "file",
                     "--workspace", str(ws.root)]) == 2
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "locked" in err and "try again" in err
    assert _rows(Workspace(ws.root)) == before


def test_a_triplet_source_naming_no_one_is_one_error(ws, tmp_path, capsys):
    ds = tmp_path / "ds"
    (ds / "triplets.csv").write_text("anchor,ref_j,ref_k,choice,source\nphotoQ7a,photoQ7b,photoR5c,k,expert:\n")
    before = _rows(ws)
    assert main(["import", str(ds), "--workspace", str(ws.root)]) == 2
    err = capsys.readouterr().err
    assert err == "error: triplets.csv: line 2: source 'expert:' names no one; write it as kind:name " \
                  "(e.g. expert:alice), or leave it empty and fill annotator\n"
    assert _rows(ws) == before


def test_write_steps_are_counted_and_the_crash_hook_is_off_by_default(tmp_path):
    start = fileio._steps
    fileio.write_text(tmp_path / "a", "x")
    fileio.replace(tmp_path / "a", tmp_path / "b")
    assert fileio._steps == start + 2 and fileio.CRASH_ENV not in os.environ
