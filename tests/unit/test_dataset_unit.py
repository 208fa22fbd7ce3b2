"""Dataset folders, unit level: tiny hand-made datasets in tmp_path, exact errors, plans, merge lines,
summaries and exports (mutation-checked, issue 22; the merge scenarios are in tests/integration/test_merge.py)."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from annotations.infra.workspace import Workspace, outline_hash, outlines
from annotations.io import dataset
from annotations.io.dataset import (
    Change,
    DatasetError,
    MergeConflict,
    check_kind,
    export_dataset,
    import_dataset,
    plan_merge,
    validate_dataset,
)
from annotations.io.readers import IMAGE_SUFFIXES
from annotations.store.rows import key_json, wound_key

H, W = 16, 20


def labels(*wounds: int) -> np.ndarray:
    """Label map with wound 1 (6×6 = 36 px) and/or wound 2 (6×8 = 48 px)."""
    m = np.zeros((H, W), np.uint8)
    if 1 in wounds:
        m[2:8, 2:8] = 1
    if 2 in wounds:
        m[9:15, 10:18] = 2
    return m


def make(root: Path, photos=("a", "b", "c"), masks: dict | None = None, **files: str) -> Path:
    """A dataset folder: flat photos of distinct greys, the given masks, and CSV/JSON files by name."""
    (root / "images").mkdir(parents=True)
    for n, name in enumerate(photos):
        Image.fromarray(np.full((H, W, 3), 40 + 50 * n, np.uint8)).save(root / "images" / f"{name}.png")
    if masks:
        (root / "masks").mkdir()
        for name, m in masks.items():
            Image.fromarray(m).save(root / "masks" / f"{name}.png")
    for name, text in files.items():
        (root / name.replace("_csv", ".csv").replace("_json", ".json")).write_text(text)
    return root


def error(root: Path, **kw) -> str:
    with pytest.raises(DatasetError) as info:
        validate_dataset(root, **kw)
    return str(info.value)


# -- validation: photos and masks ----------------------------------------------------------------------
def test_folder_errors(tmp_path):
    (tmp_path / "empty").mkdir()
    assert error(tmp_path / "empty") == f"{(tmp_path / 'empty').resolve()}: no images/ folder"
    (tmp_path / "none" / "images").mkdir(parents=True)
    (tmp_path / "none" / "images" / ".hidden.png").write_bytes(b"x")
    assert error(tmp_path / "none") == f"{(tmp_path / 'none' / 'images').resolve()}: no images"
    (tmp_path / "none" / "images" / "sub").mkdir()  # never skipped unseen
    assert error(tmp_path / "none") == ("images/sub: is a folder; images/ may hold only files (move its contents "
                                        "up or remove it)")


def test_photo_errors(tmp_path):
    root = make(tmp_path / "d")
    (root / "images" / "notes.txt").write_text("x")
    assert error(root) == f"images/notes.txt: unsupported file type (expected {', '.join(IMAGE_SUFFIXES)})"
    (root / "images" / "notes.txt").unlink()
    Image.new("RGB", (W, H)).save(root / "images" / "a.jpg")
    assert error(root) == "images/a.png: a second image with id 'a' (also a.jpg)"
    (root / "images" / "a.jpg").unlink()
    (root / "images" / "b c.png").write_bytes((root / "images" / "a.png").read_bytes())
    assert error(root).startswith("images/b c.png: image id 'b c' is not a valid id")


def test_mask_errors(tmp_path):
    root = make(tmp_path / "d", masks={"a": labels(1)})
    (root / "masks" / "a.jpg").write_bytes(b"x")
    assert error(root) == "masks/a.jpg: masks must be PNG files"
    (root / "masks" / "a.jpg").unlink()
    Image.fromarray(labels(1)).save(root / "masks" / "z.png")
    assert error(root) == "masks/z.png: mask for unknown image 'z' (no matching file in images/)"


def test_a_plain_dataset_becomes_a_plan(tmp_path):
    root = make(tmp_path / "d", masks={"a": labels(1, 2), "b": labels()})
    (root / "images" / ".DS_Store").write_bytes(b"x")
    (root / "masks" / ".hidden").write_bytes(b"x")
    plan = validate_dataset(root)
    assert plan.root == root.resolve() and list(plan.images) == ["a", "b", "c"]
    a = plan.images["a"]
    assert (a.width, a.height, a.patient_id, a.path.name) == (W, H, None, "a.png")
    assert a.spooled is None and a.photo is not None and a.photo.data == b""  # no spool asked: bytes not kept
    assert sorted(plan.wounds) == [("a", 1), ("a", 2)]
    w = plan.wounds[("a", 2)]
    assert (w["area"], w["bbox"], w["description"], w["metadata"]) == (48, [10, 9, 18, 15], "", {})
    assert plan.patients == {} and len(plan.triplets) == 0 and plan.dropped == [] and plan.synthetic is False
    assert plan.where[("images", '"a"', "file")] == "images/a.png"
    assert plan.where[("wounds", key_json(wound_key("a", 2)), "outline")] == "masks/a.png"


# -- validation: wounds.csv, patients.csv, images.csv ---------------------------------------------------
@pytest.mark.parametrize("rows, message", [
    ("z,1,x", "wounds.csv: line 2: image_id 'z' is not in images/"),
    ("a,one,x", "wounds.csv: line 2: wound_index: 'one' is not a whole number (digits 0-9)"),
    ("a,1,x\na,1,y", "wounds.csv: line 3: wound 1 of 'a' is listed twice"),
    ("a,3,x", "wounds.csv: line 2: wound_index 3 is not in the mask of 'a' (masks/a.png)"),
    ("b,1,x", "wounds.csv: line 2: wound_index 1 is not in the mask of 'b' (masks/b.png)"),
])
def test_wounds_csv_errors(tmp_path, rows, message):
    root = make(tmp_path / "d", masks={"a": labels(1, 2)}, wounds_csv=f"image_id,wound_index,description\n{rows}\n")
    assert error(root) == message


def test_a_wound_under_the_minimum_area_is_dropped_and_named(tmp_path):
    root = make(tmp_path / "d", masks={"a": labels(1, 2)}, wounds_csv="image_id,wound_index,description\na,1,x\n")
    assert error(root, min_wound_area=40) == ("wounds.csv: line 2: wound_index 1 is not in the mask of 'a' "
                                              "(masks/a.png): its 36 px are under the workspace's minimum "
                                              "wound area of 40 px")
    plan = validate_dataset(root, min_wound_area=36)
    assert sorted(plan.wounds) == [("a", 1), ("a", 2)]
    plan = validate_dataset(make(tmp_path / "e", masks={"a": labels(1, 2)}), min_wound_area=40)
    assert sorted(plan.wounds) == [("a", 1)] or sorted(plan.wounds) == [("a", 2)]
    assert [d["file"] for d in plan.dropped] == ["masks/a.png"]


def test_wound_rows_fill_descriptions_and_metadata(tmp_path):
    root = make(tmp_path / "d", masks={"a": labels(1, 2)},
                wounds_csv="image_id,wound_index,description,depth\na,2,deep,3\na,1,red,\n")
    plan = validate_dataset(root)
    assert plan.wounds[("a", 2)]["description"] == "deep" and plan.wounds[("a", 2)]["metadata"] == {"depth": 3}
    assert plan.wounds[("a", 1)]["metadata"] == {}
    k = key_json(wound_key("a", 1))
    assert (plan.where[("wounds", k, "description")], plan.where[("wounds", k, "metadata")]) == \
        ("wounds.csv: line 3", "wounds.csv: line 3")


@pytest.mark.parametrize("files, message", [
    ({"patients_csv": "patient_id,age\np1,3\np1,4\n"}, "patients.csv: line 3: patient_id 'p1' is listed twice"),
    ({"images_csv": "image_id,patient_id\nz,p1\n"}, "images.csv: line 2: image_id 'z' is not in images/"),
    ({"images_csv": "image_id,patient_id\na,p1\na,p2\n"}, "images.csv: line 3: image_id 'a' is listed twice"),
    ({"images_csv": "image_id,patient_id\na,p9\n", "patients_csv": "patient_id\np1\n"},
     "images.csv: line 2: patient_id 'p9' is not in patients.csv"),
])
def test_patient_and_image_table_errors(tmp_path, files, message):
    assert error(make(tmp_path / "d", **files)) == message


def test_patient_and_image_tables(tmp_path):
    root = make(tmp_path / "d", patients_csv="patient_id,age\np2,30\np1,12\n",
                images_csv="image_id,patient_id,camera\nb,p1,phone\na,,dslr\n")
    plan = validate_dataset(root)
    assert plan.patients == {"p2": {"age": 30}, "p1": {"age": 12}}
    assert [(i.image_id, i.patient_id, i.metadata) for i in plan.images.values()] == \
        [("a", None, {"camera": "dslr"}), ("b", "p1", {"camera": "phone"}), ("c", None, {})]
    assert plan.where[("patients", '"p1"', "metadata")] == "patients.csv: line 3"
    assert plan.where[("images", '"a"', "patient_id")] == plan.where[("images", '"a"', "metadata")] == \
        "images.csv: line 3"
    # without patients.csv, a patient named in images.csv is created
    plan = validate_dataset(make(tmp_path / "e", images_csv="image_id,patient_id\nc,p7\n"))
    assert plan.patients == {"p7": {}} and plan.images["c"].patient_id == "p7"


# -- validation: triplets.csv -----------------------------------------------------------------------------
TRIPLET_HEAD = "anchor,ref_j,ref_k,choice,annotator"


@pytest.mark.parametrize("rows, message", [
    ("z,b,c,j,x", "triplets.csv: line 2: anchor 'z' is not a known image"),
    ("a,z,c,j,x", "triplets.csv: line 2: ref_j 'z' is not a known image"),
    ("a,b,z,j,x", "triplets.csv: line 2: ref_k 'z' is not a known image"),
    ("a,b,a,j,x", "triplets.csv: line 2: a triplet needs three different images, got a, b, a"),
    ("a,b,c,J,x", "triplets.csv: line 2: choice must be one of j, k, skip, got 'J'"),
    ("a,b,c,j,", "triplets.csv: line 2: annotator is empty (or give a source column)"),
])
def test_triplet_errors(tmp_path, rows, message):
    assert error(make(tmp_path / "d", triplets_csv=f"{TRIPLET_HEAD}\n{rows}\n")) == message


@pytest.mark.parametrize("rows, message", [
    ("a,b,c,j,x,,1.5.2", "triplets.csv: line 2: latency_ms: '1.5.2' is not a finite number (digits 0-9, e.g. 1250 "
                         "or 1.25e3)"),
    ("a,b,c,j,x,r,", "triplets.csv: line 2: rep: 'r' is not a whole number (digits 0-9)"),
    ("a,b,c,j,x,1,\na,b,c,k,x,1,", "triplets.csv: the judgment ('a', 'b', 'c') by expert:x with rep 1 is listed twice"),
])
def test_triplet_number_and_duplicate_errors(tmp_path, rows, message):
    root = make(tmp_path / "d", triplets_csv=f"{TRIPLET_HEAD},rep,latency_ms\n{rows}\n")
    assert error(root) == message


def test_triplets_sources_repeats_and_known_images(tmp_path):
    root = make(tmp_path / "d", triplets_csv=f"{TRIPLET_HEAD},source,rep,latency_ms,created\n"
                                             "a,b,c,j,x,,,,\n"
                                             "a,b,c,k,x,,,12.5,2026-01-31T14:05\n"
                                             "a,b,c,j,,llm:m,,,\n"
                                             "a,b,old,skip,y,,4,,\n")
    with pytest.raises(DatasetError, match="old"):
        validate_dataset(root)
    plan = validate_dataset(root, known_images={"old"})
    assert [(t["source"], t["rep"], t["choice"], t["latency_ms"], t["created"]) for t in plan.triplets.rows()] == [
        ("expert:x", 0, "j", None, None), ("expert:x", 1, "k", 12.5, "2026-01-31T14:05"), ("llm:m", 0, "j", None, None),
        ("expert:y", 4, "skip", None, None)]
    assert [t["line"] for t in plan.triplets.rows()] == [2, 3, 4, 5]  # errors and changes cite these lines


def test_dataset_json_synthetic_flag(tmp_path):
    plan = validate_dataset(make(tmp_path / "d", dataset_json='{"name": "n", "synthetic": "yes"}'))
    assert plan.synthetic is True and plan.info["name"] == "n"


# -- merge lines and helpers ------------------------------------------------------------------------------
WK = {"image_id": "a", "wound_index": 2}
TK = {"source": "expert:x", "anchor": "a", "ref_j": "b", "ref_k": "c", "rep": 1}


@pytest.mark.parametrize("change, text", [
    (Change("wounds", WK, "outline", "insert", "masks/a.png"), "masks/a.png: wound 2 of a outline: new"),
    (Change("images", "a", "metadata", "update", "images.csv: line 2", {"x": 1}, {"x": 2}),
     'images.csv: line 2: image a metadata: changed in the dataset (app: {"x": 1}; file: {"x": 2})'),
    (Change("triplets", TK, "row", "delete", "workspace"),
     "workspace: judgment a/b/c by expert:x (rep 1) row: removed (--prune)"),
    (Change("patients", "p", "metadata", "keep-app", "w"),
     "w: patient p metadata: changed in the app since the last import: kept"),
    (Change("patients", "p", "metadata", "keep-deleted", "w"),
     "w: patient p metadata: deleted in the app since the last import: stays deleted"),
    (Change("images", "a", "file", "not-in-file", "w"), "w: image a file: no longer in the dataset: kept (--prune deletes it)"),
    (Change("wounds", WK, "description", "conflict", "wounds.csv: line 3", "x", "y", resolved="file"),
     ('wounds.csv: line 3: wound 2 of a description: changed in the app AND in the dataset (app: "x"; file: "y")'
     " → file kept")),
    (Change("wounds", WK, "outline", "renumber", "masks/a.png", 2, 3),
     "masks/a.png: wound 2 of a outline: drawn in the app, its number now taken by the dataset: moved to 3"),
])
def test_change_lines(change, text):
    assert change.describe() == text


def test_short_and_hash():
    assert dataset._short({"area": 5, "bbox": [1, 2, 3, 4], "png": "x"}) == "outline of 5 px at [1, 2, 3, 4]"
    assert dataset._short("é" * 58) == '"' + "é" * 58 + '"'  # 60 characters: whole
    assert dataset._short("x" * 59) == '"' + "x" * 56 + "..."
    assert dataset._short({"b": 1, "a": None}) == '{"a": null, "b": 1}'
    o = outlines(labels(1))[1]
    assert dataset._hash("outline", o) == outline_hash(o)
    assert dataset._hash("outline", {"area": 1, "bbox": [0, 0, 1, 1]}) == "no-pixels"
    assert dataset._hash("outline", None) == "no-pixels"
    assert dataset._hash("metadata", {"b": 1, "a": 2}) == dataset._hash("metadata", {"a": 2, "b": 1})
    assert dataset._hash("metadata", {"a": 1}) == \
        "f9d86028c6e0d64e225186f96acb69338b2c59764df79162107f5c4bb34d1310"  # sha256 of '{"a": 1}'


def test_merge_conflict_message():
    c = Change("patients", "p", "metadata", "conflict", "patients.csv: line 2", {"a": 1}, {"a": 2})
    err = MergeConflict([c, c])
    assert err.conflicts == [c, c] and isinstance(err, DatasetError)
    assert str(err) == ("2 conflict(s) between the app and the dataset; nothing was imported. Re-run with "
                        "--prefer app or --prefer file:\n  " + c.describe() + "\n  " + c.describe())


# -- import ---------------------------------------------------------------------------------------------------
def full(root: Path) -> Path:
    return make(root, masks={"a": labels(1, 2), "b": labels(1)},
                wounds_csv="image_id,wound_index,description,site\na,1,red,shin\na,2,,\nb,1,crust,\n",
                images_csv="image_id,patient_id,camera\na,p1,phone\nb,p1,\nc,p2,\n",
                patients_csv="patient_id,age\np1,12\np2,30\n",
                triplets_csv=f"{TRIPLET_HEAD},latency_ms\na,b,c,j,ann,250\nb,a,c,skip,ann,\n",
                dataset_json='{"name": "tiny", "synthetic": false}')


ZERO = {"insert": 0, "update": 0, "delete": 0, "keep-app": 0, "keep-deleted": 0, "not-in-file": 0, "conflict": 0,
        "renumber": 0}


def test_import_summary_rows_and_files(tmp_path):
    ws = Workspace(tmp_path / "ws")
    ds = full(tmp_path / "ds")
    dry = import_dataset(ws, ds, dry_run=True)
    assert ws.store.images() == [] and not any(ws.images_dir.iterdir())
    assert dry["dry_run"] is True and dry["synthetic"] is False and dry["new_triplets"] == 0
    got = import_dataset(ws, ds, actor="amy")
    assert {k: got[k] for k in ("images", "patients", "wounds", "triplets", "new_triplets", "dry_run", "synthetic",
                                "dropped_wounds", "workspace")} == \
        {"images": 3, "patients": 2, "wounds": 3, "triplets": 2, "new_triplets": 2, "dry_run": False,
         "synthetic": False, "dropped_wounds": [], "workspace": str(ws.root)}
    assert got["merge"] == {**ZERO, "insert": 3 + 2 + 3 + 2} == dry["merge"]
    assert got["changes"] == dry["changes"] and "images.csv: line 2: image a file: new" not in got["changes"]
    assert "images/a.png: image a file: new" in got["changes"]
    assert sorted(p.name for p in ws.images_dir.iterdir()) == ["a.png", "b.png", "c.png"]
    assert sorted(p.name for p in ws.masks_dir.iterdir()) == ["a.png", "b.png"]
    assert not [p for p in ws.root.iterdir() if p.name.startswith(".import-")]
    assert (ws.load_mask("a") == labels(1, 2)).all()
    s = ws.store
    assert [(i["image_id"], i["patient_id"], i["metadata"]) for i in s.images()] == \
        [("a", "p1", {"camera": "phone"}), ("b", "p1", {}), ("c", "p2", {})]
    assert [(w["image_id"], w["wound_index"], w["area"], w["description"], w["metadata"]) for w in s.wounds()] == \
        [("a", 1, 36, "red", {"site": "shin"}), ("a", 2, 48, "", {}), ("b", 1, 36, "crust", {})]
    assert [(t["source"], t["choice"], t["latency_ms"]) for t in s.triplets()] == \
        [("expert:ann", "j", 250.0), ("expert:ann", "skip", None)]
    assert s.annotators() == ["ann"] and s.get_meta("dataset_name") == "tiny" and s.get_meta("synthetic") is False
    assert {r["actor"] for r in s.revisions()} == {"amy"}
    assert len(s.import_bases()) == 2 + 3 * 3 + 3 * 3 + 2
    again = import_dataset(ws, ds)
    assert again["merge"] == ZERO and again["new_triplets"] == 0 and again["changes"] == []


def test_reimport_updates_keeps_and_conflicts(tmp_path):
    ws = Workspace(tmp_path / "ws")
    ds = full(tmp_path / "ds")
    import_dataset(ws, ds)
    ws.store.upsert_patient("p2", {"age": 31}, actor="app")  # changed in the app only
    ws.store.upsert_wound("a", 1, 36, [2, 2, 8, 8], "pale", {"site": "shin"}, actor="app")  # both sides
    (ds / "wounds.csv").write_text("image_id,wound_index,description,site\na,1,pink,shin\na,2,,\nb,1,crust,arm\n")
    with pytest.raises(MergeConflict) as info:
        import_dataset(ws, ds)
    assert [c.describe() for c in info.value.conflicts] == [
        ('wounds.csv: line 2: wound 1 of a description: changed in the app AND in the dataset (app: "pale"; '
        'file: "pink")')]
    with pytest.raises(DatasetError, match=r"^--prefer must be one of app, file, got 'both'$"):
        import_dataset(ws, ds, prefer="both")
    got = import_dataset(ws, ds, prefer="app")
    assert got["merge"] == {**ZERO, "update": 1, "keep-app": 1, "conflict": 1}
    assert ws.store.wound("a", 1)["description"] == "pale" and ws.store.wound("b", 1)["metadata"] == {"site": "arm"}
    assert ws.store.patient("p2")["metadata"] == {"age": 31}
    ws.store.upsert_wound("a", 1, 36, [2, 2, 8, 8], "pale2", {"site": "shin"}, actor="app")
    assert import_dataset(ws, ds, prefer="file")["merge"] == {**ZERO, "keep-app": 2}  # "pink" was read last time
    (ds / "wounds.csv").write_text("image_id,wound_index,description,site\na,1,rose,shin\na,2,,\nb,1,crust,arm\n")
    got = import_dataset(ws, ds, prefer="file")
    assert ws.store.wound("a", 1)["description"] == "rose"
    assert got["changes"][0].endswith(' (app: "pale2"; file: "rose") → file kept')


def test_reimport_after_deletions_and_prune(tmp_path):
    ws = Workspace(tmp_path / "ws")
    ds = full(tmp_path / "ds")
    import_dataset(ws, ds)
    tid = ws.store.triplets()[0]["id"]
    ws.store.delete_triplet(tid, actor="app")  # deleted in the app: stays deleted
    got = import_dataset(ws, ds)
    assert got["merge"] == {**ZERO, "keep-deleted": 1} and len(ws.store.triplets()) == 1
    assert got["changes"] == [("triplets.csv: line 2: judgment a/b/c by expert:ann (rep 0) row: deleted in the app "
                              "since the last import: stays deleted")]
    (ds / "triplets.csv").write_text(f"{TRIPLET_HEAD}\n")
    (ds / "images" / "c.png").unlink()
    (ds / "images.csv").write_text("image_id,patient_id,camera\na,p1,phone\nb,p1,\n")
    got = import_dataset(ws, ds)
    assert got["merge"] == {**ZERO, "not-in-file": 2}  # photo c and a judgment stay without --prune
    assert [i["image_id"] for i in ws.store.images()] == ["a", "b", "c"] and len(ws.store.triplets()) == 1
    got = import_dataset(ws, ds, prune=True)
    assert got["merge"] == {**ZERO, "delete": 2} and ws.store.triplets() == []
    assert [i["image_id"] for i in ws.store.images()] == ["a", "b"]  # (the photo file itself stays in images/)


def test_prune_keeps_a_photo_still_in_use(tmp_path):
    ws = Workspace(tmp_path / "ws")
    ds = full(tmp_path / "ds")
    import_dataset(ws, ds)
    ws.store.add_triplet("c", "a", "b", "k", "expert:app")  # made in the app, names photo c
    (ds / "images" / "c.png").unlink()
    (ds / "images.csv").write_text("image_id,patient_id,camera\na,p1,phone\nb,p1,\n")
    (ds / "triplets.csv").write_text(f"{TRIPLET_HEAD}\nb,a,c,skip,ann\n")
    with pytest.raises(DatasetError, match="ref_k 'c' is not a known image"):
        validate_dataset(ds)
    (ds / "triplets.csv").write_text(f"{TRIPLET_HEAD}\n")
    got = import_dataset(ws, ds, prune=True)
    assert [i["image_id"] for i in ws.store.images()] == ["a", "b", "c"]
    assert got["merge"]["not-in-file"] == 1 and got["merge"]["delete"] == 2


def test_a_wound_gone_from_the_mask_is_kept_unless_pruned(tmp_path):
    ws = Workspace(tmp_path / "ws")
    ds = full(tmp_path / "ds")
    import_dataset(ws, ds)
    Image.fromarray(labels(1)).save(ds / "masks" / "a.png")
    (ds / "wounds.csv").write_text("image_id,wound_index,description,site\na,1,red,shin\nb,1,crust,\n")
    assert import_dataset(ws, ds)["merge"] == {**ZERO, "not-in-file": 1}
    assert (ws.load_mask("a") == labels(1, 2)).all()
    got = import_dataset(ws, ds, prune=True)
    assert got["merge"] == {**ZERO, "delete": 1}
    assert [w["wound_index"] for w in ws.store.wounds("a")] == [1] and (ws.load_mask("a") == labels(1)).all()


def test_workspace_kinds(tmp_path):
    ws = Workspace(tmp_path / "ws")
    check_kind(ws, True)  # empty: anything goes
    check_kind(ws, False)
    import_dataset(ws, full(tmp_path / "ds"))
    check_kind(ws, False)
    with pytest.raises(DatasetError, match=f"^{ws.root}: this workspace holds real photos; build or import the "
                                           r"SYNTHETIC demo into a new, empty workspace \(--workspace\) instead$"):
        check_kind(ws, True)
    ws.store.set_meta("synthetic", True)
    check_kind(ws, True)
    with pytest.raises(DatasetError, match=f"^{ws.root}: this workspace holds the SYNTHETIC demo; import real "
                                           r"photos into a new, empty workspace \(--workspace\) so the two are "
                                           "never mixed$"):
        check_kind(ws, False)


# -- files ----------------------------------------------------------------------------------------------------
def test_label_png_depth(tmp_path):
    dataset._write_label_png(tmp_path / "a.png", np.array([[0, 255]]))
    dataset._write_label_png(tmp_path / "b.png", np.array([[0, 256]]))
    assert np.asarray(Image.open(tmp_path / "a.png")).dtype == np.uint8
    assert np.asarray(Image.open(tmp_path / "b.png")).max() == 256


def test_export_round_trip_and_refusals(tmp_path, monkeypatch):
    ws = Workspace(tmp_path / "ws")
    import_dataset(ws, full(tmp_path / "ds"))
    ws.store.add_triplet("c", "a", "b", "k", "llm:m", latency_ms=0.1)
    ws.store.add_triplet("c", "b", "a", "j", "expert:dr:x")  # a colon inside the annotator's name
    ws.save_mask("c", np.zeros((H, W), np.int32))  # a mask file without wounds is exported too
    (tmp_path / "file").write_text("x")
    with pytest.raises(DatasetError, match=f"^{tmp_path / 'file'}: not a folder$"):
        export_dataset(ws, tmp_path / "file")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "keep.txt").write_text("mine")
    (tmp_path / "busy" / "wounds.csv").write_text("old")
    with pytest.raises(DatasetError, match=f"^{tmp_path / 'busy'}: not empty; export into a new folder or give "
                                           "--force to replace its dataset files$"):
        export_dataset(ws, tmp_path / "busy")
    got = export_dataset(ws, tmp_path / "busy", force=True)
    out = tmp_path / "busy"
    assert got == {"images": 3, "patients": 2, "wounds": 3, "triplets": 4, "out": str(out)}
    assert sorted(p.name for p in out.iterdir()) == sorted(["keep.txt", "images", "masks", "wounds.csv", "images.csv",
                                                            "patients.csv", "triplets.csv", "dataset.json"])
    assert (out / "keep.txt").read_text() == "mine"
    assert [p.name for p in tmp_path.iterdir() if ".export-" in p.name] == []
    with (out / "triplets.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert (out / "triplets.csv").read_text().splitlines()[0] == \
        "anchor,ref_j,ref_k,choice,annotator,source,rep,latency_ms,created"
    assert (out / "patients.csv").read_text().splitlines() == ["patient_id,age", "p1,12", "p2,30"]
    assert [(r["anchor"], r["annotator"], r["source"], r["rep"], r["latency_ms"], bool(r["created"])) for r in rows] == \
        [("a", "ann", "expert:ann", "0", "250.0", True), ("b", "ann", "expert:ann", "0", "", True),
         ("c", "", "llm:m", "0", "0.1", True), ("c", "dr:x", "expert:dr:x", "0", "", True)]
    assert (out / "wounds.csv").read_text().splitlines() == \
        ["image_id,wound_index,description,site", "a,1,red,shin", "a,2,,", "b,1,crust,"]
    assert (out / "images.csv").read_text().splitlines()[:2] == ["image_id,patient_id,camera", "a,p1,phone"]
    assert json.loads((out / "dataset.json").read_text()) == {"name": "tiny", "synthetic": False, "mask_format": "label",
                                                              "columns": {"age": "int", "camera": "str",
                                                                          "site": "str"}}
    assert sorted(p.name for p in (out / "masks").iterdir()) == ["a.png", "b.png", "c.png"]
    back = Workspace(tmp_path / "back")
    import_dataset(back, out)
    assert [(w["image_id"], w["wound_index"], w["description"]) for w in back.store.wounds()] == \
        [(w["image_id"], w["wound_index"], w["description"]) for w in ws.store.wounds()]
    assert len(back.store.triplets()) == 4
    staged = []
    real = dataset.tempfile.mkdtemp
    monkeypatch.setattr(dataset.tempfile, "mkdtemp", lambda **kw: staged.append(kw) or real(**kw))
    deep = tmp_path / "new" / "a" / "deeper"
    fresh = export_dataset(ws, deep)
    assert fresh["out"] == str(deep) and (deep / "images").is_dir()
    assert staged == [{"prefix": ".deeper.export-", "dir": deep.parent}]  # beside out: renames stay on one disk


def test_write_csv_fills_missing_cells_and_adds_extra_columns(tmp_path):
    dataset._write_csv(tmp_path / "t.csv", ["id", "note"], [{"id": "a", "note": None, "z": 1}, {"id": "é", "y": "q"}])
    assert (tmp_path / "t.csv").read_bytes().decode("utf-8") == "id,note,y,z\r\na,,,1\r\né,,q,\r\n"


def test_rows_gone_from_the_dataset_kept_pruned_or_in_conflict(tmp_path):
    ws = Workspace(tmp_path / "ws")
    ds = full(tmp_path / "ds")
    import_dataset(ws, ds)
    ws.store.upsert_patient("p0", {"age": 1}, actor="app")  # made in the app: an import never touches it
    ws.store.upsert_wound("b", 1, 36, [2, 2, 8, 8], "app edit", {}, actor="app")  # changed in the app
    (ds / "images" / "c.png").unlink()
    (ds / "images.csv").write_text("image_id,patient_id,camera\na,p1,phone\nb,p1,\n")
    (ds / "patients.csv").write_text("patient_id,age\np1,12\n")
    (ds / "masks" / "b.png").unlink()
    (ds / "wounds.csv").write_text("image_id,wound_index,description,site\na,1,red,shin\na,2,,\n")
    got = import_dataset(ws, ds)
    assert got["merge"] == {**ZERO, "not-in-file": 3}
    assert sorted(got["changes"]) == [
        "workspace: image c file: no longer in the dataset: kept (--prune deletes it)",
        "workspace: patient p2 metadata: no longer in the dataset: kept (--prune deletes it)",
        "workspace: wound 1 of b outline: no longer in the dataset: kept (--prune deletes it)"]
    with pytest.raises(MergeConflict) as info:
        import_dataset(ws, ds, prune=True)
    (conflict,) = info.value.conflicts
    assert (conflict.entity, conflict.key, conflict.field, conflict.action, conflict.where, conflict.new) == \
        ("wounds", {"image_id": "b", "wound_index": 1}, "outline", "conflict", "workspace", None)
    assert conflict.describe().startswith("workspace: wound 1 of b outline: changed in the app AND in the dataset "
                                          "(app: outline of 36 px at [2, 2, 8, 8]; file: null)")
    got = import_dataset(ws, ds, prune=True, prefer="app")  # photo c: still named by judgments; patients stay
    assert got["merge"] == {**ZERO, "not-in-file": 2, "conflict": 1}
    assert any(line.endswith("→ app kept") for line in got["changes"])
    assert ws.store.wound("b", 1)["description"] == "app edit" and ws.store.patient("p0") is not None
    assert [i["image_id"] for i in ws.store.images()] == ["a", "b", "c"]
    got = import_dataset(ws, ds, prune=True, prefer="file")
    assert ws.store.wound("b", 1) is None and got["merge"]["conflict"] == 1


def test_prune_keeps_a_photo_with_an_outline_drawn_in_the_app(tmp_path):
    ws = Workspace(tmp_path / "ws")
    ds = full(tmp_path / "ds")
    import_dataset(ws, ds)
    ws.save_mask("c", labels(1))
    ws.store.upsert_wound("c", 1, 36, [2, 2, 8, 8], "drawn", {"origin": "drawn"}, actor="app")
    (ds / "images" / "c.png").unlink()
    (ds / "images.csv").write_text("image_id,patient_id,camera\na,p1,phone\nb,p1,\n")
    (ds / "triplets.csv").write_text(f"{TRIPLET_HEAD}\n")
    got = import_dataset(ws, ds, prune=True)
    assert got["merge"] == {**ZERO, "delete": 2, "not-in-file": 1}
    assert [i["image_id"] for i in ws.store.images()] == ["a", "b", "c"] and ws.store.wound("c", 1) is not None


def test_export_copies_the_truth_folder_and_writes_readable_json(tmp_path):
    ws = Workspace(tmp_path / "ws")
    import_dataset(ws, full(tmp_path / "ds"))
    (ws.truth_dir / "sub").mkdir(parents=True)
    (ws.truth_dir / "sub" / "t.json").write_text("{}")
    out = tmp_path / "out"
    export_dataset(ws, out)
    assert (out / "truth" / "sub" / "t.json").read_text() == "{}"
    info = json.loads((out / "dataset.json").read_text())
    assert (out / "dataset.json").read_text() == json.dumps(info, indent=2)


def test_merge_lines_name_file_line_field_and_both_values(tmp_path):
    ws = Workspace(tmp_path / "ws")
    ds = full(tmp_path / "ds")
    import_dataset(ws, ds)
    ws.store.upsert_patient("p2", {"age": 31}, actor="app")  # app only: kept
    ws.store.delete_wound("a", 2, actor="app")  # deleted in the app ...
    (ds / "wounds.csv").write_text("image_id,wound_index,description,site\n"
                                   "a,1,red,shin\na,2,new text,\nb,1,crust,arm\n")  # ... and changed in the dataset
    plan = validate_dataset(ds)
    merge = plan_merge(ws, plan)
    got = {(c.entity, c.field, c.action): c for c in merge.changes}
    assert set(got) == {("patients", "metadata", "keep-app"), ("wounds", "metadata", "update"),
                        ("wounds", "outline", "conflict")}
    keep = got[("patients", "metadata", "keep-app")]
    assert (keep.key, keep.where, keep.old, keep.new) == ("p2", "patients.csv: line 3", {"age": 31}, {"age": 30})
    update = got[("wounds", "metadata", "update")]
    assert (update.key, update.where, update.old, update.new) == \
        ({"image_id": "b", "wound_index": 1}, "wounds.csv: line 4", {}, {"site": "arm"})
    gone = got[("wounds", "outline", "conflict")]
    assert (gone.key, gone.where, gone.old, gone.resolved) == ({"image_id": "a", "wound_index": 2}, "masks/a.png",
                                                               None, None)
    assert gone.new["area"] == 48
    assert merge.rows["wounds"].get(key_json(wound_key("a", 2))) is None  # unresolved: not written
    kept = import_dataset(ws, ds, prefer="app")
    assert ws.store.wound("a", 2) is None and kept["merge"] == {**ZERO, "keep-app": 1, "update": 1, "conflict": 1}
    (ds / "wounds.csv").write_text("image_id,wound_index,description,site\n"
                                   "a,1,red,shin\na,2,newer text,\nb,1,crust,arm\n")
    import_dataset(ws, ds, prefer="file")
    assert ws.store.wound("a", 2)["description"] == "newer text"
