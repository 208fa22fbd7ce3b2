"""The streamed import: judgments beyond one 5,000-row batch (reps numbered across batches, the
first duplicate named, a re-import merged row by row), photos spooled instead of held."""
from __future__ import annotations

import csv
import hashlib
import itertools
import shutil
from pathlib import Path

import pytest

from annotations.infra.workspace import Workspace
from annotations.io.dataset import TripletTable, import_dataset, validate_dataset
from annotations.io.readers import DatasetError

ROWS = 2 * TripletTable.BATCH + 7


def _with_triplets(src: Path, dst: Path, rows: list[list[str]]) -> Path:
    shutil.copytree(src, dst)
    with (dst / "triplets.csv").open("w", newline="") as fh:
        csv.writer(fh).writerows([["anchor", "ref_j", "ref_k", "choice", "annotator"], *rows])
    return dst


@pytest.fixture
def many(tiny_phantom, tmp_path) -> tuple[Path, list[list[str]]]:
    data = tiny_phantom(2, 5, 2, 6, 0)
    ids = sorted(p.stem for p in (data / "images").iterdir())
    orders = list(itertools.permutations(ids, 3))  # 60 ordered triples, each repeated ~170 times
    rows = [[*orders[n % len(orders)], "jk"[n % 2], "ann"] for n in range(ROWS)]
    return _with_triplets(data, tmp_path / "ds", rows), rows


def test_judgments_across_batches_are_numbered_merged_and_reported_in_order(many, tmp_path):
    data, rows = many
    ws = Workspace(tmp_path / "ws")
    summary = import_dataset(ws, data)
    assert summary["triplets"] == summary["new_triplets"] == ROWS
    stored = ws.store.triplets()
    assert [(t["anchor"], t["ref_j"], t["ref_k"], t["choice"]) for t in stored] == [tuple(r[:4]) for r in rows]
    assert [t["rep"] for t in stored] == [n // 60 for n in range(ROWS)]  # earlier rows of the same judgment
    inserts = [c for c in summary["changes"] if "judgment" in c]
    assert len(inserts) == ROWS and inserts[0].startswith("triplets.csv: line 2: judgment ")
    assert inserts[-1].startswith(f"triplets.csv: line {ROWS + 1}: ")

    again = import_dataset(ws, data)
    assert again["new_triplets"] == 0 and not [c for c in again["changes"] if "judgment" in c]

    line = TripletTable.BATCH + 3  # a row of the second batch changes its choice in the dataset
    rows[line - 2][3] = "skip"
    changed = _with_triplets(data, tmp_path / "changed", rows)
    third = import_dataset(ws, changed)
    assert [c for c in third["changes"] if "judgment" in c] == [
        next(c for c in third["changes"] if c.startswith(f"triplets.csv: line {line}: "))]
    assert third["merge"]["update"] == 1 and len(ws.store.triplets()) == ROWS
    assert [t["choice"] for t in ws.store.triplets() if t["choice"] == "skip"] == ["skip"]


def test_the_first_duplicate_judgment_is_named_and_nothing_is_imported(many, tmp_path):
    data, rows = many
    dup = TripletTable.BATCH + 43  # the same judgment as row 3 (43 + 5,000 ≡ 3 mod 60), given its rep 0
    rows = [r + ["0" if n == dup else str(n // 60)] for n, r in enumerate(rows)]
    with (data / "triplets.csv").open("w", newline="") as fh:
        csv.writer(fh).writerows([["anchor", "ref_j", "ref_k", "choice", "annotator", "rep"], *rows])
    ws = Workspace(tmp_path / "ws")
    with pytest.raises(DatasetError, match=rf"triplets.csv: the judgment \('{rows[3][0]}', '{rows[3][1]}', "
                                           rf"'{rows[3][2]}'\) by expert:ann with rep 0 is listed twice"):
        import_dataset(ws, data)
    assert ws.store.images() == [] and ws.store.triplets() == []
    assert [p.name for p in ws.root.iterdir() if p.name.startswith(".import-")] == []


def test_photos_are_spooled_not_held(tiny_phantom, tmp_path):
    plan = validate_dataset(tiny_phantom(2, 5, 2, 6, 0), spool=tmp_path / "spool")
    try:
        for img in plan.images.values():
            assert img.photo.data == b"" and hashlib.sha256(img.spooled.read_bytes()).hexdigest() == img.sha256
        assert all("png" in w["outline"] for w in plan.wounds.values())
    finally:
        plan.triplets.close()
