"""Dataset import/export: counts, round trip, real Medetec data and every kind of bad input."""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from test_bad_inputs import small_dataset

from annotations.infra.workspace import Workspace
from annotations.io.dataset import export_dataset, import_dataset
from annotations.io.readers import DatasetError, mask_to_labels

ROOT = Path(__file__).resolve().parents[2]


def _snapshot(ws: Workspace) -> dict:
    """Everything a round trip must keep: store rows (without db ids) and mask pixels."""
    s = ws.store
    return {
        "images": [{k: v for k, v in r.items() if k != "file"} for r in s.images()],
        "patients": s.patients(),
        "wounds": [{k: v for k, v in r.items() if k != "id"} for r in s.wounds()],
        "triplets": [{k: v for k, v in r.items() if k != "id"} for r in s.triplets()],
        "masks": {r["image_id"]: hashlib.sha256(ws.load_mask(r["image_id"]).tobytes()).hexdigest()
                  for r in s.images()},
        "meta": (ws.dataset_name, ws.is_synthetic),
    }


def test_demo_import_counts_via_cli(demo_dataset, tmp_path):
    out = subprocess.run([sys.executable, "-m", "annotations", "import", str(demo_dataset),
                          "--workspace", str(tmp_path / "ws")], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    summary = json.loads(out.stdout)
    assert (summary["images"], summary["patients"], summary["wounds"], summary["triplets"]) == \
        (53, 21, 120, 513)
    assert summary["synthetic"] is True
    ws = Workspace(tmp_path / "ws")
    assert ws.store.counts()["expert_triplets"] == 513
    assert (ws.truth_dir).is_dir()


def test_reimport_is_idempotent(demo_workspace, demo_dataset):
    before = _snapshot(demo_workspace)
    summary = import_dataset(demo_workspace, demo_dataset)
    assert summary["new_triplets"] == 0
    assert _snapshot(demo_workspace) == before


def test_round_trip_is_lossless(demo_workspace, tmp_path):
    ws = demo_workspace
    ws.store.add_triplet(*[r["image_id"] for r in ws.store.images()[:3]], "k", "expert:alice",
                         latency_ms=812.25)
    ws.store.add_triplet(*[r["image_id"] for r in ws.store.images()[:3]], "j", "expert:alice",
                         latency_ms=401.5, rep=1)
    export_dataset(ws, tmp_path / "export")
    again = Workspace(tmp_path / "ws2")
    import_dataset(again, tmp_path / "export")
    assert _snapshot(again) == _snapshot(ws)
    export_dataset(again, tmp_path / "export2")
    for name in ("wounds.csv", "images.csv", "patients.csv", "triplets.csv"):
        assert (tmp_path / "export" / name).read_bytes() == (tmp_path / "export2" / name).read_bytes()


def test_medetec_imports_38_images_59_wounds_and_drops_one_speck(medetec_dir, tmp_path):
    ws = Workspace(tmp_path / "ws")
    summary = import_dataset(ws, medetec_dir)
    assert (summary["images"], summary["wounds"]) == (38, 59)  # README's 60 counts a 1-pixel speck
    assert [d["area"] for d in summary["dropped_wounds"]] == [1]
    assert summary["synthetic"] is False
    for w in ws.store.wounds():
        assert w["area"] > 0 and (ws.load_mask(w["image_id"]) == w["wound_index"]).sum() == w["area"]


def test_binary_masks_split_into_components():
    mask = np.zeros((10, 10, 3), np.uint8)
    mask[1:3, 1:3] = 255
    mask[6:9, 5:9] = 255
    labels = mask_to_labels(mask)
    assert sorted(np.unique(labels)) == [0, 1, 2]
    label_map = np.zeros((10, 10), np.uint8)
    label_map[1:3, 1:3] = 2
    label_map[6:9, 5:9] = 5
    assert sorted(np.unique(mask_to_labels(label_map))) == [0, 2, 5]


# ---- bad input: one clear error naming the file/row/field, nothing written ---------------------

def _corrupt_image(d):
    (d / "images" / "b.png").write_bytes(b"\x89PNG not really")


def _mask_size(d):
    Image.fromarray(np.zeros((21, 30), np.uint8)).save(d / "masks" / "b.png")


def _mask_unknown(d):
    Image.fromarray(np.zeros((20, 30), np.uint8)).save(d / "masks" / "zz.png")


def _append(name: str, row: str):
    """A spoiler that appends one CSV ``row`` to the dataset's ``name`` file."""
    def spoil(d):
        with (d / name).open("a") as fh:
            fh.write(row + "\n")
    return spoil


_missing_wound = _append("wounds.csv", "c,7,does not exist,")
_triplet_unknown = _append("triplets.csv", "a,b,nope,j,ann")
_triplet_repeat = _append("triplets.csv", "a,a,c,j,ann")
_bad_choice = _append("triplets.csv", "a,b,c,left,ann")


def _missing_column(d):
    (d / "wounds.csv").write_text("image_id,description\na,x\n")


def _not_utf8(d):
    (d / "wounds.csv").write_bytes("image_id,wound_index,description\na,1,\xe9rosion\n".encode("latin-1"))


def _odd_image_id(d):
    Image.fromarray(np.zeros((20, 30, 3), np.uint8)).save(d / "images" / "bad id!.png")


def _traversal_id(d):
    (d / "images.csv").write_text("image_id,patient_id\n../../etc/passwd,p1\n")


BAD = {
    "corrupt image": (_corrupt_image, "images/b.png"),
    "mask size": (_mask_size, "masks/b.png"),
    "mask for unknown image": (_mask_unknown, "masks/zz.png"),
    "missing wound index": (_missing_wound, "wounds.csv: line 5"),
    "triplet unknown image": (_triplet_unknown, "triplets.csv: line 4"),
    "triplet repeated image": (_triplet_repeat, "triplets.csv: line 4"),
    "bad choice": (_bad_choice, "triplets.csv: line 4"),
    "missing column": (_missing_column, "wounds.csv: missing required column(s) wound_index"),
    "non-UTF-8": (_not_utf8, "wounds.csv: line 2"),
    "odd characters": (_odd_image_id, "images/bad id!.png"),
    "path traversal": (_traversal_id, "images.csv: line 2"),
}


def test_small_dataset_imports(tmp_path):
    ws = Workspace(tmp_path / "ws")
    summary = import_dataset(ws, small_dataset(tmp_path / "d"))
    assert (summary["images"], summary["wounds"], summary["patients"], summary["triplets"]) == (3, 6, 2, 2)
    wound = ws.store.wounds("a")[0]
    assert wound["metadata"] == {"site": "shin"} and wound["bbox"] == [2, 2, 7, 7] and wound["area"] == 25
    assert ws.store.patients()[0]["metadata"] == {"age": 12, "sex": "f"}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_names_the_problem_and_writes_nothing(case, tmp_path):
    spoil, expected = BAD[case]
    d = small_dataset(tmp_path / "d")
    spoil(d)
    ws = Workspace(tmp_path / "ws")
    with pytest.raises(DatasetError) as err:
        import_dataset(ws, d)
    assert expected in str(err.value)
    assert ws.store.counts() == {k: 0 for k in ws.store.counts()}
    assert not any(ws.images_dir.iterdir()) and not any(ws.masks_dir.iterdir())


def test_cli_bad_input_exits_2_with_one_line(tmp_path):
    d = small_dataset(tmp_path / "d")
    _bad_choice(d)
    out = subprocess.run([sys.executable, "-m", "annotations", "import", str(d), "--workspace",
                          str(tmp_path / "ws")], check=False, cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.strip().startswith("error: triplets.csv: line 4: choice")
    assert "Traceback" not in out.stderr


def test_image_without_mask_imports_with_zero_wounds(tmp_path):
    d = small_dataset(tmp_path / "d")
    (d / "masks" / "c.png").unlink()
    ws = Workspace(tmp_path / "ws")
    import_dataset(ws, d)
    assert ws.store.wounds("c") == []
    assert ws.load_mask("c").shape == (20, 30) and ws.load_mask("c").max() == 0
