"""Data safety: re-import merges (never overwrites app work), revisions and restore, dry run,
prune, export --force, study ids, erase-patient, backup/restore and the workspace-kind guard."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from annotations.accounts import session
from annotations.infra.backup import BackupError, backup, restore
from annotations.infra.workspace import Workspace
from annotations.io.dataset import MergeConflict, check_kind, export_dataset, import_dataset
from annotations.io.readers import DatasetError
from annotations.store.history import restore_revision
from annotations.store.rows import wound_key

ROOT = Path(__file__).resolve().parents[2]


def _dataset(root: Path, synthetic: bool | str | None = None) -> Path:
    """Three photos (two patients), two wounds each on a and b, two judgments."""
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    for i, name in enumerate(("a", "b", "c")):
        Image.fromarray(np.full((40, 50, 3), 30 + 60 * i, np.uint8)).save(root / "images" / f"{name}.png")
        mask = np.zeros((40, 50), np.uint8)
        if name != "c":
            mask[2:10, 2:10] = 1
            mask[20:30, 20:35] = 2
        Image.fromarray(mask).save(root / "masks" / f"{name}.png")
    (root / "wounds.csv").write_text("image_id,wound_index,description,site\n"
                                     "a,1,red granulation,shin\na,2,fibrin,\nb,1,crust,back\nb,2,,\n")
    (root / "images.csv").write_text("image_id,patient_id,camera\na,p1,phone\nb,p1,\nc,p2,dslr\n")
    (root / "patients.csv").write_text("patient_id,age,sex\np1,12,f\np2,30,m\n")
    (root / "triplets.csv").write_text("anchor,ref_j,ref_k,choice,annotator\na,b,c,j,ann\nb,a,c,skip,ann\n")
    if synthetic is not None:
        (root / "dataset.json").write_text(json.dumps({"name": "t", "synthetic": synthetic}))
    return root


def _state(ws: Workspace) -> dict:
    """Every row, revision and workspace file (with its bytes' hash)."""
    s = ws.store
    files = {p.relative_to(ws.root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
             for p in sorted(ws.root.rglob("*")) if p.is_file() and not p.name.startswith("triderm.sqlite")}
    return {"images": s.images(), "patients": s.patients(), "wounds": s.wounds(), "triplets": s.triplets(),
            "revisions": s.revisions(), "bases": s.import_bases(), "files": files}


def _set_description(root: Path, image_id: str, index: int, text: str) -> None:
    path = root / "wounds.csv"
    lines = path.read_text().splitlines()
    for n, line in enumerate(lines):
        cells = line.split(",")
        if cells[:2] == [image_id, str(index)]:
            cells[2] = text
            lines[n] = ",".join(cells)
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture
def ds(tmp_path) -> Path:
    return _dataset(tmp_path / "ds")


@pytest.fixture
def ws(tmp_path, ds) -> Workspace:
    ws = Workspace(tmp_path / "ws")
    import_dataset(ws, ds)
    return ws


def _region(shape, y0, y1, x0, x1) -> np.ndarray:
    region = np.zeros(shape, bool)
    region[y0:y1, x0:x1] = True
    return region


def test_reimport_keeps_app_edits_drawn_outlines_and_undone_answers(ws, ds):
    session.update_wound_text(ws, "a", 1, "edited in the app", {"site": "shin"}, actor="dr_x")
    drawn = session.add_wound(ws, "c", _region((40, 50), 5, 15, 5, 20), description="new ulcer", actor="dr_x")
    answer = next(t for t in ws.store.triplets() if t["choice"] == "j")
    ws.store.delete_triplet(answer["id"], actor="dr_x")
    summary = import_dataset(ws, ds)
    assert ws.store.wound("a", 1)["description"] == "edited in the app"
    assert ws.store.wound("c", drawn)["description"] == "new ulcer"
    assert (ws.load_mask("c") == drawn).sum() == 150
    assert [t["choice"] for t in ws.store.triplets()] == ["skip"]  # the undone answer stays undone
    assert summary["merge"]["keep-app"] == 1 and summary["merge"]["keep-deleted"] == 1
    assert summary["merge"]["conflict"] == 0 and summary["new_triplets"] == 0
    assert ws.store.wound("c", drawn)["metadata"]["origin"] == "drawn"


def test_a_change_in_the_dataset_alone_is_applied(ws, ds):
    _set_description(ds, "b", 1, "crust drying")
    summary = import_dataset(ws, ds)
    assert ws.store.wound("b", 1)["description"] == "crust drying"
    assert summary["merge"]["update"] == 1
    last = ws.store.revisions("wounds", wound_key("b", 1))[-1]
    assert (last["field"], last["old"], last["new"], last["actor"]) == ("description", "crust", "crust drying",
                                                                        "import")


def test_both_sides_changed_is_a_conflict_named_by_file_line_field(ws, ds):
    session.update_wound_text(ws, "a", 1, "app text", {"site": "shin"}, actor="dr_x")
    _set_description(ds, "a", 1, "file text")
    before = _state(ws)
    with pytest.raises(MergeConflict) as err:
        import_dataset(ws, ds)
    assert "wounds.csv: line 2: wound 1 of a description" in str(err.value)
    assert "--prefer" in str(err.value)
    assert _state(ws) == before
    import_dataset(ws, ds, prefer="app")
    assert ws.store.wound("a", 1)["description"] == "app text"
    _set_description(ds, "a", 1, "file text 2")  # the dataset moves on again
    import_dataset(ws, ds, prefer="file")
    assert ws.store.wound("a", 1)["description"] == "file text 2"
    history = [(r["actor"], r["field"], r["new"]) for r in ws.store.revisions("wounds", wound_key("a", 1))]
    assert ("dr_x", "description", "app text") in history and ("import", "description", "file text 2") in history


def test_conflict_on_the_command_line_exits_2_listing_it(ws, ds):
    session.update_wound_text(ws, "b", 1, "app", {}, actor="dr_x")
    _set_description(ds, "b", 1, "file")
    out = subprocess.run([sys.executable, "-m", "annotations", "import", str(ds), "--workspace", str(ws.root)],
                         check=False, cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 2 and "wounds.csv: line 4: wound 1 of b description" in out.stderr
    hist = subprocess.run([sys.executable, "-m", "annotations", "history", "--entity", "wounds", "--key",
                           '{"image_id": "b", "wound_index": 1}', "--workspace", str(ws.root)],
                          cwd=ROOT, capture_output=True, text=True, check=True)
    assert "dr_x update wounds" in hist.stdout and '"crust" → "app"' in hist.stdout
    rev = next(line for line in hist.stdout.splitlines() if "dr_x update" in line).split()[0].lstrip("#")
    subprocess.run([sys.executable, "-m", "annotations", "restore-revision", rev, "--actor", "admin", "--workspace",
                    str(ws.root)], cwd=ROOT, capture_output=True, text=True, check=True)
    assert Workspace(ws.root).store.wound("b", 1)["description"] == "crust"


def test_dry_run_reports_and_writes_nothing(ws, ds):
    _set_description(ds, "b", 1, "changed")
    before = _state(ws)
    summary = import_dataset(ws, ds, dry_run=True)
    assert summary["dry_run"] and summary["merge"]["update"] == 1
    assert any("wound 1 of b description" in c for c in summary["changes"])
    assert _state(ws) == before


def test_rows_gone_from_the_dataset_are_deleted_only_with_prune(ws, ds):
    drawn = session.add_wound(ws, "c", _region((40, 50), 5, 15, 5, 20), actor="dr_x")
    mask = np.asarray(Image.open(ds / "masks" / "b.png")).copy()
    mask[mask == 2] = 0
    Image.fromarray(mask).save(ds / "masks" / "b.png")
    (ds / "wounds.csv").write_text((ds / "wounds.csv").read_text().replace("b,2,,\n", ""))
    (ds / "masks" / "c.png").unlink()
    summary = import_dataset(ws, ds)
    assert ws.store.wound("b", 2) is not None and summary["merge"]["not-in-file"] == 1
    summary = import_dataset(ws, ds, prune=True)
    assert ws.store.wound("b", 2) is None and (ws.load_mask("b") == 2).sum() == 0
    assert summary["merge"]["delete"] == 1
    assert ws.store.wound("c", drawn) is not None  # drawn in the app: never pruned
    assert ws.store.wound("b", 1) is not None


@pytest.mark.parametrize("where", ["store", "commit"])
def test_import_is_atomic_when_it_fails_midway(ws, ds, monkeypatch, where):
    from annotations.store.store import _Transaction

    _set_description(ds, "b", 1, "changed")
    Image.fromarray(np.full((40, 50, 3), 7, np.uint8)).save(ds / "images" / "c.png")  # a changed photo
    mask = np.asarray(Image.open(ds / "masks" / "a.png")).copy()
    mask[mask == 1] = 0
    mask[0:5, 40:50] = 1  # a moved outline
    Image.fromarray(mask).save(ds / "masks" / "a.png")
    before = _state(ws)

    def fail(*args, **kwargs):
        raise RuntimeError("disk gone")

    def commit_fails(self, exc_type, exc, tb):  # the files are renamed in; COMMIT fails
        if self.outer:
            self.conn.execute("ROLLBACK")
            raise RuntimeError("disk gone")

    if where == "store":
        monkeypatch.setattr(ws.store, "upsert_wound", fail)
    else:
        monkeypatch.setattr(_Transaction, "__exit__", commit_fails)
    with pytest.raises(RuntimeError):
        import_dataset(ws, ds)
    assert _state(ws) == before
    assert not [p for p in ws.root.iterdir() if p.name.startswith(".import-")]


def test_export_refuses_a_non_empty_folder_unless_forced(ws, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(DatasetError, match="not empty"):
        export_dataset(ws, out)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    (out / "masks").mkdir()
    Image.fromarray(np.ones((40, 50), np.uint8)).save(out / "masks" / "stale.png")
    export_dataset(ws, out, force=True)
    assert (out / "notes.txt").read_text() == "keep me"
    assert not (out / "masks" / "stale.png").exists() and (out / "masks" / "a.png").exists()
    again = Workspace(tmp_path / "ws2")
    assert import_dataset(again, out)["wounds"] == 4


def test_restore_revision_brings_back_a_deleted_wound_and_a_description(ws):
    pixels = ws.load_mask("a") == 2
    session.delete_wound(ws, "a", 2, actor="dr_x")
    session.update_wound_text(ws, "a", 1, "oops", {}, actor="dr_x")
    revs = ws.store.revisions("wounds")
    deletion = next(r for r in revs if r["action"] == "delete")
    edit = next(r for r in revs if r["field"] == "description" and r["new"] == "oops")
    restore_revision(ws, deletion["id"], "admin")
    restore_revision(ws, edit["id"], "admin")
    assert np.array_equal(ws.load_mask("a") == 2, pixels)
    assert ws.store.wound("a", 2)["description"] == "fibrin"
    assert ws.store.wound("a", 1)["description"] == "red granulation"
    assert {r["action"] for r in ws.store.revisions("wounds") if r["actor"] == "admin"} == {"restore"}


def test_outline_redraw_is_restorable_pixel_for_pixel(ws):
    before = ws.load_mask("b").copy()
    session.add_wound(ws, "b", _region((40, 50), 30, 38, 30, 45), wound_index=1, actor="dr_x", origin="edited")
    assert ws.store.wound("b", 1)["metadata"]["origin"] == "edited"
    redraw = next(r for r in ws.store.revisions("wounds", wound_key("b", 1)) if r["field"] == "outline")
    restore_revision(ws, redraw["id"], "admin")
    assert np.array_equal(ws.load_mask("b"), before)


def test_study_ids_replace_photo_names_and_keep_the_mapping_apart(tmp_path, ds):
    ws = Workspace(tmp_path / "ws")
    with pytest.raises(DatasetError, match="apart"):
        import_dataset(ws, ds, study_ids=ws.images_dir / "map.csv")
    mapping = tmp_path / "private" / "map.csv"
    import_dataset(ws, ds, study_ids=mapping)
    ids = [r["image_id"] for r in ws.store.images()]
    assert ids == ["S000001", "S000002", "S000003"]
    assert sorted(p.name for p in ws.images_dir.iterdir()) == [f"{i}.png" for i in ids]
    assert mapping.read_text().splitlines() == ["original,study_id", "a,S000001", "b,S000002", "c,S000003"]
    summary = import_dataset(ws, ds, study_ids=mapping)  # stable on a re-import
    assert summary["merge"]["insert"] == 0 and len(ws.store.images()) == 3


def test_erase_patient_removes_everything_of_theirs(ws, tmp_path):
    session.update_wound_text(ws, "a", 1, "identifying note", {}, actor="dr_x")
    out = subprocess.run([sys.executable, "-m", "annotations", "erase-patient", "p1", "--workspace", str(ws.root)],
                         cwd=ROOT, capture_output=True, text=True, check=True)
    removed = json.loads(out.stdout)
    assert removed["photos"] == ["a", "b"] and removed["wounds"] == 4 and removed["judgments"] == 2
    assert removed["files"] == 4 and removed["revisions"] > 0
    ws = Workspace(ws.root)
    assert [i["image_id"] for i in ws.store.images()] == ["c"] and ws.store.wounds() == []
    assert ws.store.triplets() == [] and [p["patient_id"] for p in ws.store.patients()] == ["p2"]
    assert not any(json.dumps(r["key"]).count('"a"') or r["key"] in ("a", "b", "p1")
                   for r in ws.store.revisions())
    for name in ("triderm.sqlite", "triderm.sqlite-wal"):
        if (ws.root / name).exists():
            assert b"identifying note" not in (ws.root / name).read_bytes()
    again = subprocess.run([sys.executable, "-m", "annotations", "erase-patient", "p1", "--workspace",
                            str(ws.root)], check=False, cwd=ROOT, capture_output=True, text=True)
    assert again.returncode == 2 and "no patient 'p1'" in again.stderr


def test_backup_while_annotators_write_then_restore(ws, tmp_path):
    ids = [r["image_id"] for r in ws.store.images()]
    stop = threading.Event()
    written = []

    def annotate() -> None:
        other = Workspace(ws.root)
        n = 0
        while not stop.is_set() and n < 400:
            if other.store.add_triplet(ids[0], ids[1], ids[2], "k", "expert:busy", rep=n + 1) is not None:
                written.append(n)
            n += 1

    worker = threading.Thread(target=annotate)
    worker.start()
    try:
        summary = backup(ws, tmp_path / "bk")
    finally:
        stop.set()
        worker.join()
    restored = restore(tmp_path / "bk", tmp_path / "restored")
    copy = Workspace(tmp_path / "restored")
    n = len(copy.store.triplets(source="expert:busy"))
    assert 0 <= n <= len(written) and restored["images"] == summary["images"] == 3
    assert [r["rep"] for r in copy.store.triplets(source="expert:busy")] == list(range(1, n + 1))
    assert len([r for r in copy.store.revisions("triplets") if r["actor"] == "expert:busy"]) == n
    for r in copy.store.images():
        assert hashlib.sha256((copy.images_dir / r["file"]).read_bytes()).hexdigest() == r["sha256"]
    assert np.array_equal(copy.load_mask("a"), ws.load_mask("a"))
    with pytest.raises(BackupError, match="not empty"):
        restore(tmp_path / "bk", tmp_path / "restored")


def test_a_corrupted_backup_is_refused_and_changes_nothing(ws, tmp_path):
    backup(ws, tmp_path / "bk")
    mask = tmp_path / "bk" / "masks" / "a.png"
    mask.write_bytes(mask.read_bytes()[:-10])
    target = tmp_path / "target"
    out = subprocess.run([sys.executable, "-m", "annotations", "restore", str(tmp_path / "bk"), "--workspace",
                          str(target)], check=False, cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 2 and "masks/a.png: checksum differs" in out.stderr
    assert not target.exists()


def test_workspace_kinds_are_kept_apart(tmp_path):
    real = Workspace(tmp_path / "real")
    import_dataset(real, _dataset(tmp_path / "r"))
    with pytest.raises(DatasetError, match="holds real photos"):
        import_dataset(real, _dataset(tmp_path / "s", synthetic=True))
    synth = Workspace(tmp_path / "synth")
    import_dataset(synth, _dataset(tmp_path / "s2", synthetic="true"))
    assert synth.is_synthetic
    with pytest.raises(DatasetError, match="SYNTHETIC demo"):
        import_dataset(synth, _dataset(tmp_path / "r2"))
    check_kind(Workspace(tmp_path / "empty"), synthetic=True)  # an empty workspace takes either


@pytest.mark.parametrize("value, expected", [("false", False), ("False", False), ("no", False), (False, False),
                                             ("true", True), (True, True), ("maybe", None), (2, None)])
def test_synthetic_flag_is_parsed_never_truthy_by_being_non_empty(tmp_path, value, expected):
    ws = Workspace(tmp_path / "ws")
    ds = _dataset(tmp_path / "ds", synthetic=value)
    if expected is None:
        with pytest.raises(DatasetError, match=r"dataset.json: synthetic: .* is not a boolean"):
            import_dataset(ws, ds)
        assert ws.store.images() == []
    else:
        assert import_dataset(ws, ds)["synthetic"] is expected and ws.is_synthetic is expected


def test_every_write_names_its_actor(ws):
    session.add_wound(ws, "c", _region((40, 50), 0, 10, 0, 10), actor="dr_y", origin="suggested")
    ids = [r["image_id"] for r in ws.store.images()]
    ws.store.add_triplet(ids[2], ids[0], ids[1], "k", "expert:dr_y")
    actors = {(r["entity"], r["actor"]) for r in ws.store.revisions()}
    assert {("wounds", "import"), ("triplets", "import"), ("images", "import"), ("patients", "import"),
            ("wounds", "dr_y"), ("triplets", "expert:dr_y")} <= actors
    with pytest.raises(ValueError, match="origin"):
        session.add_wound(ws, "c", _region((40, 50), 20, 30, 0, 10), actor="dr_y", origin="guessed")
    assert os.listdir(ws.root / "cache") == []


def test_import_waiting_too_long_for_the_lock_changes_nothing(ws, ds):
    _set_description(ds, "b", 1, "changed")
    Image.fromarray(np.full((40, 50, 3), 7, np.uint8)).save(ds / "images" / "c.png")
    before = _state(ws)
    holder = Workspace(ws.root)
    holder.store.db.conn.execute("BEGIN IMMEDIATE")  # an annotator's long write
    ws.store.db.execute("PRAGMA busy_timeout = 100")
    try:
        with pytest.raises(DatasetError, match=r"locked.*nothing was imported"):
            import_dataset(ws, ds)
    finally:
        holder.store.db.conn.execute("ROLLBACK")
    assert _state(ws) == before


def test_an_outline_drawn_in_the_app_is_never_overwritten_by_a_new_dataset_wound(ws, ds):
    drawn = session.add_wound(ws, "a", _region((40, 50), 32, 38, 2, 12), description="app ulcer", actor="dr_x")
    assert drawn == 3
    mask = np.asarray(Image.open(ds / "masks" / "a.png")).copy()
    mask[12:18, 40:48] = 3  # the dataset now has its own wound 3 elsewhere
    Image.fromarray(mask).save(ds / "masks" / "a.png")
    summary = import_dataset(ws, ds)
    assert summary["merge"]["renumber"] == 1 and summary["merge"]["conflict"] == 0
    labels = ws.load_mask("a")
    assert ws.store.wound("a", 4)["description"] == "app ulcer" and (labels == 4).sum() == 60
    assert ws.store.wound("a", 3)["area"] == 48 and labels[12:18, 40:48].tolist() == np.full((6, 8), 3).tolist()
    assert import_dataset(ws, ds)["merge"] == dict.fromkeys(summary["merge"], 0)  # settled


def _choices(ws: Workspace) -> dict[tuple[str, str, str], str]:
    return {(t["anchor"], t["ref_j"], t["ref_k"]): t["choice"] for t in ws.store.triplets()}


def _answer_again_in_app(ws: Workspace, anchor: str, ref_j: str, ref_k: str, choice: str) -> None:
    """The annotator's stored judgment replaced in the app (same key, another choice)."""
    old = next(t for t in ws.store.triplets() if (t["anchor"], t["ref_j"], t["ref_k"]) == (anchor, ref_j, ref_k))
    ws.store.delete_triplet(old["id"], actor="dr_x")
    assert ws.store.add_triplet(anchor, ref_j, ref_k, choice, old["source"], rep=old["rep"], actor="dr_x")


def _file_choice(ds: Path, anchor: str, choice: str | None) -> None:
    """Change (or, with None, remove) the dataset's judgment anchored at ``anchor``."""
    lines = (ds / "triplets.csv").read_text().splitlines()
    out = [lines[0]]
    for line in lines[1:]:
        cells = line.split(",")
        if cells[0] == anchor:
            if choice is None:
                continue
            cells[3] = choice
        out.append(",".join(cells))
    (ds / "triplets.csv").write_text("\n".join(out) + "\n")


def test_judgments_follow_the_three_way_rules(ws, ds):
    """Each judgment case of the merge: kept from the app, applied from the file, added, and left alone."""
    _answer_again_in_app(ws, "a", "b", "c", "k")  # changed in the app only
    summary = import_dataset(ws, ds)
    assert _choices(ws)[("a", "b", "c")] == "k" and summary["merge"]["keep-app"] == 1
    assert summary["merge"]["update"] == summary["merge"]["conflict"] == 0 and summary["new_triplets"] == 0
    _file_choice(ds, "b", "k")  # changed in the file only
    (ds / "triplets.csv").write_text((ds / "triplets.csv").read_text() + "c,a,b,j,ann\n")  # a new judgment
    summary = import_dataset(ws, ds)
    assert _choices(ws) == {("a", "b", "c"): "k", ("b", "a", "c"): "k", ("c", "a", "b"): "j"}
    assert summary["merge"]["update"] == 1 and summary["merge"]["insert"] == 1 and summary["new_triplets"] == 2
    assert any("triplets.csv: line 3" in c and "changed in the dataset" in c for c in summary["changes"])
    assert import_dataset(ws, ds)["new_triplets"] == 0  # nothing changed: nothing written
    assert _choices(ws) == {("a", "b", "c"): "k", ("b", "a", "c"): "k", ("c", "a", "b"): "j"}


def test_a_judgment_changed_on_both_sides_is_a_conflict(ws, ds):
    _answer_again_in_app(ws, "a", "b", "c", "k")
    _file_choice(ds, "a", "skip")
    before = _state(ws)
    with pytest.raises(MergeConflict) as err:
        import_dataset(ws, ds)
    assert "triplets.csv: line 2" in str(err.value) and "changed in the app AND in the dataset" in str(err.value)
    assert _state(ws) == before
    import_dataset(ws, ds, prefer="app")
    assert _choices(ws)[("a", "b", "c")] == "k"
    _file_choice(ds, "a", "j")  # the file moves on; the app's k stays a conflict
    import_dataset(ws, ds, prefer="file")
    assert _choices(ws)[("a", "b", "c")] == "j"


def test_a_judgment_deleted_in_the_app_and_changed_in_the_file_is_a_conflict(ws, ds):
    answer = next(t for t in ws.store.triplets() if t["anchor"] == "a")
    ws.store.delete_triplet(answer["id"], actor="dr_x")
    _file_choice(ds, "a", "k")
    with pytest.raises(MergeConflict, match=r"triplets.csv: line 2"):
        import_dataset(ws, ds)
    import_dataset(ws, ds, prefer="app")
    assert ("a", "b", "c") not in _choices(ws)
    _file_choice(ds, "a", "skip")
    import_dataset(ws, ds, prefer="file")
    assert _choices(ws)[("a", "b", "c")] == "skip"


def test_judgments_gone_from_the_file_are_deleted_only_with_prune_and_app_changes_conflict(ws, ds):
    _file_choice(ds, "b", None)
    summary = import_dataset(ws, ds)
    assert ("b", "a", "c") in _choices(ws) and summary["merge"]["not-in-file"] == 1
    summary = import_dataset(ws, ds, prune=True)
    assert ("b", "a", "c") not in _choices(ws) and summary["merge"]["delete"] == 1
    _answer_again_in_app(ws, "a", "b", "c", "k")  # changed in the app, then removed from the file
    _file_choice(ds, "a", None)
    with pytest.raises(MergeConflict, match=r"judgment|triplet"):
        import_dataset(ws, ds, prune=True)
    import_dataset(ws, ds, prune=True, prefer="app")
    assert _choices(ws) == {("a", "b", "c"): "k"}
    import_dataset(ws, ds, prune=True, prefer="file")
    assert _choices(ws) == {}
