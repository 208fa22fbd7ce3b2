"""Active vs uniform triplet selection: SOE agreement against the query budget.

    python -m benchmarks.active [--workspace WS] [--seeds 0 1 2] [--quick]
    python -m benchmarks.active --planted 1000 [--seeds 0 1 2]

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
within 1 pp of its full-budget agreement. Writes ``results/active.json`` (:mod:`benchmarks.results`)
with a one-sided paired t-test over seeds of active > uniform at each budget below 100 %.

``--planted N`` asks the same question at registry scale, where the N·C(N−1, 2) questions
(5·10⁸ for N = 1,000) cannot be enumerated (SYNTHETIC): N objects at planted positions
(dim 8, ``benchmarks.soe.planted_triplets``), an oracle that answers any question with the
same Bradley–Terry noise (τ = 2), a full budget of 500·N questions; uniform asks drawn random
questions (anchors round robin), active draws its pools the same way
(:func:`core.text.sampling.random_questions`). SOE (dim 8) is scored by agreement with the
noise-free planted order on 100,000 held-out random questions. Writes ``results/active_scale.json``.
"""
from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from benchmarks.results import (
    RESULTS_DIR,
    command_line,
    mean_sd_ci,
    multiple_tests_note,
    paired_claim,
    render_tables,
    write_result,
)
from benchmarks.soe import orient_planted, phantom_study, planted_triplets
from core import cli
from core.eval.distances import pairwise_euclidean
from core.eval.metrics import evaluate
from core.text.sampling import (
    ActiveSampler,
    all_questions,
    canonical_key,
    default_active_batch,
    random_questions,
    uniform_order,
)
from core.text.soe import SOE, triplet_margins

BUDGETS = (0.01, 0.02, 0.05, 0.10, 0.15, 0.25, 0.50, 1.00)
QUICK_BUDGETS = (0.01, 0.05, 0.25, 1.00)
PLANTED_BUDGETS = (0.01, 0.02, 0.05, 0.10, 0.15, 0.25, 0.35, 0.50, 0.75, 1.00)
PLANTED_FULL = 500  # full budget: 500 questions per object


def scores(emb: np.ndarray, ids: list[str], expert: list[dict], truth_oriented: np.ndarray) -> tuple[float, float]:
    """(balanced agreement with the expert triplets, agreement with the latent order)."""
    bal = evaluate(ids, pairwise_euclidean(emb), expert)["balanced"]
    return bal, float((triplet_margins(emb, truth_oriented) > 0).mean())


def run_seed(seed: int, ids: list[str], answers: dict[str, np.ndarray], expert: list[dict],
             truth_oriented: np.ndarray, total: int, budgets: tuple[float, ...]) -> dict[str, list[tuple[float, float]]]:
    """Both samplers' (balanced, truth) scores at every budget mark for one run seed."""
    n = len(ids)
    marks = [max(1, int(round(b * total))) for b in budgets]
    keys_all, oriented_all = answers["keys"], answers["oriented"]

    def orient(q: np.ndarray) -> np.ndarray:
        return oriented_all[np.searchsorted(keys_all, canonical_key(q, n))]

    def fit(triplets: np.ndarray) -> np.ndarray:
        return SOE(n_objects=n, random_state=seed).fit(triplets).embedding_

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


def planted_seed(n: int, seed: int, budgets: tuple[float, ...], dim: int = 8, tau: float = 2.0,
                 held_out: int = 100_000) -> dict[str, list[float]]:
    """Uniform and active agreement with the planted order at every budget mark (of PLANTED_FULL·n questions)."""
    x, _ = planted_triplets(n, dim, 0, tau, 0)  # the same planted positions for every run seed
    rng = np.random.default_rng([seed, 7])
    truth = random_questions(n, held_out, np.random.default_rng([0, 8]))
    truth = orient_planted(x, truth, None)

    def ask(q: np.ndarray) -> np.ndarray:
        return orient_planted(x, q, (rng, tau))

    def agreement(oriented: np.ndarray) -> float:
        emb = SOE(n_components=dim, n_objects=n, random_state=seed).fit(oriented).embedding_
        return float((triplet_margins(emb, truth) > 0).mean())

    full = PLANTED_FULL * n
    marks = [max(1, int(round(b * full))) for b in budgets]
    order = random_questions(n, full, np.random.default_rng([seed, 1]))
    answers = ask(order)
    uniform = [agreement(answers[:m]) for m in marks]
    base = max(n, math.ceil(0.005 * full))
    sampler = ActiveSampler(n, base, seed=seed, n_components=dim)
    asked, oriented = np.zeros((0, 3), dtype=np.int64), np.zeros((0, 3), dtype=np.int64)
    active = []
    for m in tqdm(marks, desc=f"active, seed {seed}", unit="mark", leave=False):
        while len(asked) < m:
            size = min(max(base, math.ceil(0.1 * len(asked))), m - len(asked))
            nxt = sampler.next_batch(oriented, canonical_key(asked, n), size)
            asked, oriented = np.concatenate([asked, nxt]), np.concatenate([oriented, ask(nxt)])
        active.append(agreement(oriented))
    return {"uniform": uniform, "active": active}


def planted_main(args: argparse.Namespace, argv: list[str] | None, seeds: list[int]) -> int:
    """``--planted N``: the registry-scale comparison (see the module docstring)."""
    n, budgets, t0 = args.planted, PLANTED_BUDGETS, time.perf_counter()
    results = []
    for seed in seeds:
        results.append(planted_seed(n, seed, budgets))
        print(f"  seed {seed} done ({time.perf_counter() - t0:.0f} s)", flush=True)
    arr = {s: 100 * np.array([r[s] for r in results]) for s in ("uniform", "active")}  # seeds × budgets, %
    full = PLANTED_FULL * n
    rows = [[100 * b, max(1, int(round(b * full))), mean_sd_ci(arr["uniform"][:, i]), mean_sd_ci(arr["active"][:, i])]
            for i, b in enumerate(budgets)]
    tables = [{"caption": f"Agreement (%) with the planted order of SOE fitted on the first budget % of "
                          f"{full:,} questions, {n:,} objects, {len(seeds)} seeds",
               "columns": ["budget %", "triplets", "uniform, vs planted order", "active, vs planted order"],
               "rows": rows}]
    claims = [paired_claim(f"active beats uniform selection at a {100 * b:g}% budget ({n:,} objects)",
                           arr["active"][:, i].tolist(), arr["uniform"][:, i].tolist())
              for i, b in enumerate(budgets[:-1])]
    curve = {s: arr[s].mean(0) / 100 for s in ("uniform", "active")}
    first = {s: first_within(curve[s], budgets) for s in curve}
    uniform_full = float(curve["uniform"][-1])
    first_uniform_target = {s: first_within(curve[s], budgets, target=uniform_full) for s in curve}
    notes = [f"SYNTHETIC: {n:,} objects at planted positions (dim 8, seed 0), oracle with Bradley–Terry noise "
             f"τ = 2; SOE dim 8, default settings; agreement with the noise-free order on 100,000 held-out random "
             f"questions. Active rounds: 0.5 % of the full budget or 10 % of those asked, pools of 4× the round.",
             f"First budget within 1 pp of the full-budget agreement: uniform {100 * first['uniform']:g}% of the "
             f"questions, active {100 * first['active']:g}%.",
             f"First budget within 1 pp of uniform's full-budget agreement ({100 * uniform_full:.2f}%), the same target "
             f"for both: uniform {100 * first_uniform_target['uniform']:g}%, active {100 * first_uniform_target['active']:g}%.",
             multiple_tests_note(claims)]
    print(render_tables(tables))
    print("\n".join(notes))
    path = write_result("active_scale", f"Active vs uniform triplet selection at {n:,} objects (SYNTHETIC)",
                        command_line("benchmarks.active", argv), seeds, tables, claims, notes, synthetic=True,
                        seconds=time.perf_counter() - t0, results_dir=args.results)
    print(f"wrote {path}")
    return 0


def first_within(curve: np.ndarray, budgets: tuple[float, ...], tol: float = 0.01, target: float | None = None) -> float:
    """Smallest budget whose mean agreement is ≥ ``target`` (default: the curve's own full budget) − tol;
    1.0 when none is (another sampler's target may stay out of reach)."""
    goal = (curve[-1] if target is None else target) - tol
    return next((b for b, v in zip(budgets, curve) if v >= goal), 1.0)


def main(argv: list[str] | None = None) -> int:
    """The ``python -m benchmarks.active`` benchmark; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.active", description=__doc__.split("\n\n")[0])
    cli.add_workspace(parser, help="a SYNTHETIC phantom workspace (default: build one)")
    cli.add_device(parser)
    parser.add_argument("--phantom-seed", type=int, default=0, help="seed of the phantom demo and its oracle")
    cli.add_seeds(parser, help="run seeds (question orders, SOE; default 0 1 2)")
    parser.add_argument("--quick", action="store_true",
                        help=f"smoke setting: seeds 0 1, budgets {', '.join(f'{b:.0%}' for b in QUICK_BUDGETS)}".replace("%", "%%"))
    parser.add_argument("--results", type=Path, default=RESULTS_DIR,
                        help="folder of the result file (active.json; active_scale.json with --planted)")
    parser.add_argument("--planted", type=int, metavar="N",
                        help="registry scale: N planted objects, questions drawn, not enumerated (SYNTHETIC)")
    args = cli.parse_args(parser, argv)
    seeds = [0, 1] if args.quick else args.seeds
    if len(seeds) < 2 or len(set(seeds)) != len(seeds):
        parser.error(f"give at least two distinct --seeds for sd, CI and paired tests, got {seeds}")
    if args.planted is not None:
        if args.planted < 10 or args.quick or args.workspace:
            parser.error(f"--planted N needs N ≥ 10 and neither --quick nor --workspace, got {args.planted}")
        return planted_main(args, argv, seeds)
    budgets = QUICK_BUDGETS if args.quick else BUDGETS

    t0 = time.perf_counter()
    ids, questions, oriented, truth, expert = phantom_study(parser, args.workspace, args.phantom_seed)
    n, total = len(ids), len(questions)
    keys = canonical_key(questions, n)
    sort = np.argsort(keys)
    answers = {"keys": keys[sort], "oriented": oriented[sort]}
    D = truth.distance_matrix()
    truth_oriented = all_questions(n)
    flip = D[truth_oriented[:, 0], truth_oriented[:, 1]] > D[truth_oriented[:, 0], truth_oriented[:, 2]]
    truth_oriented[flip, 1], truth_oriented[flip, 2] = truth_oriented[flip, 2], truth_oriented[flip, 1].copy()

    results = []
    for seed in seeds:
        results.append(run_seed(seed, ids, answers, expert, truth_oriented, total, budgets))
        print(f"  seed {seed} done ({time.perf_counter() - t0:.0f} s)", flush=True)
    arr = {s: 100 * np.array([r[s] for r in results]) for s in ("uniform", "active")}  # seeds × budgets × 2, %

    rows = [[100 * b, max(1, int(round(b * total))), *(mean_sd_ci(arr[s][:, i, m]) for m in (0, 1)
                                                       for s in ("uniform", "active"))]
            for i, b in enumerate(budgets)]
    tables = [{"caption": f"Agreement (%) of SOE fitted on the first budget % of questions, {len(seeds)} seeds",
               "columns": ["budget %", "triplets", "uniform, balanced vs expert", "active, balanced vs expert",
                           "uniform, vs latent truth", "active, vs latent truth"], "rows": rows}]
    claims = [paired_claim(f"active beats uniform selection at a {100 * b:g}% budget (balanced agreement)",
                           arr["active"][:, i, 0].tolist(), arr["uniform"][:, i, 0].tolist())
              for i, b in enumerate(budgets[:-1])]
    notes = [f"{n} photos, {total} questions answered by the phantom oracle (no skips, phantom seed "
             f"{args.phantom_seed}); SOE dim 4 with default settings; balanced agreement is with the demo's "
             f"{len(expert)} simulated expert triplets, truth agreement with the noise-free latent order."]
    ceiling = 100 * evaluate(ids, D, expert)["balanced"]
    notes.append(f"The latent truth itself reaches {ceiling:.2f}% balanced agreement with the expert triplets "
                 f"(the planted ceiling of this metric).")
    notes.append(multiple_tests_note(claims))
    for m, label in ((0, "balanced agreement with the expert"), (1, "agreement with the latent truth")):
        first = {s: first_within(arr[s][:, :, m].mean(0) / 100, budgets) for s in ("uniform", "active")}
        notes.append(f"First budget within 1 pp of the full-budget {label}: uniform {100 * first['uniform']:g}%, "
                     f"active {100 * first['active']:g}%.")
    print(render_tables(tables))
    print("\n".join(notes))
    title = "Active vs uniform triplet selection (TriDerm-T)" + (" [quick]" if args.quick else "")
    path = write_result("active", title, command_line("benchmarks.active", argv), seeds, tables, claims, notes,
                        synthetic=True, seconds=time.perf_counter() - t0, results_dir=args.results)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
