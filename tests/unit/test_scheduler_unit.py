"""Triplet scheduler, unit level: small in-memory workspaces, a fake clock, hand-computed draws.

Fast companion of tests/integration/test_scheduler.py (whose concurrency tests are slow); every expected value
below is worked out by hand from the rules in annotations/scheduling/scheduler.py's docstring.
"""
from __future__ import annotations

import sqlite3
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest

from annotations.infra.workspace import Workspace
from annotations.scheduling import scheduler
from annotations.scheduling.consistency import triplet_key
from annotations.scheduling.scheduler import Question, TripletScheduler, annotators, combinations_count


@pytest.fixture
def clock(monkeypatch) -> list[float]:
    """The scheduler's time.time(): 1000.0, 1001.0, … (one step per call); returns the call log."""
    calls: list[float] = []

    def tick() -> float:
        calls.append(1000.0 + len(calls))
        return calls[-1]

    monkeypatch.setattr(scheduler, "time", SimpleNamespace(time=tick))
    return calls


def workspace(tmp_path, ids) -> Workspace:
    ws = Workspace(tmp_path / "ws")
    for i in ids:
        ws.store.upsert_image(i, f"{i}.png", "0" * 64, 8, 8)
    return ws


def sched(ws, name="me", **kw) -> TripletScheduler:
    kw = {"repeat_share": 0.0, "shared_share": 0.0, "seed": 0, **kw}
    return TripletScheduler(ws, name, **kw)


def key(q: Question) -> tuple[str, str, str]:
    return triplet_key(q.anchor, q.ref_j, q.ref_k)


def answer_each(s: TripletScheduler, choices: list[str]) -> list[Question]:
    """Draw one question per choice and answer it with that choice; the questions drawn."""
    got = []
    for choice in choices:
        q = s.next()
        got.append(q)
        s.answer(q, choice)
    return got


# -- construction -------------------------------------------------------------------------------
@pytest.mark.parametrize("kw, message", [
    ({"annotator": ""}, "annotator name must not be empty"),
    ({"annotator": "  "}, "annotator name must not be empty"),
    ({"repeat_share": -0.01}, r"repeat_share must be in \[0, 0.5\], got -0.01"),
    ({"repeat_share": 0.51}, r"repeat_share must be in \[0, 0.5\], got 0.51"),
    ({"repeat_gap": -1}, "repeat_gap must be ≥ 0, got -1"),
    ({"shared_share": -0.01}, r"shared_share must be in \[0, 0.9\], got -0.01"),
    ({"shared_share": 0.91}, r"shared_share must be in \[0, 0.9\], got 0.91"),
    ({"mode": "smart"}, r"mode must be one of \('random', 'active'\), got 'smart'"),
    ({"mode": "active"}, r"active mode needs distances=\(ids, D\) from an embedding run"),
    ({"distances": (["a", "b", "c"], np.zeros((2, 2)))}, r"distance matrix shape \(2, 2\) does not match 3 ids"),
    ({"distances": (["a", "b"], np.zeros((2, 3)))}, r"distance matrix shape \(2, 3\) does not match 2 ids"),
])
def test_bad_arguments_raise_one_clear_error_and_register_nothing(tmp_path, kw, message):
    ws = workspace(tmp_path, "abc")
    kw = {"annotator": "dr", **kw}
    with pytest.raises(ValueError, match=f"^{message}$"):
        TripletScheduler(ws, **kw)
    assert ws.store.annotators() == []
    assert not (ws.cache_dir / "scheduler.sqlite").exists()


def test_boundary_shares_are_accepted_and_the_settings_kept(tmp_path):
    ws = workspace(tmp_path, "abc")
    s = TripletScheduler(ws, "  dr x  ", repeat_share=0.5, shared_share=0.9, candidates=7, seed=1)
    assert (s.annotator, s.source, s.repeat_share, s.shared_share, s.mode, s.candidates) == \
        ("dr x", "expert:dr x", 0.5, 0.9, "random", 7)
    assert ws.store.annotators() == ["dr x"]
    assert s.lease_path == ws.cache_dir / "scheduler.sqlite"
    con = sqlite3.connect(s.lease_path)
    names = {r[0] for r in con.execute("SELECT name FROM sqlite_master")}
    con.close()
    assert {"served", "served_rep_anchor"} <= names
    t = TripletScheduler(ws, "z", repeat_share=0.0, shared_share=0.0)
    assert (t.repeat_share, t.shared_share, t.candidates) == (0.0, 0.0, 256)
    u = TripletScheduler(ws, "y")
    assert (u.repeat_share, u.shared_share, u.mode) == (0.1, 0.2, "random")


# -- drawing: leases, exhaustion, anchor balance --------------------------------------------------
def test_fewer_than_three_photos_give_no_question(tmp_path, clock):
    assert sched(workspace(tmp_path, "ab")).next() is None
    assert clock == []


def test_three_photos_give_three_triplets_then_none_and_each_lease_is_recorded(tmp_path, clock):
    s = sched(workspace(tmp_path, "abc"))
    got = [s.next() for _ in range(3)]
    assert s.next() is None
    assert sorted(key(q) for q in got) == [("a", "b", "c"), ("b", "a", "c"), ("c", "a", "b")]
    assert [q.served_at for q in got] == [1000.0, 1001.0, 1002.0]
    assert all(q.rep == 0 and q.kind == "new" for q in got)
    served = s.served()
    assert [(r["annotator"], r["anchor"], r["ref_j"], r["ref_k"], r["rep"], r["kind"], r["served_at"])
            for r in served] == [("me", q.anchor, q.ref_j, q.ref_k, 0, "new", q.served_at) for q in got]
    assert all((r["ref_a"], r["ref_b"]) == tuple(sorted((r["ref_j"], r["ref_k"]))) for r in served)


def test_served_lists_only_this_annotator_oldest_first(tmp_path, clock):
    ws = workspace(tmp_path, "abcd")
    me, other = sched(ws, "me"), sched(ws, "other")
    order = [me.next(), other.next(), me.next()]
    assert [r["served_at"] for r in me.served()] == [order[0].served_at, order[2].served_at]
    assert [r["annotator"] for r in other.served()] == ["other"]


def test_two_schedulers_of_one_annotator_share_the_leases(tmp_path, clock):
    ws = workspace(tmp_path, "abc")
    tab1, tab2 = sched(ws, seed=5), sched(ws, seed=5)
    got = [tab1.next(), tab2.next(), tab1.next()]
    assert len({key(q) for q in got}) == 3
    assert tab2.next() is None and tab1.next() is None


def test_four_photos_exhaust_after_twelve_with_anchors_balanced(tmp_path, clock):
    s = sched(workspace(tmp_path, "abcd"), seed=2)
    got = [s.next() for _ in range(12)]
    assert s.next() is None
    assert len({key(q) for q in got}) == 12 == combinations_count(4)
    for block in range(3):  # anchors with the fewest questions go first: each block of 4 has every anchor
        assert sorted(q.anchor for q in got[4 * block: 4 * block + 4]) == ["a", "b", "c", "d"]


def test_anchor_load_counts_other_annotators_leases(tmp_path, clock):
    ws = workspace(tmp_path, "abcd")
    first = sched(ws, "one", seed=1)
    anchors = {first.next().anchor for _ in range(3)}
    assert len(anchors) == 3
    assert sched(ws, "two", seed=9).next().anchor == ({"a", "b", "c", "d"} - anchors).pop()


def test_answers_given_outside_the_scheduler_count_as_seen(tmp_path, clock):
    ws = workspace(tmp_path, "abc")
    ws.store.add_triplet("a", "c", "b", "j", "expert:me")  # reversed reference order on purpose
    ws.store.add_triplet("b", "a", "c", "k", "expert:someone")  # another annotator's: not seen by me
    s = sched(ws)
    got = {key(s.next()), key(s.next())}
    assert got == {("b", "a", "c"), ("c", "a", "b")}
    assert s.next() is None


def test_both_orientations_are_served(tmp_path, clock):
    s = sched(workspace(tmp_path, "abcdef"), seed=4)
    got = [s.next() for _ in range(40)]
    ordered = Counter(q.ref_j < q.ref_k for q in got)
    assert ordered[True] >= 8 and ordered[False] >= 8  # Binomial(40, 1/2): P(< 8) ≈ 1e-5 each side


def test_a_failing_draw_rolls_back_and_keeps_its_error(tmp_path, clock, monkeypatch):
    s = sched(workspace(tmp_path, "abc"))

    def boom(con, image_ids):
        con.execute("INSERT INTO served VALUES ('me','a','b','c',0,'new','b','c',1.0)")
        raise KeyError("boom")

    monkeypatch.setattr(s, "_choose", boom)
    with pytest.raises(KeyError, match="boom"):
        s.next()
    assert s.served() == []


def test_a_lease_is_held_in_an_immediate_transaction(tmp_path, clock, monkeypatch):
    s = sched(workspace(tmp_path, "abc"))
    states = []
    real = s._choose

    def spy(con, image_ids):
        states.append(con.in_transaction)
        other = sqlite3.connect(s.lease_path, timeout=0)
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            other.execute("BEGIN IMMEDIATE")
        other.close()
        return real(con, image_ids)

    monkeypatch.setattr(s, "_choose", spy)
    q = s.next()
    assert states == [True] and q is not None
    other = sqlite3.connect(s.lease_path, timeout=0)
    other.execute("BEGIN IMMEDIATE")  # released after the draw
    other.execute("ROLLBACK")
    other.close()


# -- planned repeats ------------------------------------------------------------------------------
def test_planned_repeats_start_after_five_and_swap_the_sides(tmp_path, clock):
    s = sched(workspace(tmp_path, "abcd"), repeat_share=0.5, repeat_gap=5, seed=3)
    got = answer_each(s, ["j"] * 9)
    # draws 1-6: every earlier answer is among the 5 most recent, so nothing to repeat
    assert [q.kind for q in got] == ["new"] * 6 + ["repeat"] * 3
    for n, q in enumerate(got[6:]):  # draw 7 repeats draw 1 (the only one outside the recent five), …
        first = got[n]
        assert (q.anchor, q.ref_j, q.ref_k, q.rep) == (first.anchor, first.ref_k, first.ref_j, 1)
    assert s.progress() == {"answered": 9, "skips": 0, "repeats": 3}


def test_repeats_are_swapped_never_repeated_twice_and_seeded(tmp_path, clock):
    def run(root, seed: int) -> list[Question]:
        return answer_each(sched(workspace(root, "abcde"), repeat_share=0.5, repeat_gap=5, seed=seed), ["k"] * 40)

    got = run(tmp_path / "one", 7)
    repeats = [q for q in got if q.kind == "repeat"]
    assert len(repeats) >= 10 and all(q.rep == 1 for q in repeats)
    assert max(Counter(key(q) for q in got).values()) == 2
    for q in repeats:
        first = next(p for p in got if p.rep == 0 and key(p) == key(q))
        assert (q.ref_j, q.ref_k) == (first.ref_k, first.ref_j)
    same = run(tmp_path / "two", 7)
    assert [(q.anchor, q.ref_j, q.ref_k, q.kind) for q in same] == [(q.anchor, q.ref_j, q.ref_k, q.kind) for q in got]
    other = run(tmp_path / "three", 8)
    assert [(q.anchor, q.ref_j, q.ref_k) for q in other] != [(q.anchor, q.ref_j, q.ref_k) for q in got]


def test_repeats_follow_the_share_and_skip_skips(tmp_path, clock):
    s = sched(workspace(tmp_path, "abcd"), repeat_share=0.1, repeat_gap=5, seed=3)
    got = answer_each(s, ["skip"] + ["j"] * 11)
    # 0 repeats < 0.1 * total from total 1 on, but draw 1 was skipped and later ones are recent until draw 8
    assert [q.kind for q in got[:7]] == ["new"] * 7
    assert (got[7].kind, key(got[7])) == ("repeat", key(got[1]))
    # 1 repeat < 0.1 * total only from total 11: draws 9-11 are new, draw 12 repeats one of draws 3-6
    # (not 1: skipped, not 2: repeated already, not 7-11: the recent five)
    assert [q.kind for q in got[8:11]] == ["new"] * 3
    assert got[11].kind == "repeat" and key(got[11]) in {key(q) for q in got[2:6]}


def test_a_planned_repeat_comes_back_only_after_twenty_other_questions_by_default(tmp_path, clock):
    s = sched(workspace(tmp_path, "abcdefg"), repeat_share=0.5, seed=3)
    assert s.repeat_gap == 20
    got = answer_each(s, ["j"] * 60)
    repeats = [n for n, q in enumerate(got) if q.kind == "repeat"]
    assert repeats and repeats[0] == 21  # draws 1-21 new: draw 1 is outside the 20 most recent only at draw 22
    for n in repeats:
        first = next(m for m, p in enumerate(got) if p.rep == 0 and key(p) == key(got[n]))
        assert n - first > 20, (n, first)


def test_undo_takes_back_the_newest_answer_from_the_store(tmp_path, clock):
    ws = workspace(tmp_path, "abcde")
    s = sched(ws)
    first, second = answer_each(s, ["j", "k"])
    assert s.has_answer_since("")
    again = sched(ws).undo_last("")  # a new scheduler, as after a page reload
    assert (again.anchor, again.ref_j, again.ref_k, again.kind) == (second.anchor, second.ref_j, second.ref_k, "new")
    assert [(r["anchor"], r["choice"]) for r in ws.store.triplets(source="expert:me")] == [(first.anchor, "j")]
    assert s.undo_last("9999") is None and not s.has_answer_since("9999")  # nothing that recent
    assert s.undo_last("") is not None and s.undo_last("") is None and not s.has_answer_since("")


def test_no_repeats_when_the_share_is_zero(tmp_path, clock):
    s = sched(workspace(tmp_path, "abcd"), seed=3)
    for _ in range(12):
        q = s.next()
        assert q.kind == "new"
        s.answer(q, "k")
    assert s.next() is None


def test_repeats_need_answers_not_just_leases(tmp_path, clock):
    s = sched(workspace(tmp_path, "abcd"), repeat_share=0.5, seed=3)
    assert [s.next().kind for _ in range(12)] == ["new"] * 12  # nothing answered: nothing to repeat


# -- shared questions ------------------------------------------------------------------------------
def shared_workspace(tmp_path) -> Workspace:
    ws = workspace(tmp_path, "abcde")
    add = ws.store.add_triplet
    add("a", "b", "c", "j", "expert:x")
    add("a", "c", "b", "k", "expert:y")  # the same triplet: shared by 2
    add("d", "e", "c", "k", "expert:x")  # shared by 1
    add("e", "a", "b", "skip", "expert:x")  # skips are not shared
    add("e", "a", "b", "skip", "expert:y")
    add("b", "c", "d", "j", "expert:y", rep=1)  # nor planned repeats
    add("b", "c", "d", "k", "expert:x", rep=1)
    for model in "mno":  # nor LLM answers
        add("c", "a", "e", "j", f"llm:{model}")
    return ws


def test_shared_questions_go_most_shared_first(tmp_path, clock):
    ws = shared_workspace(tmp_path)
    s = sched(ws, shared_share=0.9, seed=1)
    first = s.next()
    assert first.kind == "new"  # 0 shared < 0.9 × 0 is false: the first question is new
    s.answer(first, "j")
    expected = [k for k in [("a", "b", "c"), ("d", "c", "e")] if k != key(first)]
    got = []
    for _ in expected:
        q = s.next()
        got.append(q)
        s.answer(q, "k")
    assert [(key(q), q.kind, q.rep) for q in got] == [(k, "shared", 0) for k in expected]
    assert s.next().kind == "new"  # nothing left to share


def test_shared_ranking_is_recounted_when_others_answer(tmp_path, clock):
    ws = shared_workspace(tmp_path)
    s = sched(ws, shared_share=0.9, seed=1)
    s.answer(s.next(), "j")
    assert s.next().kind == "shared"  # ranks the shared triplets; left unanswered
    for who in ("x", "y", "z"):  # now shared by 3: first in line
        ws.store.add_triplet("b", "e", "d", "j", f"expert:{who}")
    q = s.next()
    assert (key(q), q.kind) == (("b", "d", "e"), "shared")


def tied_first_shared(root, seed: int) -> tuple[str, str, str]:
    """The first shared question when five triplets are each answered by one other annotator (all tied)."""
    ws = workspace(root, "abcde")
    for anchor in "abcde":
        ws.store.add_triplet(anchor, *sorted(set("abcde") - {anchor})[:2], "j", "expert:x")
    s = sched(ws, shared_share=0.9, seed=seed)
    first = s.next()
    s.answer(first, "j")
    q = s.next()
    assert q.kind == "shared"
    return key(q)


def test_ties_among_shared_triplets_are_in_a_seeded_random_order(tmp_path, clock):
    firsts = [tied_first_shared(tmp_path / str(seed), seed) for seed in range(8)]
    assert tied_first_shared(tmp_path / "again", 5) == firsts[5]  # seeded
    assert len(set(firsts)) >= 3  # 8 seeds over 5 tied triplets: a fixed order would give 1 or 2


def test_shared_share_zero_never_shares(tmp_path, clock):
    ws = shared_workspace(tmp_path)
    s = sched(ws, seed=1)
    for _ in range(6):
        q = s.next()
        assert q.kind == "new"
        s.answer(q, "j")


def test_shared_questions_respect_the_share(tmp_path, clock):
    ws = shared_workspace(tmp_path)
    s = sched(ws, shared_share=0.2, seed=1)
    kinds = []
    for _ in range(6):
        q = s.next()
        kinds.append(q.kind)
        s.answer(q, "j")
    # shared < 0.2 × total: total 1 → 0 < 0.2 shared; then 1 < 0.2 × n only from n = 6
    assert kinds[:2] == ["new", "shared"]
    assert kinds[2:6] == ["new"] * 4


# -- active mode -----------------------------------------------------------------------------------
X = np.array([0.0, 1.0, 3.0, 7.0])  # p0..p3 on a line; D = |xi - xj|
IDS = ["p0", "p1", "p2", "p3"]
# per anchor, its reference pairs by increasing margin |d(i,j) - d(i,k)| / (d(i,j) + d(i,k)), by hand:
ACTIVE_ORDER = {
    "p0": [("p2", "p3"), ("p1", "p2"), ("p1", "p3")],  # 4/10, 2/4, 6/8
    "p1": [("p0", "p2"), ("p2", "p3"), ("p0", "p3")],  # 1/3, 4/8, 5/7
    "p2": [("p0", "p3"), ("p0", "p1"), ("p1", "p3")],  # 1/7, 1/5, 2/6
    "p3": [("p0", "p1"), ("p1", "p2"), ("p0", "p2")],  # 1/13, 2/10, 3/11
}


def test_active_mode_serves_each_anchor_its_pairs_by_increasing_margin(tmp_path, clock):
    D = np.abs(X[:, None] - X[None, :])
    s = sched(workspace(tmp_path, IDS), mode="active", distances=(IDS, D), seed=6)
    got: dict[str, list] = {i: [] for i in IDS}
    for _ in range(12):
        q = s.next()
        got[q.anchor].append(tuple(sorted((q.ref_j, q.ref_k))))
    assert got == ACTIVE_ORDER
    assert s._margin("p2", "p0", "p3") == pytest.approx(1 / 7)
    assert s._margin("p0", "p3", "p2") == pytest.approx(4 / 10)
    small = sched(workspace(tmp_path / "small", IDS), mode="active", distances=(IDS, D / 20))
    assert small._margin("p0", "p1", "p2") == pytest.approx(2 / 4)  # total distance 0.2: still a margin


def test_active_mode_with_zero_distances_and_partial_coverage(tmp_path, clock):
    ids = ["p0", "p1", "p2", "p3", "p4"]
    s = sched(workspace(tmp_path, ids), mode="active", distances=(ids[1:], np.zeros((4, 4))), seed=2)
    assert s._margin("p1", "p2", "p3") == 0.0
    got = [s.next() for _ in range(30)]  # p0 has no embedding: pairs with it are random, never a KeyError
    assert None not in got and len({key(q) for q in got}) == 30 and s.next() is None


def test_active_mode_scores_every_pair_when_few_remain(tmp_path, clock):
    ids = ["p0", "p1", "p2", "p3", "p4", "p5"]
    x = np.array([0.0, 1.0, 3.0, 7.0, 15.0, 31.0])
    D = np.abs(x[:, None] - x[None, :])
    s = sched(workspace(tmp_path, ids), mode="active", distances=(ids, D), candidates=2, seed=1)
    served: dict[str, set] = {i: set() for i in ids}
    checked = 0
    for _ in range(60):
        q = s.next()
        i = ids.index(q.anchor)
        left = [(a, b) for a in range(6) for b in range(a + 1, 6) if i not in (a, b)
                and (ids[a], ids[b]) not in served[q.anchor]]
        pair = tuple(sorted((q.ref_j, q.ref_k)))
        if len(left) <= 4 * 2:  # few left (<= 4 × candidates): every one is scored, the smallest margin served
            best = min(left, key=lambda p: (abs(D[i, p[0]] - D[i, p[1]]) / (D[i, p[0]] + D[i, p[1]]), p))
            assert pair == (ids[best[0]], ids[best[1]]), (q.anchor, len(left))
            checked += 1
        served[q.anchor].add(pair)
    assert checked == 6 * 8 and s.next() is None


def test_active_mode_with_few_candidates_still_serves_unseen_pairs(tmp_path, clock):
    ids = [f"p{n}" for n in range(6)]
    x = np.arange(6.0) ** 2
    s = sched(workspace(tmp_path, ids), mode="active", distances=(ids, np.abs(x[:, None] - x[None, :])),
              candidates=2, seed=2)
    got = [s.next() for _ in range(6 * 10)]
    assert None not in got and len({key(q) for q in got}) == 60 and s.next() is None


def test_random_mode_ignores_distances(tmp_path, clock):
    D = np.abs(X[:, None] - X[None, :])
    picks = set()
    for seed in range(12):
        ws = Workspace(tmp_path / f"ws{seed}")
        ws.store.upsert_image("p0", "p0.png", "0" * 64, 8, 8)
        for i in IDS[1:]:
            ws.store.upsert_image(i, f"{i}.png", "0" * 64, 8, 8)
        q = sched(ws, distances=(IDS, D), seed=seed).next()
        picks.add((q.anchor, tuple(sorted((q.ref_j, q.ref_k)))))
    assert not picks <= {(a, pairs[0]) for a, pairs in ACTIVE_ORDER.items()}


# -- answering --------------------------------------------------------------------------------------
def test_answer_stores_choice_rep_and_latency(tmp_path, clock):
    ws = workspace(tmp_path, "abc")
    s = sched(ws)
    q = Question("a", "c", "b", 1, "repeat", 50.0)
    tid = s.answer(q, "k", answered_at=51.2344, actor="acct")
    row = ws.store.triplets(source="expert:me")[0]
    assert tid == row["id"]
    assert {k: row[k] for k in ("anchor", "ref_j", "ref_k", "choice", "rep", "latency_ms")} == \
        {"anchor": "a", "ref_j": "c", "ref_k": "b", "choice": "k", "rep": 1, "latency_ms": 1234}
    assert ws.store.revisions("triplets")[-1]["actor"] == "acct"
    assert s.answer(q, "k", answered_at=60.0) is None  # the same judgment is stored once


def test_answer_latency_defaults_to_now_and_is_never_negative(tmp_path, clock):
    ws = workspace(tmp_path, "abcd")
    s = sched(ws)
    s.answer(Question("a", "b", "c", 0, "new", 998.5), "j")  # now = 1000.0
    s.answer(Question("b", "a", "c", 0, "new", 2000.0), "skip", answered_at=1999.0)
    assert [r["latency_ms"] for r in ws.store.triplets(source="expert:me")] == [1500, 0]
    assert ws.store.revisions("triplets")[0]["actor"] == "expert:me"
    ws.store.add_triplet("c", "a", "b", "skip", "expert:other", rep=1)
    assert s.progress() == {"answered": 2, "skips": 1, "repeats": 0}


@pytest.mark.parametrize("choice", ["J", "left", "", None])
def test_answer_rejects_other_choices(tmp_path, clock, choice):
    ws = workspace(tmp_path, "abc")
    with pytest.raises(ValueError, match=rf"^choice must be 'j', 'k' or 'skip', got {choice!r}$"):
        sched(ws).answer(Question("a", "b", "c", 0, "new", 1.0), choice)
    assert ws.store.triplets() == []


# -- helpers ---------------------------------------------------------------------------------------
def test_annotators_lists_expert_names_sorted_once(tmp_path):
    ws = workspace(tmp_path, "abcd")
    for anchor, source in [("a", "expert:zoe"), ("b", "expert:adam"), ("c", "expert:zoe"), ("d", "llm:m")]:
        ws.store.add_triplet(anchor, *sorted(set("abcd") - {anchor})[:2], "j", source)
    assert annotators(ws.store) == ["adam", "zoe"]
    assert annotators(workspace(tmp_path / "empty", "").store) == []


@pytest.mark.parametrize("n, count", [(0, 0), (1, 0), (2, 0), (3, 3), (4, 12), (5, 30), (10, 360)])
def test_combinations_count(n, count):
    assert combinations_count(n) == count
