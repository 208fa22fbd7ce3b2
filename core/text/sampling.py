"""Which triplet questions to ask: uniform, anchor-balanced and active (smallest-margin) selection.

A *question* is an anchor i and an unordered reference pair {j, k}; the TriDerm paper asks
all of them (n·C(n−1, 2) questions, 68,913 ≈ 53·C(52, 2) in §3.2) or a uniform fraction
(Table 2a budget ablation). Questions are int arrays (m, 3) [i, j, k]; the order of j and k
is the position in which the references are shown to the oracle, drawn at random per
question so that a position bias cannot masquerade as a similarity.

All orders are deterministic per seed, and a budget's questions are a prefix of a larger
budget's, so a run with a bigger budget extends a smaller one instead of starting over.
"""
from __future__ import annotations

import math

import numpy as np

SAMPLINGS = ("uniform", "anchor-balanced", "active")
ENUMERATE_MAX = 5_000_000  # above this many possible questions, active pools are drawn, not enumerated


def n_questions(n: int) -> int:
    """n·C(n−1, 2): every anchor with every unordered pair of other objects."""
    return n * (n - 1) * (n - 2) // 2


def all_questions(n: int) -> np.ndarray:
    """Every (anchor, j < k) question over ``n`` objects, anchor-major order."""
    if n < 3:
        raise ValueError(f"triplets need at least 3 objects, got {n}")
    j, k = np.triu_indices(n, 1)
    pairs = np.stack([j, k], 1)
    rows = [np.column_stack([np.full(int(keep.sum()), a), pairs[keep]])
            for a in range(n) for keep in [(pairs != a).all(1)]]
    return np.concatenate(rows).astype(np.int64)


def resolve_budget(budget: int | float, total: int) -> int:
    """A count (int) or a fraction of ``total`` (float in (0, 1], rounded, at least 1)."""
    if isinstance(budget, (bool, np.bool_)) or budget <= 0:
        raise ValueError(f"budget must be a positive count or a fraction in (0, 1], got {budget!r}")
    if isinstance(budget, (int, np.integer)):
        if budget > total:
            raise ValueError(f"budget {budget} exceeds the {total} possible questions")
        return int(budget)
    if budget > 1:
        raise ValueError(f"a fractional budget must lie in (0, 1], got {budget}")
    return max(1, int(round(budget * total)))


def parse_budget(text: str) -> int | float:
    """CLI budget: ``200`` is a count, ``0.1`` or ``10%`` a fraction of all questions."""
    text = text.strip()
    try:
        if text.endswith("%"):
            return float(text[:-1]) / 100
        return float(text) if any(c in text for c in ".eE") else int(text)
    except ValueError:
        raise ValueError(f"budget {text!r} is neither a count (200) nor a fraction (0.1 or 10%)") from None


def _shuffle_positions(q: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    swap = rng.random(len(q)) < 0.5
    q = q.copy()
    q[swap, 1], q[swap, 2] = q[swap, 2], q[swap, 1].copy()
    return q


def uniform_order(n: int, seed: int = 0) -> np.ndarray:
    """All questions in a seeded uniformly random order (take a prefix for a budget)."""
    rng = np.random.default_rng([seed, 1])
    q = all_questions(n)
    return _shuffle_positions(q[rng.permutation(len(q))], rng)


def anchor_balanced_order(n: int, seed: int = 0) -> np.ndarray:
    """All questions, round robin over anchors (each anchor's pairs in random order), so
    every prefix gives each anchor the same number of questions ±1."""
    rng = np.random.default_rng([seed, 2])
    q = all_questions(n)
    per_anchor = len(q) // n
    blocks = q.reshape(n, per_anchor, 3)
    blocks = np.stack([b[rng.permutation(per_anchor)] for b in blocks])
    rounds = blocks.transpose(1, 0, 2)  # round r: one question per anchor
    rounds = np.stack([r[rng.permutation(n)] for r in rounds])
    return _shuffle_positions(rounds.reshape(-1, 3), rng)


def canonical_key(q: np.ndarray, n: int) -> np.ndarray:
    """Integer key of (anchor, {j, k}) over ``n`` objects, independent of reference positions."""
    q = np.asarray(q, dtype=np.int64).reshape(-1, 3)
    lo, hi = np.minimum(q[:, 1], q[:, 2]), np.maximum(q[:, 1], q[:, 2])
    return (q[:, 0] * n + lo) * n + hi


def random_questions(n: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` random questions (anchor, j, k) with three distinct objects, anchors round robin
    from a random start (anchor-balanced ±1), without enumerating all n·C(n−1, 2) questions."""
    a = (rng.integers(n) + np.arange(size)) % n
    j = (a + rng.integers(1, n, size)) % n  # ≠ a
    k = (a + rng.integers(1, n - 1, size)) % n  # ≠ a; moved off j below
    k = np.where(k == j, (a + n - 1) % n, k)
    return np.stack([a, j, k], 1).astype(np.int64)


def select_active(embedding: np.ndarray, candidates: np.ndarray, size: int) -> np.ndarray:
    """Indices into ``candidates`` of ``size`` questions with the smallest |margin| under
    ``embedding`` (the most uncertain for the current fit), spread evenly over anchors:
    each anchor contributes its most uncertain questions round by round."""
    if size <= 0 or len(candidates) == 0:
        return np.zeros(0, dtype=np.int64)
    size = min(size, len(candidates))
    from core.text.soe import triplet_margins  # torch: imported by active sampling only (a fast --help)

    margin = np.abs(triplet_margins(embedding, candidates))
    order = np.lexsort((margin, candidates[:, 0]))  # by anchor, then by |margin|
    anchors = candidates[order, 0]
    first = np.searchsorted(anchors, anchors, side="left")
    rank = np.arange(len(order)) - first  # position within the anchor's list
    pick = np.lexsort((margin[order], rank))[:size]
    return order[pick]


class ActiveSampler:
    """Smallest-margin active selection, refitting SOE between batches.

    ``next_batch(answered, asked_keys)`` fits SOE on the oriented triplets answered so far
    (warm-started from the previous fit), draws a random pool of ``pool_factor`` × size
    unasked questions and returns the pool's smallest-|margin| questions, anchor-balanced.
    The random pool keeps each round diverse: ranking *all* unasked questions piles a
    round onto near-ties of a few regions, whose answers from a noisy oracle are close
    to coin flips (``benchmarks/active.py`` measured pool 4 ahead of the full ranking).
    Before any answer exists it returns an anchor-balanced random batch.

    Above :data:`ENUMERATE_MAX` possible questions (more than 216 objects) they are not enumerated:
    the pool is drawn with :func:`random_questions` and asked ones are dropped by key, so
    memory follows the pool, not n³ (``questions`` is then None).
    """

    def __init__(self, n: int, batch_size: int, seed: int = 0, n_components: int = 4,
                 pool_factor: float | None = 4.0, soe_params: dict | None = None) -> None:
        if batch_size < 1:
            raise ValueError(f"active batch size must be ≥ 1, got {batch_size}")
        if pool_factor is not None and pool_factor < 1:
            raise ValueError(f"pool_factor must be ≥ 1 (or None for all unasked questions), got {pool_factor}")
        self.n = n
        self.batch_size = batch_size
        self.seed = seed
        self.n_components = n_components
        self.pool_factor = pool_factor
        self.soe_params = soe_params or {}
        enumerate_all = n_questions(n) <= ENUMERATE_MAX
        if not enumerate_all and pool_factor is None:
            raise ValueError(f"{n} objects have {n_questions(n):,} questions: too many to rank them all; "
                             f"give a pool_factor")
        self.questions = anchor_balanced_order(n, seed) if enumerate_all else None
        self.keys = canonical_key(self.questions, n) if self.questions is not None else None
        self.rng = np.random.default_rng([seed, 3])
        self.embedding_: np.ndarray | None = None

    def fit(self, oriented: np.ndarray) -> np.ndarray:
        """Refit SOE on oriented triplets (i, closer, farther); returns the embedding."""
        from core.text.soe import SOE

        soe = SOE(n_components=self.n_components, n_objects=self.n, random_state=self.seed, **self.soe_params)
        warm = self.embedding_ is not None
        if warm:
            soe.set_params(epochs=max(1, soe.epochs // 2))
        soe.fit(oriented, init=self.embedding_ if warm else None)
        self.embedding_ = soe.embedding_
        return self.embedding_

    def next_batch(self, oriented: np.ndarray, asked_keys: np.ndarray, size: int | None = None) -> np.ndarray:
        """The next ``size`` (default batch_size) questions not in ``asked_keys``."""
        size = self.batch_size if size is None else size
        if self.questions is None:
            return self._next_lazy(oriented, np.asarray(asked_keys, dtype=np.int64), size)
        assert self.keys is not None  # set with the questions
        candidates = self.questions[~np.isin(self.keys, asked_keys)]
        if len(oriented) == 0:
            return candidates[:size]
        emb = self.fit(oriented)
        if self.pool_factor is not None and len(candidates) > self.pool_factor * size:
            pool = np.sort(self.rng.choice(len(candidates), int(self.pool_factor * size), replace=False))
            candidates = candidates[pool]
        return candidates[select_active(emb, candidates, size)]

    def _next_lazy(self, oriented: np.ndarray, asked_keys: np.ndarray, size: int) -> np.ndarray:
        """A drawn pool of ≈ pool_factor × size unasked, distinct questions; its most uncertain ``size``."""
        assert self.pool_factor is not None  # lazy sampling requires it (checked in __init__)
        want = size if len(oriented) == 0 else int(self.pool_factor * size)
        draw = random_questions(self.n, 2 * want + 16, self.rng)
        keys = canonical_key(draw, self.n)
        _, first = np.unique(keys, return_index=True)
        keep = np.sort(first[~np.isin(keys[first], asked_keys)])
        candidates = draw[keep[:want]]
        if len(oriented) == 0:
            return candidates
        return candidates[select_active(self.fit(oriented), candidates, size)]


def default_active_batch(n: int) -> int:
    """Half a percent of all questions, at least one per anchor."""
    return max(n, math.ceil(0.005 * n_questions(n)))
