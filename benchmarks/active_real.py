"""Active vs uniform triplet selection on real wounds: what a clinic's judgments buy, per judgment asked.

    python -m benchmarks.active_real --data ../shared/data/azh-dev [--seeds 0 1 2 3 4] [--quick]
    python -m benchmarks.active_real --data ../shared/data/azh-dev --learner finetune --seeds 0 1 2 [--quick]

The data set's triplets are the oracle: a sampler may ask only a triplet the file holds, and gets the
file's answer. Every seed draws one random patient-disjoint split into ``--folds`` halves
(:class:`benchmarks.real_vision.Bench`); a fold's askable pool is the file's triplets that name no photo
of the fold. With 2 folds that pool is only about an eighth of the file (a triplet's three photos each lie
outside the held-out half with chance ½; 526–629 of azh-dev's 5,000 per fold for seeds 0, 1, 2): a triplet
naming a held-out photo cannot be trained on while the fold is scored strict on new patients, so "all 5,000" is
out of reach and the largest budget is the fold's whole pool (its size per fold is in the notes). Budgets:

- ``--learner linear`` (section ``active_real``): 5, 10, 25, 50 and 100 % of the fold's pool;
- ``--learner finetune`` (section ``learning_curve``, the learning curve in judgments): 50, 100, 250 and 500
  triplets and the whole pool (a count the pool cannot hold is the whole pool).

Samplers:

- uniform: the first b triplets of a seeded random order of the pool (as :mod:`benchmarks.active`);
- active: the same first batch (5 % of the pool), then rounds of 5 % of the pool or 10 % of those asked,
  whichever is larger (cut at the next budget mark), each asking, from a random pool of 4× the round size
  of unasked file triplets, those with the smallest |margin| under the current fit, spread evenly over
  anchors (:func:`core.text.sampling.select_active`, the rule of :class:`~core.text.sampling.ActiveSampler`).

The margins that choose what to ask always come from the cheapest learner that can place a new patient's
photo, refitted after every round: the linear metric on frozen EfficientNet-Lite0 features (each photo's mean
token) (:class:`core.vision.supervised.LinearMetric`). The scored learner, fitted afresh at each budget mark,
is that linear metric (``linear``) or the product's default mode, the last stage + head of the backbone
fine-tuned on the triplets asked (``finetune``, :class:`core.vision.finetune.LastStageTuner` on cached stage-6
features, as :mod:`benchmarks.real_vision` fits it). SOE (what :mod:`benchmarks.active` fits) embeds only the
photos it was asked about, so it cannot score held-out patients. Score: balanced agreement with the fold's
strict triplets (all three photos unseen), both folds' records pooled per seed: mean ± sd over seeds, and all
seeds pooled with a patient-bootstrap 95 % CI. Claims: active vs uniform by a one-sided paired t-test over
seeds at every budget past the shared first batch and below the whole pool (elsewhere both samplers hold the same
triplets), and every budget vs the frozen centred embedding by a paired t-test over patients. Writes ``results/<section>.json``.
"""
from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from benchmarks.active import first_within
from benchmarks.real_vision import (
    Bench,
    add_dataset_options,
    cell,
    check_dataset,
    dataset_workspace,
    frozen_bank,
    patient_claim,
    stage6_photos,
)
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
from core.vision.backbones import load_backbone
from core.vision.baseline import mean_pooled, normalized
from core.vision.finetune import FineTuneConfig, LastStageTuner
from core.vision.supervised import LinearMetric
from core.vision.triderm_config import DEFAULT

#: a budget: a share of the fold's askable pool (float; 1.0 is the whole pool) or a count of triplets (int)
Budget = float | int
#: learner → (budgets, --quick budgets, default section)
LEARNERS: dict[str, tuple[tuple[Budget, ...], tuple[Budget, ...], str]] = {
    "linear": ((0.05, 0.10, 0.25, 0.50, 1.00), (0.10, 0.50, 1.00), "active_real"),
    "finetune": ((50, 100, 250, 500, 1.00), (3, 6, 1.00), "learning_curve"),
}
BUDGETS, QUICK_BUDGETS = LEARNERS["linear"][:2]
#: fine-tuning steps of a --quick run
QUICK_STEPS = 10
#: the first batch and the smallest round, as a share of the fold's askable pool
BASE = 0.05
POOL_FACTOR = 4
#: (asked triplets, photo rows it may use, seed) → every photo's embedding
Learner = Callable[[np.ndarray, np.ndarray, int], np.ndarray]


def fitted(frozen: np.ndarray, asked: np.ndarray, seed: int) -> np.ndarray:
    """Every photo's place under the linear metric fitted on the ``asked`` triplets (fitted on the rows they
    name only: the same fit, as the metric's standardisation and loss see no other row, at a fraction of the
    cost)."""
    named, local = np.unique(asked, return_inverse=True)
    return LinearMetric(random_state=seed).fit(frozen[named], local.reshape(asked.shape)).transform(frozen)


def budget_marks(budgets: tuple[Budget, ...], pool: int) -> list[int]:
    """The number of pool triplets each budget asks: a share of the pool, or a count cut at the pool's size."""
    return [max(1, min(pool, x if isinstance(x, int) else int(round(x * pool)))) for x in budgets]


def budget_label(x: Budget, counts: bool) -> float | int | str:
    """A budget's first table cell: % of the pool, or, on a curve in counts, the count or the whole pool."""
    if isinstance(x, int):
        return x
    return "all of the fold's pool" if counts else 100 * x


def first_batch(pool: int) -> int:
    """The size of the first batch, shared by both samplers, and of the smallest active round."""
    return max(1, math.ceil(BASE * pool))


def active_order(frozen: np.ndarray, pool: np.ndarray, marks: list[int], first: np.ndarray,
                 seed: int) -> dict[int, np.ndarray]:
    """Mark → the pool rows active selection has asked by it (starting from ``first``)."""
    rng = np.random.default_rng([seed, 3])
    base = first_batch(len(pool))
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


def run_seed(b: Bench, frozen: np.ndarray, learn: Learner, seed: int, budgets: tuple[Budget, ...]) -> dict[str, Any]:
    """Per sampler, the strict records at every budget mark (both folds pooled), the frozen centred baseline's,
    the mean number of triplets asked per fold at each mark, every fold's pool size, and per mark whether active
    and uniform may differ in some fold (the mark past the shared first batch and below the whole pool)."""
    records: dict[str, list[list[np.ndarray]]] = {s: [[] for _ in budgets] for s in ("uniform", "active")}
    base_recs, asked_n, pools, differ = [], np.zeros(len(budgets)), [], np.zeros(len(budgets), bool)
    for f, rows in enumerate(b.split(seed)):
        train, _, _ = split_triplets(b.triplets, rows)
        pool = b.triplets[train]
        pools.append(len(pool))
        marks = budget_marks(budgets, len(pool))
        asked_n += np.array(marks) / b.k
        differ |= (np.array(marks) > first_batch(len(pool))) & (np.array(marks) < len(pool))
        order = np.random.default_rng([seed, f, 1]).permutation(len(pool))
        active = active_order(frozen, pool, marks, order, seed)
        fit_rows = np.setdiff1d(np.arange(len(b.image_ids)), rows)
        base_recs.append(score_folds(b.triplets, [(rows, pairwise_euclidean(
            normalized(frozen, "center-l2", fit_rows)[0]))])["strict"])
        for i, m in enumerate(marks):
            uniform = [(rows, pairwise_euclidean(learn(pool[order[:m]], fit_rows, seed)))]
            records["uniform"][i].append(score_folds(b.triplets, uniform)["strict"])
            if m == len(pool):  # the whole pool: the same triplets, the same fit
                records["active"][i].append(records["uniform"][i][-1])
                continue
            fold = [(rows, pairwise_euclidean(learn(pool[active[m]], fit_rows, seed)))]
            records["active"][i].append(score_folds(b.triplets, fold)["strict"])
    return {"records": {s: [np.concatenate(r) for r in recs] for s, recs in records.items()},
            "frozen": np.concatenate(base_recs), "asked": asked_n, "pools": pools, "differ": differ}


def main(argv: list[str] | None = None) -> int:
    """The ``python -m benchmarks.active_real`` benchmark; returns the exit status."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.active_real", description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, required=True, help="a dataset folder in the product layout, with triplets")
    cli.add_seeds(p, default=(0, 1, 2, 3, 4))
    p.add_argument("--learner", choices=tuple(LEARNERS), default="linear",
                   help="the scored learner: the linear metric on frozen features (section active_real) or the "
                        "default mode's fine-tuned last stage (section learning_curve); margins always come from "
                        "the linear metric")
    p.add_argument("--views", type=int, default=DEFAULT.views,
                   help="cached augmented views per photo (--learner finetune)")
    p.add_argument("--quick", action="store_true",
                   help=f"seeds 0 1, three budgets; with --learner finetune also {QUICK_STEPS} steps and 4 views")
    add_dataset_options(p, None)
    args = cli.parse_args(p, argv)
    check_dataset(p, args)
    budgets, quick_budgets, section = LEARNERS[args.learner]
    args.section = args.section or section
    seeds = [0, 1] if args.quick else list(args.seeds)
    if len(seeds) < 2 or len(set(seeds)) != len(seeds):
        p.error(f"give at least two distinct --seeds for sd, CI and paired tests, got {seeds}")
    budgets = quick_budgets if args.quick else budgets
    finetune = args.learner == "finetune"
    views = 4 if args.quick else args.views
    # the inference view, as the stored curves were measured (the default's test-time views: real_vision)
    tune = FineTuneConfig(test_views=False)
    tune = replace(tune, steps=QUICK_STEPS) if args.quick else tune
    t0 = time.perf_counter()
    with dataset_workspace(args, "active-real-") as ws, torch_threads(1):
        b = Bench(ws, args.folds, not args.quiet)
        if not len(b.triplets):
            p.error(f"--data {args.data}: no triplets, so no oracle to replay")
        image_order, frozen = mean_pooled(frozen_bank(ws, "full", b.keys, b.image_ids, 0, b.progress))[1:]
        if image_order != b.image_ids:
            raise RuntimeError("the token bank's photo order differs from the workspace's")
        if finetune:
            tuner = LastStageTuner(load_backbone("efficientnet-lite0", layer="stage6"),
                                   stage6_photos(ws, b.image_ids, views, b.progress), tune)

            def learn(asked: np.ndarray, fit_rows: np.ndarray, seed: int) -> np.ndarray:
                return tuner.fit(asked, fit_rows, seed).transform()
        else:
            def learn(asked: np.ndarray, fit_rows: np.ndarray, seed: int) -> np.ndarray:
                return fitted(frozen, asked, seed)
        results = [run_seed(b, frozen, learn, seed, budgets) for seed in tqdm(seeds, desc="seeds", disable=args.quiet)]

    def summary(recs: list[np.ndarray], n_boot: int = 1000) -> dict[str, Any]:
        return protocol_summary(np.concatenate(recs), b.image_ids, b.patients, n_boot=n_boot)

    samplers = ("uniform", "active")
    arr = {s: 100 * np.array([[summary([r], 1)["balanced"] for r in res["records"][s]] for res in results])
           for s in samplers}  # seeds × budgets, %
    pooled = {s: [summary([res["records"][s][i] for res in results]) for i in range(len(budgets))] for s in samplers}
    frozen_pooled = summary([res["frozen"] for res in results])
    asked = np.mean([r["asked"] for r in results], axis=0)
    frozen_row = mean_sd_ci([100 * summary([r["frozen"]], 1)["balanced"] for r in results])
    rows: list[list[Any]] = [[budget_label(x, finetune), round(float(asked[i])), mean_sd_ci(arr["uniform"][:, i]),
                              mean_sd_ci(arr["active"][:, i]), cell(pooled["uniform"][i]), cell(pooled["active"][i])]
                             for i, x in enumerate(budgets)]
    rows.append(["0 (frozen centred, no triplet)", 0, frozen_row, frozen_row, cell(frozen_pooled),
                 cell(frozen_pooled)])
    learner = ("the default mode (last stage + head fine-tuned on stage-6 features)" if finetune
               else "the linear metric on frozen features")
    budget_col = "budget (triplets)" if finetune else "budget % of the fold's pool"
    tables = [{"caption": f"Balanced strict agreement (%) of {learner} fitted on the triplets asked, "
                          f"{Path(args.data).name}, {len(seeds)} seeds × {args.folds} patient folds",
               "columns": [budget_col, "triplets asked per fold", "uniform (over seeds)", "active (over seeds)",
                           "uniform (seeds pooled, patient CI)", "active (seeds pooled, patient CI)"],
               "rows": rows,
               "legend": "Over seeds: mean ± sd [95 % CI] of the per-seed figures; seeds pooled: one balanced figure "
                         "over every seed's records with its patient-bootstrap 95 % CI."}]

    def name(x: Budget) -> str:
        if isinstance(x, int):
            return f"{x} triplets"
        return "the fold's whole pool" if finetune else f"a {100 * x:g}% budget"

    differ = [i for i in range(len(budgets)) if any(r["differ"][i] for r in results)]
    claims = [paired_claim(f"active beats uniform selection at {name(budgets[i])} (strict balanced agreement)",
                           arr["active"][:, i].tolist(), arr["uniform"][:, i].tolist()) for i in differ]
    claims += [patient_claim(pooled[s][i], frozen_pooled, b.patients,
                             f"{s} selection at {name(x)} beats the frozen centred embedding")
               for s in samplers for i, x in enumerate(budgets) if s == "uniform" or i in differ]
    curve = {s: arr[s].mean(0) / 100 for s in arr}
    first = {s: first_within(curve[s], budgets) for s in curve}
    pools = [n for r in results for n in r["pools"]]
    n_pat = len({b.patients[i] for i in b.image_ids})
    notes = [
        f"Real data: {len(b.image_ids)} photos of {n_pat} patients; the oracle is the file's {len(b.triplets)} "
        "label-derived triplets (a specialist's wound-type labels turned into judgments): a sampler may ask only "
        "those, so a fold's askable pool is the file's triplets naming no photo of the fold.",
        f"Pool per fold (triplets naming no held-out photo, the most any budget can train on while scoring strict "
        f"on new patients): mean {np.mean(pools):.0f}, range {min(pools)}–{max(pools)} over "
        f"{len(pools)} folds, of the file's {len(b.triplets)}; so the file's whole set cannot be a budget"
        + ("; a count the pool cannot hold is the whole pool" if finetune else "") + ".",
        "Selection: the product's scheduler (annotations.scheduler, active mode) proposes any reference pair, "
        "which this file mostly cannot answer; the replay applies the same smallest-margin, anchor-balanced rule "
        "as benchmarks.active (core.text.sampling.select_active, random pools of "
        f"{POOL_FACTOR}× the round) to the unasked file triplets only. First batch {100 * BASE:g}% of the pool, "
        "shared with uniform.",
        ("Learner: the default mode, the last stage + head of EfficientNet-Lite0 fine-tuned on the triplets asked "
         f"({tune.steps} steps, {views} cached views per photo), fitted afresh at each budget mark; the active "
         "sampler's margins come from the linear metric on frozen features, refitted after each round (the cheap "
         "model chooses what to ask, the fine-tuned one is scored)." if finetune else
         "Learner: the linear metric on frozen EfficientNet-Lite0 features (the cheapest learner the product has "
         "that embeds a new patient's photo; SOE, fitted by benchmarks.active, cannot), refitted after each round; "
         "the fine-tuned default is scored by --learner finetune (section learning_curve)."),
        "Strict scoring: each budget's model is scored only on triplets whose three photos are all in the held-out "
        "fold (new patients), both folds pooled per seed; the budget-0 row is the frozen centred embedding on the "
        "same folds.",
        f"First budget within 1 pp of the whole pool (mean over seeds): uniform {name(first['uniform'])}, "
        f"active {name(first['active'])}.",
        multiple_tests_note(claims),
    ]
    if args.quick:
        notes.append("--quick: two seeds and three budgets" + (f", {QUICK_STEPS} fine-tuning steps" if finetune else "")
                     + "; not a result")
    print(render_tables(tables))
    print("\n".join(notes))
    title = (f"Learning curve in judgments: the default mode on real wounds ({Path(args.data).name} as the oracle)"
             if finetune else f"Active vs uniform triplet selection on real wounds ({Path(args.data).name} as the oracle)")
    title += " [quick]" if args.quick else ""
    path = write_result(args.section, title, command_line("benchmarks.active_real", argv), seeds, tables, claims,
                        notes, synthetic=False, seconds=time.perf_counter() - t0, results_dir=args.results)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
