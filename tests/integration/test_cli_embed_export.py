"""``python -m core.embed`` (frozen baseline), ``python -m annotations export`` as real processes, and
the store refusing a database written by a newer TriDerm Studio."""
from __future__ import annotations

import hashlib
import json
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from annotations.infra.workspace import Workspace
from annotations.io.dataset import import_dataset
from annotations.store.store import MIGRATIONS, Store
from core.runtime import load_embeddings

REPO = Path(__file__).resolve().parents[2]


def cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *argv], cwd=REPO, capture_output=True, text=True, timeout=900,
                          check=False)


@pytest.fixture
def tiny_ws(tiny_phantom, imported) -> Workspace:
    return imported(tiny_phantom(5, 5, 2, 8, 30))


def test_embed_cli_writes_the_frozen_baseline_run(tiny_ws):
    out = cli("core.embed", "--workspace", str(tiny_ws.root))
    assert out.returncode == 0, out.stderr[-2000:]
    (run,) = tiny_ws.store.runs()
    assert run["kind"] == "vision-baseline" and run["status"] == "done"
    line = rf"^run {run['id']}: frozen efficientnet-lite0\S* mean-pool baseline → "
    assert re.search(line, out.stdout, re.MULTILINE), out.stdout
    emb = load_embeddings(tiny_ws, run["id"])
    wounds = tiny_ws.store.wounds()
    assert emb["wound_emb"].shape[0] == len(wounds) and np.isfinite(emb["wound_emb"]).all()
    # a photo's embedding is the mean of its wounds'
    for row, image_id in enumerate(emb["image_ids"]):
        own = [n for n, k in enumerate(emb["wound_keys"]) if k[0] == image_id]
        assert np.allclose(emb["image_emb"][row], emb["wound_emb"][own].mean(0), atol=1e-5)


@pytest.mark.parametrize(("argv", "message"), [
    (["--images", "x"], "--images needs --model"),
    (["--model", "1"], "no TriDerm-V (vision-triderm) run with that id"),
    (["--neighbours", "0"], "--neighbours must be ≥ 1"),
])
def test_embed_cli_bad_flags_exit_2_and_record_nothing(tiny_ws, argv, message):
    out = cli("core.embed", "--workspace", str(tiny_ws.root), *argv)
    assert out.returncode == 2 and message in out.stderr
    assert tiny_ws.store.runs() == []


def test_export_cli_writes_a_folder_that_imports_back(tiny_ws, tmp_path):
    out = cli("annotations", "export", str(tmp_path / "out"), "--workspace", str(tiny_ws.root))
    assert out.returncode == 0, out.stderr[-2000:]
    counts = tiny_ws.store.counts()
    summary = json.loads(out.stdout)
    assert summary == {"images": counts["images"], "patients": counts["patients"], "wounds": counts["wounds"],
                       "triplets": counts["expert_triplets"] + counts["llm_triplets"], "out": str(tmp_path / "out")}
    for image in tiny_ws.store.images():  # photos byte for byte
        exported = tmp_path / "out" / "images" / image["file"]
        assert hashlib.sha256(exported.read_bytes()).hexdigest() == image["sha256"]
    again = Workspace(tmp_path / "again")
    import_dataset(again, tmp_path / "out")
    assert again.store.counts() == counts
    assert [(w["image_id"], w["wound_index"], w["description"], w["area"]) for w in again.store.wounds()] == \
        [(w["image_id"], w["wound_index"], w["description"], w["area"]) for w in tiny_ws.store.wounds()]
    assert sorted((t["anchor"], t["ref_j"], t["ref_k"], t["choice"]) for t in again.store.expert_triplets()) == \
        sorted((t["anchor"], t["ref_j"], t["ref_k"], t["choice"]) for t in tiny_ws.store.expert_triplets())


def test_store_refuses_a_newer_schema_and_leaves_it_alone(tmp_path):
    path = tmp_path / "triderm.sqlite"
    Store(path).close()
    newer = len(MIGRATIONS) + 1
    with sqlite3.connect(path) as conn:
        conn.execute(f"PRAGMA user_version = {newer}")
    before = path.read_bytes()
    with pytest.raises(RuntimeError, match=rf"schema version {newer} is newer than this TriDerm Studio "
                                           rf"\({len(MIGRATIONS)}\); upgrade the software") as err:
        Store(path)
    assert str(path) in str(err.value)
    assert path.read_bytes() == before
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == newer
