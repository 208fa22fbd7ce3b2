"""Real wounds: directions past the default fine-tune (issue 53 §4), each one fixed configuration written down
before it ran (benchmarks/real_vision_search.md), scored strict on new patients and paired against one fine-tune's
inference view.

    python -m benchmarks.real_vision_directions --data ../shared/data/azh-dev [--seeds 0 1 2] [--quick]

The folds, the protocols and the fine-tuned default are :mod:`benchmarks.real_vision`'s (one random
patient-disjoint 2-fold split per seed; the default's fit is the fine-tune row's, same seed). Rows:

- the fine-tune's inference view alone (the default before test-time views; its real_vision figure to the digit);
- **test-time views** (the default since this benchmark): the same fitted tail, each photo the mean of its tuned
  embeddings over the inference view and its cached augmented views (as the frozen test-time-views row does for the
  frozen backbone);
- **an ensemble over seeds**: :data:`MEMBERS` tails fitted with their own seeds on the same fold (the first is the
  default's), squared distances averaged (the members' unit embeddings concatenated);
- the ensemble with test-time views.

Paired tests over patients against the inference view, the default's test-time views and frozen centred. Writes ``results/<section>.json``.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from benchmarks.real_vision import (
    FROZEN,
    Bench,
    add_dataset_options,
    cell,
    check_dataset,
    compare,
    frozen_bank,
    run_on_dataset,
    stage6_photos,
)
from core import cli
from core.eval.distances import pairwise_euclidean
from core.eval.protocol import cross_validate
from core.vision.backbones import load_backbone
from core.vision.baseline import mean_pooled, normalized
from core.vision.finetune import FineTuneConfig, LastStageTuner
from core.vision.triderm_config import DEFAULT

#: tails in the ensemble; member m is fitted with seed ``seed + SEED_STRIDE · m`` (member 0: the default's fit)
MEMBERS = 3
SEED_STRIDE = 1000
INFERENCE_ROW = "fine-tuned last stage, inference view alone (the default before test-time views)"
VIEWS_ROW = "fine-tuned last stage, mean over the inference view and the augmented views (test-time views, the default)"
ENSEMBLE_ROW = f"ensemble of {MEMBERS} fine-tuned last stages (own seeds), squared distances averaged"
BOTH_ROW = f"ensemble of {MEMBERS} fine-tuned last stages with test-time views"


def run(args: argparse.Namespace, ws: Any) -> dict[str, Any]:
    """Fit every member on every seed's folds once; score the four rows and frozen centred from the same fits."""
    b = Bench(ws, args.folds, not args.quiet)
    if not len(b.triplets):
        raise SystemExit(f"--data {args.data}: no triplets to score against")
    frozen = mean_pooled(frozen_bank(ws, "full", b.keys, b.image_ids, 0, b.progress))[2]
    tune = FineTuneConfig(steps=10) if args.quick else FineTuneConfig()
    tuner = LastStageTuner(load_backbone("efficientnet-lite0", layer="stage6"),
                           stage6_photos(ws, b.image_ids, args.views, b.progress), tune)
    everyone = np.arange(len(b.image_ids))
    for seed in tqdm(args.seeds, desc="seeds", unit="seed", disable=args.quiet):
        split = [b.split(seed)]
        fits: dict[bytes, list[tuple[np.ndarray, np.ndarray]]] = {}

        def members(train: np.ndarray, rows: np.ndarray, seed: int = seed) -> list[tuple[np.ndarray, np.ndarray]]:
            """Each member's (inference-view, test-time-views) embeddings for the fold ``rows``, fitted once."""
            key = rows.tobytes()
            if key not in fits:
                fit_rows = np.setdiff1d(everyone, rows)
                fits[key] = [(t.transform(False), t.transform(True)) for t in
                             (tuner.fit(train, fit_rows, seed + SEED_STRIDE * m) for m in range(MEMBERS))]
            return fits[key]

        def row(first_only: bool, views: bool):
            def fit_fold(train: np.ndarray, rows: np.ndarray) -> np.ndarray:
                chosen = members(train, rows)[:1] if first_only else members(train, rows)
                return pairwise_euclidean(np.hstack([z[views] for z in chosen]) / np.sqrt(len(chosen)))
            return lambda: cross_validate(split, b.triplets, fit_fold)

        b.record(FROZEN, lambda: cross_validate(split, b.triplets, lambda train, rows: pairwise_euclidean(
            normalized(frozen, "center-l2", np.setdiff1d(everyone, rows))[0])))
        b.record(INFERENCE_ROW, row(True, False))
        b.record(VIEWS_ROW, row(True, True))
        b.record(ENSEMBLE_ROW, row(False, False))
        b.record(BOTH_ROW, row(False, True))
    return {"bench": b, "tune": tune}


def report(args: argparse.Namespace, out: dict[str, Any], seconds: float) -> dict[str, Any]:
    """The result record: the rows, the paired claims against the default and frozen centred."""
    b: Bench = out["bench"]
    rows = []
    for name in (FROZEN, INFERENCE_ROW, VIEWS_ROW, ENSEMBLE_ROW, BOTH_ROW):
        strict, anchor = b.summary(name, "strict"), b.summary(name, "anchor_unseen")
        rows.append([name, cell(strict), cell(anchor), strict["n"], round(float(np.sum(b.rows[name]["seconds"])), 1)])
    claims = [c for c in (
        compare(b, VIEWS_ROW, INFERENCE_ROW, "test-time views beat the fine-tune's inference view alone (strict)"),
        compare(b, ENSEMBLE_ROW, INFERENCE_ROW, f"an ensemble of {MEMBERS} seeds beats one fine-tune, inference view "
                                                "(strict)"),
        compare(b, BOTH_ROW, INFERENCE_ROW, "the ensemble with test-time views beats one fine-tune, inference view "
                                            "(strict)"),
        compare(b, BOTH_ROW, VIEWS_ROW, f"an ensemble of {MEMBERS} seeds adds to the default's test-time views "
                                        "(strict; a comparison of the pre-registered rows, not itself registered)"),
        compare(b, INFERENCE_ROW, FROZEN, "the fine-tune's inference view beats the frozen centred embedding (strict)"),
        compare(b, BOTH_ROW, FROZEN, "the ensemble with test-time views beats the frozen centred embedding (strict)"),
    ) if c is not None]
    tune = out["tune"]
    notes = [f"one fixed configuration per direction, written down before the run (real_vision_search.md, "
             f"issue 53 §4), none searched: the default's fine-tune ({tune.steps} AdamW steps at {tune.lr:g}, cosine; "
             f"margin {tune.margin:g}; {tune.batch_triplets} triplets per step); test-time views over the "
             f"inference view and {args.views} cached augmented views (seed 0's, shared by every seed); "
             f"{MEMBERS} ensemble members seeded seed + {SEED_STRIDE}·m",
             "seconds: the row's total over seeds; the ensemble rows' fits are made once and shared (the default's "
             "row pays the three members' fits, the other rows reuse them)"]
    if args.quick:
        notes.append("--quick: 10 fine-tuning steps, one seed; not a result")
    command = " ".join(["python -m benchmarks.real_vision_directions --data", str(args.data),
                        *([f"--seeds {' '.join(map(str, args.seeds))}"] if args.seeds != [0, 1, 2] else []),
                        *([f"--views {args.views}"] if args.views != DEFAULT.views and not args.quick else []),
                        *([f"--section {args.section}"] if args.section != "real_vision_directions" else []),
                        *(["--quick"] if args.quick else [])])
    tables = [b.strict_table(args.data, ["row", "strict %", "anchor unseen %", "strict triplets scored",
                                         "seconds"], rows)]
    return {"section": args.section, "title": f"Real wounds: past the default fine-tune ({Path(args.data).name})",
            "command": command, "seeds": list(args.seeds), "tables": tables, "claims": claims, "notes": notes,
            "synthetic": False, "seconds": seconds}


def main(argv: list[str] | None = None) -> int:
    """The ``python -m benchmarks.real_vision_directions`` benchmark; returns the exit status."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.real_vision_directions",
                                description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, required=True, help="a dataset folder with triplets (the product layout)")
    cli.add_seeds(p)
    p.add_argument("--views", type=int, default=4, help="cached augmented views per photo (default 4, as "
                                                        "benchmarks.real_vision's recorded run)")
    p.add_argument("--quick", action="store_true", help="10 fine-tuning steps, one seed (a smoke run)")
    add_dataset_options(p, "real_vision_directions")
    args = cli.parse_args(p, argv)
    check_dataset(p, args)
    if args.quick:
        args.seeds = args.seeds[:1]
    return run_on_dataset(p, args, "real-vision-directions-", run, report)


if __name__ == "__main__":
    raise SystemExit(main())
