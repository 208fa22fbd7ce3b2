"""Triplet scheduler: no repeats beyond the planned share under concurrency, every answer stored once."""
from __future__ import annotations

import math
import threading
from collections import Counter

import numpy as np
import pytest

from annotations.infra.workspace import Workspace
from annotations.scheduling.consistency import cohen_kappa, inter_annotator_kappa, self_consistency, triplet_key
from annotations.scheduling.scheduler import TripletScheduler

N_ANNOTATORS, PER_ANNOTATOR, REPEAT_SHARE = 8, 100, 0.1


def _draw_and_answer(root, name: str, n: int, seed: int, out: dict, errors: list) -> None:
    try:
        ws = Workspace(root)  # each annotator's own connection, as separate app sessions have
        sched = TripletScheduler(ws, name, repeat_share=REPEAT_SHARE, shared_share=0.2, seed=seed)
        rng = np.random.default_rng(seed)
        served, ids = [], []
        for _ in range(n):
            q = sched.next()
            assert q is not None
            served.append(q)
            ids.append(sched.answer(q, str(rng.choice(["j", "k", "skip"], p=[0.45, 0.45, 0.1]))))
        out[name] = (served, ids)
    except BaseException as err:  # surfaced in the main thread
        errors.append(err)


@pytest.mark.slow
def test_eight_annotators_concurrently(demo_workspace):
    root = demo_workspace.root
    before = len(demo_workspace.store.expert_triplets())
    out: dict = {}
    errors: list = []
    threads = [threading.Thread(target=_draw_and_answer, args=(root, f"ann{i}", PER_ANNOTATOR, i, out, errors))
               for i in range(N_ANNOTATORS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    rows = demo_workspace.store.expert_triplets()
    assert len(rows) - before == N_ANNOTATORS * PER_ANNOTATOR  # every judgment stored, once
    for i in range(N_ANNOTATORS):
        served, ids = out[f"ann{i}"]
        assert all(x is not None for x in ids) and len(set(ids)) == PER_ANNOTATOR
        keys = Counter(triplet_key(q.anchor, q.ref_j, q.ref_k) for q in served)
        repeats = sum(c - 1 for c in keys.values())
        assert max(keys.values()) <= 2
        assert repeats == sum(q.rep > 0 for q in served)
        assert repeats <= math.ceil(REPEAT_SHARE * PER_ANNOTATOR)
        assert repeats >= 1  # the planned repeats do happen
        for q in served:
            if q.rep > 0:  # a planned repeat is shown with the sides swapped
                first = next(p for p in served if p.rep == 0 and triplet_key(p.anchor, p.ref_j, p.ref_k)
                             == triplet_key(q.anchor, q.ref_j, q.ref_k))
                assert (q.ref_j, q.ref_k) == (first.ref_k, first.ref_j)
        mine = [r for r in rows if r["source"] == f"expert:ann{i}"]
        assert len(mine) == PER_ANNOTATOR and all(r["latency_ms"] is not None for r in mine)
    kappa = inter_annotator_kappa(rows)
    assert any(p["n"] > 0 for p in kappa["pairs"] if p["a"].startswith("ann"))
    sc = self_consistency(rows)
    assert all(sc[f"ann{i}"]["n"] >= 1 for i in range(N_ANNOTATORS))


def test_same_annotator_two_tabs_never_gets_the_same_triplet(demo_workspace):
    root = demo_workspace.root
    got: list = []
    lock = threading.Lock()

    def tab(seed: int) -> None:
        sched = TripletScheduler(Workspace(root), "dr_one", repeat_share=0.0, shared_share=0.0, seed=0)
        for _ in range(60):
            q = sched.next()
            with lock:
                got.append(triplet_key(q.anchor, q.ref_j, q.ref_k))

    threads = [threading.Thread(target=tab, args=(s,)) for s in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 180 and len(set(got)) == 180  # same seed in every tab, still no duplicate


def test_anchor_balance_and_exhaustion(tmp_path):
    from PIL import Image
    ws = Workspace(tmp_path / "ws")
    for n in range(5):
        Image.new("RGB", (8, 8)).save(ws.images_dir / f"p{n}.png")
        ws.store.upsert_image(f"p{n}", f"p{n}.png", "0" * 64, 8, 8)
    sched = TripletScheduler(ws, "solo", repeat_share=0.0, shared_share=0.0, seed=1)
    first = [sched.next() for _ in range(10)]
    assert sorted(Counter(q.anchor for q in first).values()) == [2, 2, 2, 2, 2]
    rest = [sched.next() for _ in range(20)]
    assert all(q is not None for q in rest) and sched.next() is None  # 5 × C(4,2) = 30 triplets
    assert len({triplet_key(q.anchor, q.ref_j, q.ref_k) for q in first + rest}) == 30


def test_active_mode_picks_smallest_margin(tmp_path):
    from PIL import Image
    ws = Workspace(tmp_path / "ws")
    ids = [f"p{n}" for n in range(6)]
    for i in ids:
        Image.new("RGB", (8, 8)).save(ws.images_dir / f"{i}.png")
        ws.store.upsert_image(i, f"{i}.png", "0" * 64, 8, 8)
    x = np.array([0.0, 1.0, 2.0, 4.0, 7.0, 11.0])
    D = np.abs(x[:, None] - x[None, :])
    sched = TripletScheduler(ws, "act", mode="active", distances=(ids, D), repeat_share=0, shared_share=0, seed=3)
    q = sched.next()
    i = ids.index(q.anchor)
    margins = [abs(D[i, a] - D[i, b]) / (D[i, a] + D[i, b]) for a in range(6) for b in range(a + 1, 6)
               if i not in (a, b)]
    j, k = ids.index(q.ref_j), ids.index(q.ref_k)
    assert abs(D[i, j] - D[i, k]) / (D[i, j] + D[i, k]) == pytest.approx(min(margins))
    with pytest.raises(ValueError, match="active mode needs distances"):
        TripletScheduler(ws, "act", mode="active")


def test_consistency_and_kappa():
    rows = [
        {"anchor": "a", "ref_j": "b", "ref_k": "c", "choice": "j", "source": "expert:x", "rep": 0},
        {"anchor": "a", "ref_j": "c", "ref_k": "b", "choice": "k", "source": "expert:x", "rep": 1},  # same answer
        {"anchor": "d", "ref_j": "b", "ref_k": "c", "choice": "j", "source": "expert:x", "rep": 0},
        {"anchor": "d", "ref_j": "c", "ref_k": "b", "choice": "j", "source": "expert:x", "rep": 1},  # flipped
        {"anchor": "a", "ref_j": "b", "ref_k": "c", "choice": "j", "source": "expert:y", "rep": 0},
        {"anchor": "d", "ref_j": "c", "ref_k": "b", "choice": "j", "source": "expert:y", "rep": 0},
        {"anchor": "a", "ref_j": "b", "ref_k": "c", "choice": "k", "source": "llm:m", "rep": 0},
    ]
    sc = self_consistency(rows)
    assert sc["x"]["n"] == 2 and sc["x"]["agree"] == 1 and sc["x"]["rate"] == 0.5
    assert math.isnan(sc["y"]["rate"])
    k = inter_annotator_kappa(rows)
    assert [(p["a"], p["b"], p["n"]) for p in k["pairs"]] == [("x", "y", 2)]
    assert k["pairs"][0]["agreement"] == 0.5  # on anchor a both chose b; on d x chose b, y chose c
    assert cohen_kappa([1, 1, 0, 0], [1, 1, 0, 0]) == pytest.approx(1.0)
    assert cohen_kappa([1, 0, 1, 0], [0, 1, 0, 1]) == pytest.approx(-1.0)
    assert math.isnan(cohen_kappa([1, 1], [1, 1]))
