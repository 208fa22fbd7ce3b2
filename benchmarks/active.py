"""Active vs uniform triplet selection: SOE agreement against the query budget.

    python -m benchmarks.active [--workspace WS] [--seeds 3]

Data (SYNTHETIC): the phantom demo's 53 photos; the phantom oracle (simulated expert's noise
model, no skips) answers any of the 70,278 (anchor, pair) questions. For budgets of 1, 2, 5,
10, 15, 25, 50 and 100 % of all questions:

- uniform: the first b questions of a seeded uniform order (TriDerm §3.2 / Table 2a);
- active (:class:`core.text.sampling.ActiveSampler`): anchor-balanced random 0.5 %, then
  rounds that ask, from a random pool of 4× the round size of unasked questions, those with
  the smallest |margin| under the current SOE fit, spread evenly over anchors, refitting
  (warm start) after every round; a round is 0.5 % of all questions or 10 % of those asked so far,
  whichever is larger, cut at the next budget mark.

At each mark a fresh SOE (default settings, same seed for both samplers) is fitted on the
answers so far and scored by balanced agreement with the demo's 513 simulated expert
triplets (the paper's metric) and by agreement with the noise-free latent order over all
questions. Prints mean ± sd over seeds and the smallest budget at which each sampler comes
within 1 pp of its full-budget agreement.
"""
from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.soe import phantom_triplets, phantom_workspace
from core.eval.distances import pairwise_euclidean
from core.eval.metrics import evaluate
from core.text.sampling import ActiveSampler, all_questions, canonical_key, default_active_batch, uniform_order
from core.text.soe import SOE, triplet_margins

BUDGETS = (0.01, 0.02, 0.05, 0.10, 0.15, 0.25, 0.50, 1.00)


def scores(emb: np.ndarray, ids: list[str], expert: list[dict], truth_oriented: np.ndarray) -> tuple[float, float]:
    """(balanced agreement with the expert triplets, agreement with the latent order)."""
    bal = evaluate(ids, pairwise_euclidean(emb), expert)["balanced"]
    return bal, float((triplet_margins(emb, truth_oriented) > 0).mean())


def run_seed(seed: int, ids: list[str], answers: dict[int, np.ndarray], expert: list[dict],
             truth_oriented: np.ndarray, total: int) -> dict[str, list[tuple[float, float]]]:
    n = len(ids)
    marks = [max(1, int(round(b * total))) for b in BUDGETS]
    keys_all, oriented_all = answers["keys"], answers["oriented"]

    def orient(q: np.ndarray) -> np.ndarray:
        return oriented_all[np.searchsorted(keys_all, canonical_key(q, n))]

    def fit(triplets: np.ndarray) -> np.ndarray:
        return SOE(random_state=seed).fit(triplets, n).embedding_

    order = uniform_order(n, seed)
    uniform = [scores(fit(orient(order[:m])), ids, expert, truth_oriented) for m in marks]

    sampler = ActiveSampler(n, default_active_batch(n), seed=seed)
    base = default_active_batch(n)
    asked = np.zeros((0, 3), dtype=np.int64)
    active = []
    for m in marks:
        while len(asked) < m:
            size = min(max(base, math.ceil(0.1 * len(asked))), m - len(asked))
            nxt = sampler.next_batch(orient(asked), canonical_key(asked, n), size)
            asked = np.concatenate([asked, nxt])
        active.append(scores(fit(orient(asked)), ids, expert, truth_oriented))
    return {"uniform": uniform, "active": active}


def first_within(curve: np.ndarray, tol: float = 0.01) -> float:
    """Smallest budget whose mean agreement is ≥ full budget − tol."""
    full = curve[-1]
    return next(b for b, v in zip(BUDGETS, curve) if v >= full - tol)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.active", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workspace", default=None, help="a SYNTHETIC phantom workspace (default: build one)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    from annotations.workspace import Workspace

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        ws = Workspace(args.workspace) if args.workspace else phantom_workspace(Path(tmp), 0)
        if not ws.truth_dir.is_dir():
            parser.error(f"{ws.root} has no truth/: the benchmark needs a SYNTHETIC phantom workspace")
        ids, questions, oriented, oracle = phantom_triplets(ws, 0)
        expert = ws.store.expert_triplets()
    n, total = len(ids), len(questions)
    keys = canonical_key(questions, n)
    sort = np.argsort(keys)
    answers = {"keys": keys[sort], "oriented": oriented[sort]}
    D = oracle.truth.distance_matrix()
    truth_oriented = all_questions(n)
    flip = D[truth_oriented[:, 0], truth_oriented[:, 1]] > D[truth_oriented[:, 0], truth_oriented[:, 2]]
    truth_oriented[flip, 1], truth_oriented[flip, 2] = truth_oriented[flip, 2], truth_oriented[flip, 1].copy()

    results = []
    for seed in range(args.seeds):
        results.append(run_seed(seed, ids, answers, expert, truth_oriented, total))
        print(f"  seed {seed} done ({time.perf_counter() - t0:.0f} s)", flush=True)
    arr = {s: np.array([r[s] for r in results]) for s in ("uniform", "active")}  # seeds × budgets × 2

    print(f"\nSYNTHETIC phantom data: {n} photos, {total} questions, phantom oracle (no skips), SOE dim 4, "
          f"{args.seeds} seeds; mean ± sd.")
    head = (f"{'budget':>7} {'triplets':>9} | {'uniform bal.':>14} {'active bal.':>14} | "
            f"{'uniform truth':>14} {'active truth':>14}")
    print(head + "\n" + "-" * len(head))
    for b_i, b in enumerate(BUDGETS):
        cells = [f"{100 * arr[s][:, b_i, m].mean():6.2f} ± {100 * arr[s][:, b_i, m].std():4.2f}"
                 for m in (0, 1) for s in ("uniform", "active")]
        print(f"{b:>7.0%} {max(1, int(round(b * total))):>9} | {cells[0]:>14} {cells[1]:>14} | {cells[2]:>14} {cells[3]:>14}")
    summary = {}
    for m, label in ((0, "balanced agreement with expert triplets"), (1, "agreement with latent truth")):
        line = []
        for s in ("uniform", "active"):
            b = first_within(arr[s][:, :, m].mean(0))
            summary[f"{s}_{m}"] = b
            line.append(f"{s} {b:.0%}")
        print(f"first budget within 1 pp of full-budget {label}: " + ", ".join(line))
    print(f"total {time.perf_counter() - t0:.0f} s on a shared 2-core machine")
    if args.json:
        args.json.write_text(json.dumps({"budgets": BUDGETS, "uniform": arr["uniform"].tolist(),
                                         "active": arr["active"].tolist(), "first_within_1pp": summary}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
