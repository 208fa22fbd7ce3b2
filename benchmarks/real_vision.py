"""Real wounds: TriDerm-V against its frozen backbone, and learning from the expert's triplets.

    python -m benchmarks.real_vision --data ../shared/data/azh-dev [--seeds 0 1 2] [--quick]

Any dataset folder in the product layout. Rows (balanced agreement with the dataset's triplets,
mean ± sd over seeds and the 95% t-interval over seeds; wall time; peak RSS of the process so far):

- frozen EfficientNet-Lite0, mean pooling: the old tokens (stage 5) and the new (full depth at
  output stride 16), Euclidean; and the new tokens with centred unit-length embeddings;
- TriDerm-V self-supervised: the paper's recipe, the real-data default, and the default with
  mean instead of attention pooling (each seed draws its own augmented views);
- supervised, out of fold over patient-disjoint folds (:mod:`core.vision.supervised`): a linear
  metric on the frozen features (the baseline), the same with as many random starts as the
  supervised mode's ensemble of heads (their distances added), and TriDerm-V ``--supervise triplets``;
- the learning curve: out-of-fold agreement against the number of expert triplets used.

Paired tests compare rows over patients (each patient's mean anchor accuracy, averaged over
seeds). Without triplets (e.g. Medetec) only the costs are measured, and the agreement and
supervised rows are skipped with the reason. Writes ``results/<section>.json``.
"""
from __future__ import annotations

import argparse
import resource
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy import stats
from tqdm import tqdm

from annotations.dataset import import_dataset
from annotations.workspace import Workspace
from benchmarks.results import write_result
from core import cli
from core.eval.distances import pairwise_euclidean
from core.eval.metrics import evaluate
from core.runtime import torch_threads
from core.vision.backbones import load_backbone
from core.vision.baseline import image_means
from core.vision.features import FeatureCache, TokenBank, workspace_wounds
from core.vision.pooling import MeanPooling
from core.vision.supervised import LinearMetric, cross_validate, patient_folds, patient_of, patient_paired_test
from core.vision.triderm import DEFAULTS, PAPER_RECIPE, TriDermTrainer, normalized, oriented_expert

SEARCH_LOG = Path(__file__).with_name("real_vision_search.md")
CURVE = (50, 100, 250, 500, 1000, None)
#: the linear metric given the supervised mode's ensemble (that many random starts, distances added)
LINEAR_ENSEMBLE = "linear metric on frozen new tokens, ensemble of {} starts, out of fold"


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def configurations_tried() -> tuple[int, int]:
    """Configurations tried on real data before the defaults were frozen (the search log): the
    self-supervised recipe's (table rows) and the supervised mode's (bullets of its section)."""
    text = SEARCH_LOG.read_text()
    recipe, _, supervised = text.partition("## Supervised mode")
    rows = sum(1 for line in recipe.splitlines() if line.startswith("| ") and "---" not in line) - 1
    return rows, sum(1 for line in supervised.splitlines() if line.startswith("- "))


class Bench:
    """One dataset in a workspace: its photos, triplets, patients, and the rows measured on it."""

    def __init__(self, ws: Workspace, folds: int, progress: bool) -> None:
        self.ws, self.k, self.progress = ws, folds, progress
        self.image_ids, self.keys = workspace_wounds(ws)
        self.expert = ws.store.expert_triplets()
        self.triplets = oriented_expert(ws, self.image_ids)
        self.patients = patient_of(ws.store.images())
        self.rows: dict[str, dict[str, Any]] = {}

    def record(self, name: str, seed: int, fn: Callable[[], np.ndarray | None]) -> None:
        """Time ``fn`` (returns an image-distance matrix in ``image_ids`` order, or None)."""
        t0 = time.perf_counter()
        D = fn()
        row = self.rows.setdefault(name, {"balanced": [], "seconds": [], "per_anchor": []})
        row["seconds"].append(time.perf_counter() - t0)
        row["peak_rss_mb"] = peak_rss_mb()
        if D is not None and self.expert:
            m = evaluate(self.image_ids, D, self.expert, ci=True)
            row["balanced"].append(m["balanced"])
            row["per_anchor"].append({r["anchor"]: r["accuracy"] for r in m["per_anchor"]})

    def folds_rows(self, seed: int) -> list[np.ndarray]:
        row = {i: n for n, i in enumerate(self.image_ids)}
        return [np.array([row[i] for i in f]) for f in patient_folds(self.image_ids, self.patients, self.k, seed)]


def frozen_bank(ws: Workspace, layer: str, keys: list, image_ids: list, views: int, seed: int,
                progress: bool) -> TokenBank:
    backbone = load_backbone("efficientnet-lite0", layer=layer)
    photos = FeatureCache(ws, backbone, seed=seed).build(image_ids, views, progress)
    with torch_threads(1):
        return TokenBank(photos, keys)


def frozen_embedding(bank: TokenBank) -> np.ndarray:
    with torch.no_grad():
        wound, _ = MeanPooling()(bank.eval_tokens, bank.eval_segment, len(bank))
    return image_means(bank.wound_keys, wound.numpy())[1]


def run(args: argparse.Namespace, ws: Workspace) -> dict[str, Any]:
    b = Bench(ws, args.folds, not args.quiet)
    has_triplets = len(b.triplets) > 0
    epochs = {"epochs": 5} if args.quick else {}
    recipes = {
        "TriDerm-V, paper recipe (attention, 512-d, raw distances)": {**PAPER_RECIPE, **epochs},
        "TriDerm-V, real-data default (attention, 128-d, centred unit length)": {**DEFAULTS, **epochs},
        "TriDerm-V, default with mean pooling": {**DEFAULTS, **epochs, "pooling": "mean"},
    }
    supervised = {**DEFAULTS, "supervise": "triplets", **({"supervise_steps": 30} if args.quick else {})}
    heads = supervised["supervise_heads"]
    skipped: dict[str, str] = {}
    if not has_triplets:
        skipped["agreement and supervised rows"] = (f"{args.data} has no triplets: nothing to agree with, and no "
                                                    "judgments to learn from; only costs are measured")
    curve: dict[str, dict[str, list[float]]] = {"linear metric": {}, "TriDerm-V supervised": {}}
    stage5 = frozen_bank(ws, "stage5", b.keys, b.image_ids, 0, 0, b.progress)
    for seed in tqdm(args.seeds, desc="seeds", unit="seed", disable=args.quiet):
        b.record("frozen, old tokens (stage 5), mean pooling", seed, lambda: pairwise_euclidean(frozen_embedding(stage5)))
        bank: dict[str, TokenBank] = {}
        b.record("frozen, new tokens (full, OS 16), mean pooling", seed, lambda: pairwise_euclidean(frozen_embedding(
            bank.setdefault("b", frozen_bank(ws, "full", b.keys, b.image_ids, args.views, seed, b.progress)))))
        full = bank["b"]
        frozen = frozen_embedding(full)
        b.record("frozen, new tokens, mean pooling, centred unit length", seed,
                 lambda: pairwise_euclidean(normalized(frozen, "center-l2")[0]))
        for name, cfg in recipes.items():
            trainer = TriDermTrainer(full, {**cfg, "seed": seed}, torch.device("cpu"), b.image_ids)
            b.record(name, seed, lambda: pairwise_euclidean(trainer.embed(trainer.fit()[0])[1]))
        if not has_triplets:
            continue
        budgets = CURVE if seed == args.seeds[0] and not args.quick else (None,)
        for budget in budgets:
            lm_name = "linear metric on frozen new tokens, out of fold" + (f" ({budget} triplets)" if budget else "")

            def linear_cv(starts: list[int]) -> np.ndarray:
                """Out-of-fold distances of linear metrics from ``starts`` (random states), squared distances added."""
                def fold(train: np.ndarray, test_rows: np.ndarray) -> np.ndarray:
                    return pairwise_euclidean(np.hstack([LinearMetric(random_state=r).fit(frozen, train)
                                                         .transform(frozen) for r in starts]))

                return cross_validate(len(b.image_ids), b.folds_rows(seed), b.triplets, fold, budget, seed)

            b.record(lm_name, seed, lambda: linear_cv([seed]))
            if budget is None and heads > 1:
                b.record(LINEAR_ENSEMBLE.format(heads), seed,
                         lambda: linear_cv([seed * heads + h for h in range(heads)]))
            sup = TriDermTrainer(full, {**supervised, "seed": seed}, torch.device("cpu"), b.image_ids)
            sv_name = (f"TriDerm-V --supervise triplets ({heads} metric head{'s' * (heads > 1)}, "
                       f"{supervised['supervise_pooling']} pooling, augmented views), out of fold"
                       + (f" ({budget} triplets)" if budget else ""))
            b.record(sv_name, seed, lambda: sup.cross_validate(b.triplets, b.patients, b.k, budget,
                                                               progress=b.progress)[0])
            if budgets != (None,):
                n = budget or int(np.mean([(~np.isin(b.triplets, r).any(1)).sum() for r in b.folds_rows(seed)]))
                curve["linear metric"].setdefault(str(n), []).extend(b.rows[lm_name]["balanced"][-1:])
                curve["TriDerm-V supervised"].setdefault(str(n), []).extend(b.rows[sv_name]["balanced"][-1:])
    return {"bench": b, "skipped": skipped, "curve": curve}


def summary(values: list[float]) -> dict[str, Any] | None:
    if not values:
        return None
    a = np.asarray(values, dtype=float)
    sd = float(a.std(ddof=1)) if len(a) > 1 else 0.0
    half = float(stats.t.ppf(0.975, len(a) - 1) * sd / np.sqrt(len(a))) if len(a) > 1 else 0.0
    return {"mean": float(a.mean()), "sd": sd, "ci": [float(a.mean() - half), float(a.mean() + half)]}


def mean_per_anchor(row: dict[str, Any]) -> list[dict[str, Any]]:
    anchors = set().union(*row["per_anchor"]) if row["per_anchor"] else set()
    return [{"anchor": a, "accuracy": float(np.mean([p[a] for p in row["per_anchor"] if a in p]))} for a in anchors]


def compare(b: Bench, a: str, base: str, claim: str) -> dict[str, Any] | None:
    if a not in b.rows or base not in b.rows or not b.rows[a]["per_anchor"]:
        return None
    t = patient_paired_test(mean_per_anchor(b.rows[a]), mean_per_anchor(b.rows[base]), b.patients)
    holds = t["mean_diff"] > 0 and t["t_p"] < 0.05
    return {"claim": claim, "test": f"mean difference {100 * t['mean_diff']:+.1f} pp; paired t-test over "
                                    f"{t['n_patients']} patients, Wilcoxon p = {t['wilcoxon_p']:.2g}",
            "p": t["t_p"], "holds": bool(holds)}


def report(args: argparse.Namespace, out: dict[str, Any], seconds: float) -> dict[str, Any]:
    b: Bench = out["bench"]
    rows = []
    for name, r in b.rows.items():
        s = summary([100 * x for x in r["balanced"]])
        rows.append([name, s, round(float(np.mean(r["seconds"])), 1), round(r["peak_rss_mb"])])
    frozen_rows = [n for n in b.rows if n.startswith("frozen") and b.rows[n]["balanced"]]
    best_frozen = max(frozen_rows, key=lambda n: np.mean(b.rows[n]["balanced"])) if frozen_rows else None
    default = "TriDerm-V, real-data default (attention, 128-d, centred unit length)"
    supervised_row = next((n for n in b.rows if n.startswith("TriDerm-V --supervise") and "triplets)" not in n), "")
    claims = [c for c in (
        compare(b, default, best_frozen, f"the real-data default beats the best frozen row ({best_frozen})")
        if best_frozen else None,
        compare(b, default, "TriDerm-V, paper recipe (attention, 512-d, raw distances)",
                "the real-data default beats the paper recipe"),
        compare(b, default, "TriDerm-V, default with mean pooling", "attention pooling beats mean pooling"),
        compare(b, supervised_row, "linear metric on frozen new tokens, out of fold",
                "the supervised mode beats the linear metric (both out of fold)"),
        compare(b, supervised_row, LINEAR_ENSEMBLE.format(DEFAULTS["supervise_heads"]),
                "the supervised mode beats the linear metric given the same ensemble (both out of fold)"),
        compare(b, supervised_row, best_frozen,
                "the supervised mode (out of fold) beats the best frozen row") if best_frozen else None,
    ) if c is not None]
    curve_rows = [[method, int(n), summary([100 * v for v in vals])]
                  for method, points in out["curve"].items() for n, vals in points.items()]
    recipe, supervised = configurations_tried()
    notes = [f"{recipe} self-supervised recipe configurations and {supervised} supervised-mode configurations were "
             f"tried on azh-dev before the defaults were frozen ({SEARCH_LOG.name}); the rows above are the frozen "
             "defaults' final run."]
    notes += [f"skipped {k}: {v}" for k, v in out["skipped"].items()]
    if args.quick:
        notes.append("--quick: 5 training epochs, 30 metric-head steps, 4 views, one seed; not a result")
    command = " ".join(["python -m benchmarks.real_vision --data", str(args.data),
                        *([f"--seeds {' '.join(map(str, args.seeds))}"] if args.seeds != [0, 1, 2] else []),
                        *([f"--section {args.section}"] if args.section != "real_vision" else []),
                        *(["--quick"] if args.quick else [])])
    tables = [{"caption": f"Balanced agreement (%) with {len(b.expert)} triplets of {Path(args.data).name}, "
                          f"{len(b.image_ids)} photos, {len(set(b.patients.values()))} patients; "
                          f"{args.folds} patient-disjoint folds for the out-of-fold rows",
               "columns": ["row", "balanced %", "seconds / seed", "peak RSS MB"], "rows": rows},
              {"caption": "Learning curve: out-of-fold balanced agreement (%) against the expert triplets "
                          "used for training per fold (first seed)",
               "columns": ["method", "training triplets", "balanced %"], "rows": curve_rows}]
    return {"section": args.section, "title": f"Real wounds: TriDerm-V vs its frozen backbone ({Path(args.data).name})",
            "command": command, "seeds": list(args.seeds), "tables": tables, "claims": claims, "notes": notes,
            "synthetic": False, "seconds": seconds}


def print_report(res: dict[str, Any]) -> None:
    for table in res["tables"]:
        print(f"\n{table['caption']}")
        for row in table["rows"]:
            cells = []
            for c in row:
                if isinstance(c, dict):
                    cells.append(f"{c['mean']:.1f} ± {c['sd']:.1f} [{c['ci'][0]:.1f}, {c['ci'][1]:.1f}]")
                else:
                    cells.append("n/a" if c is None else str(c))
            print("  " + " | ".join(cells))
    for c in res["claims"]:
        verdict = "holds" if c["holds"] else "does not hold"
        print(f"- {c['claim']}: {verdict} (p = {c['p']:.3g}; {c['test']})")
    for n in res["notes"]:
        print(f"note: {n}")
    print(f"{res['seconds']:.0f} s wall")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.real_vision", description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, required=True, help="a dataset folder in the product layout")
    cli.add_seeds(p)
    cli.add_device(p)
    p.add_argument("--views", type=int, default=DEFAULTS["views"])
    p.add_argument("--folds", type=int, default=5)
    p.add_argument("--quick", action="store_true",
                   help="5 epochs, 30 metric-head steps, 4 views, one seed, no learning curve (a smoke run)")
    cli.add_workspace(p, type=Path, help="reuse this workspace (and its feature cache)")
    p.add_argument("--section", default="real_vision")
    p.add_argument("--results", type=Path, default=Path(__file__).resolve().parents[1] / "results")
    p.add_argument("--quiet", action="store_true")
    args = cli.parse_args(p, argv)
    if not (args.data / "images").is_dir():
        p.error(f"--data {args.data}: no images/ folder (expected the product's dataset layout)")
    if args.quick:
        args.seeds, args.views = args.seeds[:1], 4
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="real-vision-") as tmp:
        ws = Workspace(args.workspace or Path(tmp) / "ws")
        if not ws.store.images():
            import_dataset(ws, args.data)
        if not workspace_wounds(ws)[1]:
            p.error(f"--data {args.data}: no wounds")
        res = report(args, run(args, ws), time.perf_counter() - t0)
    print_report(res)
    target = write_result(results_dir=args.results, **res)
    print(f"→ {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
