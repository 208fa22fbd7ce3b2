"""Active vs uniform triplet selection on real wounds: what a clinic's judgments buy, per judgment asked.

    python -m benchmarks.active_real --data ../shared/data/azh-dev [--seeds 0 1 2 3 4] [--quick]

The data set's triplets are the oracle: a sampler may ask only a triplet the file holds, and gets the
file's answer. Every seed draws one random patient-disjoint split into ``--folds`` halves
(:class:`benchmarks.real_vision.Bench`); a fold's askable pool is the file's triplets that name no photo
of the fold. At budgets of 5, 10, 25, 50 and 100 % of that pool:

- uniform: the first b triplets of a seeded random order of the pool (as :mod:`benchmarks.active`);
- active: the same first batch (5 % of the pool), then rounds of 5 % of the pool or 10 % of those asked,
  whichever is larger (cut at the next budget mark), each asking, from a random pool of 4× the round size
  of unasked file triplets, those with the smallest |margin| under the current fit, spread evenly over
  anchors (:func:`core.text.sampling.select_active`, the rule of :class:`~core.text.sampling.ActiveSampler`).

The learner — refitted after every round for the margins, and fitted afresh at each budget mark for the
score — is the cheapest the product offers that can place a new patient's photo: the linear metric on
frozen EfficientNet-Lite0 features (each photo's mean token) (:class:`core.vision.supervised.LinearMetric`, the
``real_vision`` row). SOE (what :mod:`benchmarks.active` fits) embeds only the photos it was asked about, so
it cannot score held-out patients. Score: balanced agreement with the fold's strict triplets (all three
photos unseen), both folds' records pooled per seed. Mean ± sd over seeds, a one-sided paired t-test over
seeds at every budget below 100 % (at 100 % both samplers hold the whole pool). Writes
``results/<section>.json``.
"""
from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from benchmarks.active import first_within
from benchmarks.real_vision import Bench, add_dataset_options, check_dataset, dataset_workspace, frozen_bank
from benchmarks.results import (
    command_line,
    mean_sd_ci,
    multiple_tests_note,
    paired_claim,
    render_tables,
    write_result,
)
from core import cli
from core.eval.distances import pairwise_euclidean
from core.eval.protocol import protocol_summary, score_folds, split_triplets
from core.runtime import torch_threads
from core.text.sampling import select_active
from core.vision.baseline import mean_pooled, normalized
from core.vision.supervised import LinearMetric

BUDGETS = (0.05, 0.10, 0.25, 0.50, 1.00)
QUICK_BUDGETS = (0.10, 0.50, 1.00)
#: the first batch and the smallest round, as a share of the fold's askable pool
BASE = 0.05
POOL_FACTOR = 4


def fitted(frozen: np.ndarray, asked: np.ndarray, seed: int) -> np.ndarray:
    """Every photo's place under the linear metric fitted on the ``asked`` triplets (fitted on the rows they
    name only: the same fit, as the metric's standardisation and loss see no other row, at a fraction of the
    cost)."""
    named, local = np.unique(asked, return_inverse=True)
    return LinearMetric(random_state=seed).fit(frozen[named], local.reshape(asked.shape)).transform(frozen)


def active_order(frozen: np.ndarray, pool: np.ndarray, marks: list[int], first: np.ndarray,
                 seed: int) -> dict[int, np.ndarray]:
    """Mark → the pool rows active selection has asked by it (starting from ``first``)."""
    rng = np.random.default_rng([seed, 3])
    base = max(1, math.ceil(BASE * len(pool)))
    asked = list(first[:base])
    out = {}
    for m in marks:
        if m >= len(pool):  # the whole pool: nothing left to choose
            out[m] = np.arange(len(pool))
            continue
        while len(asked) < m:
            size = min(max(base, math.ceil(0.1 * len(asked))), m - len(asked))
            unasked = np.setdiff1d(np.arange(len(pool)), asked)
            if len(unasked) <= size:
                asked += unasked.tolist()
                break
            cand = np.sort(rng.choice(unasked, min(len(unasked), POOL_FACTOR * size), replace=False))
            z = fitted(frozen, pool[asked], seed)
            asked += cand[select_active(z, pool[cand], size)].tolist()
        out[m] = np.array(asked[:m])
    return out


def run_seed(b: Bench, frozen: np.ndarray, seed: int, budgets: tuple[float, ...]) -> dict[str, Any]:
    """Per sampler, the balanced strict agreement at every budget mark (both folds pooled), the frozen
    centred baseline's, and the mean number of triplets asked per fold at each mark."""
    records: dict[str, list[list[np.ndarray]]] = {s: [[] for _ in budgets] for s in ("uniform", "active")}
    base_recs, asked_n = [], np.zeros(len(budgets))
    for f, rows in enumerate(b.split(seed)):
        train, _, _ = split_triplets(b.triplets, rows)
        pool = b.triplets[train]
        marks = [max(1, int(round(x * len(pool)))) for x in budgets]
        asked_n += np.array(marks) / b.k
        order = np.random.default_rng([seed, f, 1]).permutation(len(pool))
        active = active_order(frozen, pool, marks, order, seed)
        fit_rows = np.setdiff1d(np.arange(len(b.image_ids)), rows)
        base_recs.append(score_folds(b.triplets, [(rows, pairwise_euclidean(
            normalized(frozen, "center-l2", fit_rows)[0]))])["strict"])
        for i, m in enumerate(marks):
            uniform = [(rows, pairwise_euclidean(fitted(frozen, pool[order[:m]], seed)))]
            records["uniform"][i].append(score_folds(b.triplets, uniform)["strict"])
            if m == len(pool):  # the whole pool: the same triplets, the same fit
                records["active"][i].append(records["uniform"][i][-1])
                continue
            fold = [(rows, pairwise_euclidean(fitted(frozen, pool[active[m]], seed)))]
            records["active"][i].append(score_folds(b.triplets, fold)["strict"])

    def balanced(recs: list[np.ndarray]) -> float:
        return protocol_summary(np.concatenate(recs), b.image_ids, b.patients, n_boot=1)["balanced"]

    return {"uniform": [balanced(r) for r in records["uniform"]], "active": [balanced(r) for r in records["active"]],
            "frozen": balanced(base_recs), "asked": asked_n}


def main(argv: list[str] | None = None) -> int:
    """The ``python -m benchmarks.active_real`` benchmark; returns the exit status."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.active_real", description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, required=True, help="a dataset folder in the product layout, with triplets")
    cli.add_seeds(p, default=(0, 1, 2, 3, 4))
    p.add_argument("--quick", action="store_true", help=f"seeds 0 1, budgets {', '.join(f'{x:.0%}' for x in QUICK_BUDGETS)}"
                   .replace("%", "%%"))
    add_dataset_options(p, "active_real")
    args = cli.parse_args(p, argv)
    check_dataset(p, args)
    seeds = [0, 1] if args.quick else list(args.seeds)
    if len(seeds) < 2 or len(set(seeds)) != len(seeds):
        p.error(f"give at least two distinct --seeds for sd, CI and paired tests, got {seeds}")
    budgets = QUICK_BUDGETS if args.quick else BUDGETS
    t0 = time.perf_counter()
    with dataset_workspace(args, "active-real-") as ws, torch_threads(1):
        b = Bench(ws, args.folds, not args.quiet)
        if not len(b.triplets):
            p.error(f"--data {args.data}: no triplets, so no oracle to replay")
        image_order, frozen = mean_pooled(frozen_bank(ws, "full", b.keys, b.image_ids, 0, b.progress))[1:]
        if image_order != b.image_ids:
            raise RuntimeError("the token bank's photo order differs from the workspace's")
        results = [run_seed(b, frozen, seed, budgets) for seed in tqdm(seeds, desc="seeds", disable=args.quiet)]
    arr = {s: 100 * np.array([r[s] for r in results]) for s in ("uniform", "active")}  # seeds × budgets, %
    asked = np.mean([r["asked"] for r in results], axis=0)
    frozen_row = mean_sd_ci([100 * r["frozen"] for r in results])
    rows: list[list[Any]] = [[100 * x, round(float(asked[i])), mean_sd_ci(arr["uniform"][:, i]),
                              mean_sd_ci(arr["active"][:, i])]
            for i, x in enumerate(budgets)]
    rows.append(["0 (frozen centred, no triplet)", 0, frozen_row, frozen_row])
    tables = [{"caption": f"Balanced strict agreement (%) of the linear metric fitted on the triplets asked, "
                          f"{Path(args.data).name}, {len(seeds)} seeds × {args.folds} patient folds",
               "columns": ["budget % of the fold's pool", "triplets asked per fold", "uniform", "active"],
               "rows": rows}]
    claims = [paired_claim(f"active beats uniform selection at a {100 * x:g}% budget (strict balanced agreement)",
                           arr["active"][:, i].tolist(), arr["uniform"][:, i].tolist())
              for i, x in enumerate(budgets[:-1])]
    curve = {s: arr[s].mean(0) / 100 for s in arr}
    first = {s: first_within(curve[s], budgets) for s in curve}
    n_pat = len({b.patients[i] for i in b.image_ids})
    notes = [
        f"Real data: {len(b.image_ids)} photos of {n_pat} patients; the oracle is the file's {len(b.triplets)} "
        "label-derived triplets (a specialist's wound-type labels turned into judgments): a sampler may ask only "
        "those, so a fold's askable pool is the file's triplets naming no photo of the fold (about a quarter of "
        "the file with 2 folds).",
        "Selection: the product's scheduler (annotations.scheduler, active mode) proposes any reference pair, "
        "which this file mostly cannot answer; the replay applies the same smallest-margin, anchor-balanced rule "
        "as benchmarks.active (core.text.sampling.select_active, random pools of "
        f"{POOL_FACTOR}× the round) to the unasked file triplets only. First batch {100 * BASE:g}% of the pool, "
        "shared with uniform.",
        "Learner: the linear metric on frozen EfficientNet-Lite0 features (the cheapest learner the product has "
        "that embeds a new patient's photo; SOE, fitted by benchmarks.active, cannot), refitted after each round; "
        "not the fine-tuned default, whose fit per budget point costs minutes on a CPU.",
        "Strict scoring: each budget's model is scored only on triplets whose three photos are all in the held-out "
        "fold (new patients), both folds pooled per seed; the budget-0 row is the frozen centred embedding on the "
        "same folds.",
        f"First budget within 1 pp of the full-pool agreement: uniform {100 * first['uniform']:g}%, "
        f"active {100 * first['active']:g}%.",
        multiple_tests_note(claims),
    ]
    if args.quick:
        notes.append("--quick: two seeds and three budgets; not a result")
    print(render_tables(tables))
    print("\n".join(notes))
    title = f"Active vs uniform triplet selection on real wounds ({Path(args.data).name} as the oracle)" + (" [quick]" if args.quick else "")
    path = write_result(args.section, title, command_line("benchmarks.active_real", argv), seeds, tables, claims,
                        notes, synthetic=False, seconds=time.perf_counter() - t0, results_dir=args.results)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
