"""Real wounds: the backbone's last stage adapted without labels on other wound photos, scored on new patients.

    python -m benchmarks.real_vision_adapt --data ../shared/data/azh-dev --unlabelled DIR [DIR ...] [--quick]

Issue 30 §4's self-supervised adaptation: EfficientNet-Lite0's last stage + head
(:meth:`~core.vision.finetune.LastStageTuner.adapt`, one fixed configuration) learn by VICReg between cached
augmented views of every photo of the ``--unlabelled`` dataset folders, no label used. No photo of ``--data`` is
in them, so one adaptation serves every split and every triplet stays strict (all three photos unseen). Each
seed draws one random patient-disjoint split of ``--data`` into 2 folds, as ``benchmarks.real_vision`` does;
rows: the frozen centred embedding (the baseline) and the adapted tail's, both centred on the training
fold's photos, unit length; the claim is a paired test over patients on the strict records.
Writes ``results/<section>.json``.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from annotations.infra.workspace import Workspace
from annotations.io.dataset import import_dataset
from benchmarks.real_vision import FROZEN, Bench, cell, compare, frozen_bank, print_report, stage6_photos
from benchmarks.results import write_result
from core import cli
from core.eval.distances import pairwise_euclidean
from core.eval.protocol import cross_validate
from core.vision.backbones import load_backbone
from core.vision.baseline import mean_pooled, normalized
from core.vision.features import PhotoFeatures, workspace_wounds
from core.vision.finetune import AdaptConfig, FineTuneConfig, LastStageTuner

ADAPTED = "last stage + head adapted without labels on other wound photos (VICReg), centred unit length"
#: the cached augmented views per photo (the real_vision section's)
VIEWS = 4


def unlabelled_photos(folders: list[Path], tmp: Path, progress: bool) -> tuple[list[PhotoFeatures], dict[str, int]]:
    """Every outlined photo of ``folders`` as stage-6 features, and each folder's count."""
    photos, counts = [], {}
    for n, folder in enumerate(folders):
        ws = Workspace(tmp / f"unlabelled-{n}")
        import_dataset(ws, folder)
        ids = workspace_wounds(ws)[0]
        photos += stage6_photos(ws, ids, VIEWS, progress)
        counts[folder.name] = len(ids)
    return photos, counts


def run(args: argparse.Namespace, ws: Workspace, tmp: Path) -> dict[str, Any]:
    """Adapt once on the unlabelled folders, then score both rows on every seed's split."""
    b = Bench(ws, 2, not args.quiet)
    if not len(b.triplets):
        raise SystemExit(f"--data {args.data}: no triplets to score against")
    stage6 = load_backbone("efficientnet-lite0", layer="stage6")
    config = AdaptConfig(steps=5, batch_photos=8) if args.quick else AdaptConfig()
    t0 = time.perf_counter()
    extra, counts = unlabelled_photos(args.unlabelled, tmp, b.progress)
    adapter = LastStageTuner(stage6, extra, device=args.device)
    adapted = adapter.adapt(config, b.progress)
    adapt_seconds = time.perf_counter() - t0
    tuner = LastStageTuner(stage6, stage6_photos(ws, b.image_ids, VIEWS, b.progress),
                           FineTuneConfig(test_views=False), device=args.device, start=adapted)  # the inference view
    frozen = mean_pooled(frozen_bank(ws, "full", b.keys, b.image_ids, 0, b.progress))[2]
    for seed in tqdm(args.seeds, desc="seeds", unit="seed", disable=args.quiet):
        split = [b.split(seed)]
        b.record(FROZEN, lambda: cross_validate(split, b.triplets, lambda train, rows: pairwise_euclidean(
            normalized(frozen, "center-l2", np.setdiff1d(np.arange(len(frozen)), rows))[0])))
        b.record(ADAPTED, lambda: cross_validate(split, b.triplets, lambda train, rows: pairwise_euclidean(
            tuner.untuned(np.setdiff1d(np.arange(len(frozen)), rows)).transform())))
    return {"bench": b, "config": config, "counts": counts, "adapt_seconds": adapt_seconds, "losses": adapter.losses}


def report(args: argparse.Namespace, out: dict[str, Any], seconds: float) -> dict[str, Any]:
    """The result record: the two rows, the paired claim and what the adaptation saw."""
    b: Bench = out["bench"]
    rows = []
    for name in (FROZEN, ADAPTED):
        strict, anchor = b.summary(name, "strict"), b.summary(name, "anchor_unseen")
        rows.append([name, cell(strict), cell(anchor), strict["n"]])
    claim = compare(b, ADAPTED, FROZEN, "adapting the last stage without labels beats the frozen centred embedding "
                                        "(strict)")
    config, losses = out["config"], out["losses"]
    seen = ", ".join(f"{name} {n}" for name, n in out["counts"].items())
    notes = [f"adaptation (one fixed configuration, written down before it was run, not searched): "
             f"{', '.join(f'{k} {v}' for k, v in asdict(config).items())}; VICReg between two of each photo's "
             f"{VIEWS + 1} cached views (the inference view and {VIEWS} augmented) through a projector that is "
             f"then dropped; batch-norm statistics stay ImageNet's; {sum(out['counts'].values())} unlabelled photos "
             f"({seen}), none of {Path(args.data).name}'s; loss {losses[0]:.2f} → {losses[-1]:.2f}; "
             f"{out['adapt_seconds']:.0f} s with its feature cache",
             "one adaptation serves every seed: the seeds differ by their patient split only"]
    if args.quick:
        notes.append("--quick: 5 adaptation steps of 8 photos, one seed; not a result")
    command = " ".join(["python -m benchmarks.real_vision_adapt --data", str(args.data), "--unlabelled",
                        *map(str, args.unlabelled),
                        *([f"--seeds {' '.join(map(str, args.seeds))}"] if args.seeds != [0, 1, 2] else []),
                        *([f"--section {args.section}"] if args.section != "real_vision_adapt" else []),
                        *(["--quick"] if args.quick else [])])
    tables = [b.strict_table(args.data, ["row", "strict %", "anchor unseen %", "strict triplets scored"], rows)]
    return {"section": args.section, "title": "Real wounds: the last stage adapted without labels "
                                              f"({Path(args.data).name})",
            "command": command, "seeds": list(args.seeds), "tables": tables,
            "claims": [claim] if claim is not None else [], "notes": notes, "synthetic": False, "seconds": seconds}


def main(argv: list[str] | None = None) -> int:
    """The ``python -m benchmarks.real_vision_adapt`` benchmark; returns the exit status."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.real_vision_adapt", description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, required=True, help="a dataset folder with triplets (the product layout)")
    p.add_argument("--unlabelled", type=Path, nargs="+", required=True,
                   help="dataset folders whose photos (with their masks) adapt the last stage, no label used")
    cli.add_seeds(p)
    cli.add_device(p)
    p.add_argument("--quick", action="store_true", help="5 adaptation steps, one seed (a smoke run)")
    p.add_argument("--section", default="real_vision_adapt")
    p.add_argument("--results", type=Path, default=Path(__file__).resolve().parents[1] / "results")
    p.add_argument("--quiet", action="store_true")
    args = cli.parse_args(p, argv)
    for folder in (args.data, *args.unlabelled):
        if not (folder / "images").is_dir():
            p.error(f"{folder}: no images/ folder (expected the product's dataset layout)")
    if args.quick:
        args.seeds = args.seeds[:1]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="real-vision-adapt-") as tmp:
        ws = Workspace(Path(tmp) / "ws")
        import_dataset(ws, args.data)
        res = report(args, run(args, ws, Path(tmp)), time.perf_counter() - t0)
    print_report(res)
    print(f"→ {write_result(results_dir=args.results, **res)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
