"""Store at scale: batched triplet inserts and the indexes of the scale migration."""
from __future__ import annotations

import pytest

from annotations.store.store import Store


@pytest.fixture
def store(tmp_path) -> Store:
    s = Store(tmp_path / "t.sqlite")
    for i in range(5):
        s.upsert_image(f"im{i}", f"im{i}.png", "0" * 64, 10, 10)
    return s


def row(a: str, j: str, k: str, choice: str = "j", source: str = "expert:ann", **extra) -> dict:
    return {"anchor": a, "ref_j": j, "ref_k": k, "choice": choice, "source": source, **extra}


def test_add_triplets_counts_new_rows_and_ignores_stored_ones(store):
    rows = [row("im0", "im1", "im2"), row("im1", "im2", "im3", "k", latency_ms=800.0), row("im2", "im3", "im4", rep=1)]
    assert store.add_triplets(rows) == 3
    assert store.add_triplets(rows + [row("im3", "im4", "im0", "skip", "llm:m")]) == 1
    stored = store.triplets()
    assert [(r["anchor"], r["choice"], r["rep"], r["latency_ms"]) for r in stored] == [
        ("im0", "j", 0, None), ("im1", "k", 0, 800.0), ("im2", "j", 1, None), ("im3", "skip", 0, None)]
    assert store.triplet_sources() == {"expert:ann": 3, "llm:m": 1}


@pytest.mark.parametrize("bad, message", [
    (row("im0", "im1", "im2", "x"), "triplet row 1: choice"),
    (row("im0", "im0", "im2"), "triplet row 1: a triplet needs three different images"),
])
def test_a_bad_row_names_its_index_and_stores_nothing(store, bad, message):
    with pytest.raises(ValueError, match=message):
        store.add_triplets([row("im1", "im2", "im3"), bad, row("im2", "im3", "im4")])
    assert store.triplets() == []


def test_add_triplets_joins_an_open_transaction_and_rolls_back_with_it(store):
    with pytest.raises(RuntimeError), store.transaction():
        assert store.add_triplets([row("im0", "im1", "im2")]) == 1
        raise RuntimeError("abort the import")
    assert store.triplets() == []


def test_scale_indexes_serve_photo_deletes_and_patient_lookups(store):
    plans = {sql: " ".join(r[-1] for r in store.db.execute("EXPLAIN QUERY PLAN " + sql).fetchall())
             for sql in ("SELECT id FROM triplets WHERE ref_k = 'im1'", "SELECT image_id FROM images WHERE patient_id = 'p'")}
    assert "triplets_ref_k" in plans["SELECT id FROM triplets WHERE ref_k = 'im1'"]
    # images_patient, or the follow-up's (patient_id, visit_date) index, whose prefix serves the same lookup
    assert "USING INDEX images_" in plans["SELECT image_id FROM images WHERE patient_id = 'p'"]
    assert "(patient_id=?)" in plans["SELECT image_id FROM images WHERE patient_id = 'p'"]
