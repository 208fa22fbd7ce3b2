"""Triplet scheduler for expert annotators.

Serves "is the query more like the left or the right photo?" questions so that

* an annotator never sees the same triplet (anchor + unordered reference pair) twice, except
  for *planned repeats*: a configurable share of the questions re-asks an earlier answered
  triplet with the sides swapped, to measure self-consistency, only once at least ``repeat_gap``
  (default 20) other questions were served since, so the first answer cannot be remembered;
* a configurable share of the questions re-asks triplets that *other* annotators answered, so
  inter-annotator κ has shared items;
* anchors are balanced: new questions go to the anchor with the fewest questions so far;
* in ``active`` mode (once an embedding run exists) the references are the candidate pair with
  the smallest relative distance margin under that run's distances — the most informative
  question for that embedding.

Every question served is leased in a small SQLite file next to the store
(``<workspace>/cache/scheduler.sqlite``) inside an ``IMMEDIATE`` transaction, so any number of
threads, processes or browser tabs drawing at once never hand the same triplet to the same
annotator twice. Answers go to the store, whose unique key stores each judgment once.

At registry scale (a million judgments stored) a draw reads only this annotator's answers (the
store's ``(source, …)`` key), counts other annotators' answers in SQL over the ``expert:`` key
range, and only when a shared question is due, and counts anchor load on an index of the leases.
"""

from __future__ import annotations

import math
import random
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from annotations.scheduling.consistency import annotator_of, triplet_key

MODES = ("random", "active")
KINDS = ("new", "repeat", "shared")


@dataclass(frozen=True)
class Question:
    """One served triplet: show ``anchor`` as the query, ``ref_j`` left and ``ref_k`` right."""

    anchor: str
    ref_j: str
    ref_k: str
    rep: int
    kind: str  # one of KINDS
    served_at: float  # time.time() when served, for answer latency


class TripletScheduler:
    """Draws triplets for one annotator from a workspace's photos.

    Parameters
    ----------
    ws : Workspace
        The workspace (its store holds images and answers; its cache dir holds the leases).
    annotator : str
        Annotator name; answers are stored with source ``expert:<annotator>``.
    repeat_share : float in [0, 0.5]
        Share of questions that are planned repeats of this annotator's earlier answers.
    repeat_gap : int ≥ 0
        A triplet comes back as a planned repeat only after this many other questions were served
        to the annotator since it was first served (default 20: too many to remember the answer).
    shared_share : float in [0, 0.9]
        Share of questions taken from triplets other annotators answered (for κ).
    mode : "random" | "active"
        How references are chosen for new questions.
    distances : (ids, D) or None
        Image ids and their n×n distance matrix from an embedding run; required for ``active``.
    candidates : int
        Unseen reference pairs scored per active question.
    seed : int or None
        Seed of this scheduler's random generator.
    """

    def __init__(
        self,
        ws: Any,
        annotator: str,
        repeat_share: float = 0.1,
        repeat_gap: int = 20,
        shared_share: float = 0.2,
        mode: str = "random",
        distances: tuple[Sequence[str], np.ndarray] | None = None,
        candidates: int = 256,
        seed: int | None = None,
    ) -> None:
        if not annotator or not annotator.strip():
            raise ValueError("annotator name must not be empty")
        if not 0.0 <= repeat_share <= 0.5:
            raise ValueError(f"repeat_share must be in [0, 0.5], got {repeat_share}")
        if repeat_gap < 0:
            raise ValueError(f"repeat_gap must be ≥ 0, got {repeat_gap}")
        if not 0.0 <= shared_share <= 0.9:
            raise ValueError(f"shared_share must be in [0, 0.9], got {shared_share}")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if mode == "active" and distances is None:
            raise ValueError("active mode needs distances=(ids, D) from an embedding run")
        self.ws = ws
        self.annotator = annotator.strip()
        self.source = f"expert:{self.annotator}"
        self.repeat_share = repeat_share
        self.repeat_gap = int(repeat_gap)
        self.shared_share = shared_share
        self.mode = mode
        self.candidates = candidates
        self._rng = random.Random(seed)
        # read only in active mode, which needs distances, and then they set both
        self._dist: dict[str, int] = {}  # pragma: no mutate
        self._D: np.ndarray | None = None  # pragma: no mutate (the same)
        self._shared_count: int | None = None  # others' answer count when _shared_keys were ranked
        self._shared_keys: list[tuple] = []
        if distances is not None:
            ids, D = distances
            D = np.asarray(D,
                           dtype=float,  # pragma: no mutate (numeric matrices give the same margins without it)
                           )
            if D.shape != (len(ids), len(ids)):
                raise ValueError(f"distance matrix shape {D.shape} does not match {len(ids)} ids")
            self._dist = {str(i): n for n, i in enumerate(ids)}
            self._D = D
        ws.store.add_annotator(self.annotator)
        self.lease_path = Path(ws.cache_dir) / "scheduler.sqlite"
        self.leases = ws.store.lease_file(self.lease_path)
        self.leases.create()

    # -- leases -------------------------------------------------------------------------
    def served(self) -> list[dict[str, Any]]:
        """Every question served to this annotator, oldest first."""
        return self.leases.served(self.annotator)

    # -- drawing ------------------------------------------------------------------------
    def next(self) -> Question | None:
        """Lease and return the next question, or None when every triplet has been served."""
        image_ids = self.ws.store.image_ids()
        if len(image_ids) < 3:
            return None
        with self.leases.leasing() as con:
            question = self._choose(con, image_ids)
            if question is not None:
                a, b = sorted((question.ref_j, question.ref_k))
                self.leases.lease(con, self.annotator, question.anchor, a, b, question.rep, question.kind,
                                  question.ref_j, question.ref_k, question.served_at)
        return question

    def _choose(self, con: Any, image_ids: list[str]) -> Question | None:
        """The next question for this annotator, its leases read in the open lease transaction ``con``."""
        mine = self.leases.leased(con, self.annotator)
        seen = {(r[0], r[1], r[2]) for r in mine}
        repeated = {(r[0], r[1], r[2]) for r in mine if r[3] > 0}
        kinds = Counter(r[4] for r in mine)
        answered = self.ws.store.expert_answers(self.source)
        # answers imported or given outside the scheduler count as seen
        seen.update((a, j, k) if j
                    < k  # pragma: no mutate (j == k never happens: the store refuses equal references)
                    else (a, k, j) for a, j, k, _, _ in answered)
        total = len(mine)
        now = time.time()

        if kinds["repeat"] < self.repeat_share * total:
            question = self._repeat(mine, answered, repeated, now)
            if question is not None:
                return question
        if kinds["shared"] < self.shared_share * total:
            question = self._shared(seen, now)
            if question is not None:
                return question
        return self._new(con, image_ids, seen, now)

    def _orient(self, anchor: str, a: str, b: str, rep: int, kind: str, now: float) -> Question:
        j, k = (a, b) if (self._rng.random()
                          < 0.5  # pragma: no mutate (<= differs only when random() gives exactly 0.5: p = 2^-53)
                          ) else (b, a)
        return Question(anchor, j, k, rep, kind, now)

    def _repeat(self, mine: list, answered: list[tuple], repeated: set, now: float) -> Question | None:
        """A planned repeat of one of this annotator's answers (rows anchor, ref_j, ref_k, rep, choice)."""
        recent = {(r[0], r[1], r[2]) for r in sorted(mine, key=lambda r: r[5])[max(0, len(mine) - self.repeat_gap):]}
        excluded = repeated | recent
        pool = [row for row in answered if not row[3] and row[4] != "skip"
                and triplet_key(row[0], row[1], row[2]) not in excluded]
        if not pool:
            return None
        anchor, ref_j, ref_k = self._rng.choice(pool)[:3]
        return Question(anchor, ref_k, ref_j, 1, "repeat", now)  # the sides the other way round

    def _shared(self, seen: set, now: float) -> Question | None:
        """A triplet other annotators answered, most-shared first (κ needs items in common), ties in
        a seeded random order. The ranking is counted in SQL once and reused until the number of
        other annotators' answers changes (two index counts per draw)."""
        others = self.ws.store.other_experts_answer_count(self.source)
        if self._shared_count != others:
            # any salt in [1, 2^31 - 2] is a seeded shuffle of tied triplets (2^31 - 1 is prime)
            salt = self._rng.randrange(1, 2**31 - 1)  # pragma: no mutate
            self._shared_count, self._shared_keys = others, self.ws.store.shared_expert_triplets(self.source, salt)
        for anchor, a, b, _, _ in self._shared_keys:
            if (anchor, a, b) not in seen:
                return self._orient(anchor, a, b, 0, "shared", now)
        return None

    def _new(self, con: Any, image_ids: list[str], seen: set, now: float) -> Question | None:
        load = Counter(self.leases.anchor_load(con))
        n_pairs = (len(image_ids) - 1) * (len(image_ids) - 2) // 2  # pragma: no mutate (/ 2 compares the same)
        per_anchor = Counter(k[0] for k in seen)
        anchors = [i for i in image_ids if per_anchor[i] < n_pairs]
        if not anchors:
            return None
        low = min(load[i] for i in anchors)
        anchor = self._rng.choice([i for i in anchors if load[i] == low])
        others = [i for i in image_ids if i != anchor]
        pairs = self._unseen_pairs(anchor, others, seen, n_pairs - per_anchor[anchor])
        if self.mode == "active" and anchor in self._dist:
            scored = [p for p in pairs if p[0] in self._dist and p[1] in self._dist]
            if scored:
                pairs = [min(scored, key=lambda p: self._margin(anchor, *p))]
        a, b = self._rng.choice(pairs)
        return self._orient(anchor, a, b, 0, "new", now)

    def _unseen_pairs(self, anchor: str, others: list[str], seen: set, n_unseen: int) -> list[tuple[str, str]]:
        """Up to ``candidates`` unseen sorted reference pairs for ``anchor`` (rejection sampling,
        falling back to enumeration when few remain)."""
        want = (self.candidates if self.mode == "active"
                else 1  # pragma: no mutate (random mode serves one uniformly random pair of those found)
                )
        found: set[tuple[str, str]] = set()
        # the threshold and the number of tries only move where enumeration takes over (more pairs scored)
        if n_unseen > 4 * want:  # pragma: no mutate
            for _ in range(50 * want):  # pragma: no mutate (the same)
                a, b = sorted(self._rng.sample(others, 2))
                if (anchor, a, b) not in seen:
                    found.add((a, b))
                    if len(found) >= want:  # pragma: no mutate (one more candidate: one more pair scored)
                        break
        if not found:
            found = {
                (a, b) for x, a in enumerate(sorted(others)) for b in sorted(others)[x + 1:]
                if (anchor, a, b) not in seen
            }
        return sorted(found)

    def _margin(self, anchor: str, a: str, b: str) -> float:
        """Relative distance margin |d(i,j) − d(i,k)| / (d(i,j) + d(i,k)); small = uncertain."""
        D = self._D
        assert D is not None, "active mode scores pairs only with distances"
        i, j, k = self._dist[anchor], self._dist[a], self._dist[b]
        total = D[i, j] + D[i, k]
        return abs(D[i, j] - D[i, k]) / total if total > 0 else 0.0

    # -- answering ----------------------------------------------------------------------
    def answer(self, question: Question, choice: str, answered_at: float | None = None,
               actor: str | None = None) -> int | None:
        """Store the annotator's answer with its latency (served → answered, ms); the revision names
        ``actor`` (the signed-in account; default the source).

        Returns the triplet row id, or None when this exact judgment was already stored.
        """
        if choice not in ("j", "k", "skip"):
            raise ValueError(f"choice must be 'j', 'k' or 'skip', got {choice!r}")
        answered_at = time.time() if answered_at is None else answered_at
        latency_ms = max(0, round((answered_at - question.served_at) * 1000))
        return self.ws.store.add_triplet(
            question.anchor, question.ref_j, question.ref_k, choice, self.source,
            latency_ms=latency_ms, rep=question.rep, actor=actor,
        )

    def has_answer_since(self, since: str) -> bool:
        """Whether this annotator has an answer stored at or after ``since`` (something to undo)."""
        return self.ws.store.has_answer_since(self.source, since)

    def undo_last(self, since: str, actor: str | None = None) -> Question | None:
        """Delete this annotator's newest answer stored at or after ``since`` (an ISO timestamp like
        the store's ``created``) and return it as a question to ask again (served now), or None when
        there is none. The undo stack is the store itself, so an undo survives a page reload."""
        row = self.ws.store.last_answer_since(self.source, since)
        if row is None:
            return None
        a, b = sorted((row["ref_j"], row["ref_k"]))
        kind = self.leases.kind(self.annotator, row["anchor"], a, b, row["rep"])
        self.ws.store.delete_triplet(row["id"], actor=actor)
        return Question(row["anchor"], row["ref_j"], row["ref_k"], int(row["rep"] or 0),
                        kind if kind is not None else ("repeat" if row["rep"] else "new"), time.time())

    def progress(self) -> dict[str, int]:
        """The annotator's stored answers: total, skips, repeats."""
        rows = self.ws.store.triplets(source=self.source)
        return {
            "answered": len(rows),
            "skips": sum(r["choice"] == "skip" for r in rows),
            "repeats": sum(int(r.get("rep") or 0) > 0 for r in rows),
        }


def annotators(store: Any) -> list[str]:
    """Names of every annotator with at least one stored expert judgment, sorted."""
    return sorted({a for r in store.expert_triplets() if (a := annotator_of(r["source"]))})


def combinations_count(n_images: int) -> int:
    """Number of distinct triplets (anchor, unordered reference pair) over n photos."""
    return n_images * math.comb(max(n_images - 1,
                                    0),  # pragma: no mutate (1 differs only for n <= 1: both give 0)
                                2)
