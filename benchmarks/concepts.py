"""Concept models on the wound phantoms (synthetic): AUROC, heatmap test, concept bottleneck.

    python -m benchmarks.concepts [--workspace WS] [--epochs 40] [--seed 0] [--quick]

Without ``--workspace`` a phantom dataset is generated and imported into a temporary
workspace. For the untrained heads and the CLIP, MAKE and ConceptCLIP objectives (towers
frozen, same split/epochs/seed) it prints:

1. held-out concept-annotation AUROC per phantom-truth concept and the mean (global,
   local top-k and fused β = 0.5 scores);
2. the heatmap test: over wounds whose planted fibrin patch is visible in the crop, how
   often the fibrin heatmap's peak cell lies on that wound's fibrin (truth/fibrin/<id>.png)
   vs chance (the fraction of cells on fibrin);
3. the concept bottleneck (fused scores of the truth concepts → ``--target``), top 3
   concepts per class next to the 3 concepts whose truth prevalence in the class most
   exceeds their overall prevalence, with the overlap vs the 1/3 expected by chance.

Writes ``results/concepts.json`` (:mod:`benchmarks.results`).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from benchmarks.results import RESULTS_DIR, command_line, render_tables, write_result
from benchmarks.soe import phantom_workspace
from core import cli
from core.concepts.dual_encoder import load_vlm
from core.concepts.scores import ConceptBottleneck, ConceptScorer
from core.concepts.training import (
    TrainConfig,
    Trainer,
    WoundPairs,
    build_text_inputs,
    concept_auroc,
    load_pairs,
    split_holdout,
    target_values,
    truth_concepts,
)
from core.concepts.vocabulary import ConceptTagger, load_vocab

VARIANTS = ("untrained", "clip", "make", "conceptclip")


def heatmap_test(ws, pairs: WoundPairs, heat: np.ndarray, truth: np.ndarray) -> dict[str, float]:
    """Fibrin heatmap peak inside the planted fibrin vs chance (see module docstring)."""
    hits, chance, n = 0, [], 0
    gh, gw = heat.shape[1:]
    fib_dir = Path(ws.root) / "truth" / "fibrin"
    masks: dict[str, np.ndarray] = {}
    for i, (image_id, wi) in enumerate(pairs.keys):
        if not truth[i]:
            continue
        if image_id not in masks:
            masks[image_id] = np.asarray(Image.open(fib_dir / f"{image_id}.png"))
        x0, y0, x1, _y1 = pairs.boxes[i]
        side = x1 - x0
        ys = np.clip((y0 + (np.arange(gh) + 0.5) * side / gh).astype(int), 0, masks[image_id].shape[0] - 1)
        xs = np.clip((x0 + (np.arange(gw) + 0.5) * side / gw).astype(int), 0, masks[image_id].shape[1] - 1)
        on = masks[image_id][np.ix_(ys, xs)] == wi  # gh×gw cell centres on this wound's fibrin
        if not on.any():
            continue
        n += 1
        r, c = np.unravel_index(np.argmax(heat[i]), heat[i].shape)
        hits += int(on[r, c])
        chance.append(on.mean())
    return {"n": n, "rate": hits / n if n else float("nan"), "chance": float(np.mean(chance)) if n else float("nan")}


def truth_lift(labels: np.ndarray, names: list[str], ys: list[str | None], k: int = 3) -> dict[str, list[str]]:
    """Per class, the k concepts whose truth prevalence most exceeds the overall prevalence."""
    overall = labels.mean(0)
    out = {}
    for cls in sorted({y for y in ys if y is not None}):
        sel = np.array([y == cls for y in ys])
        out[cls] = [names[i] for i in np.argsort(-(labels[sel].mean(0) - overall))[:k]]
    return out


def run(ws, epochs: int, seed: int, target: str, size: int) -> dict[str, Any]:
    """Train and score the concept models on the phantom workspace ``ws``; returns the figures."""
    vocab = load_vocab(groups=("wound",))
    tagger = ConceptTagger(vocab)
    pairs = load_pairs(ws, size=size)
    truth = truth_concepts(ws, pairs.keys)
    if truth is None:
        raise SystemExit(f"{ws.root}: no phantom truth (truth/concepts.csv) — this benchmark needs the phantom demo")
    names, labels = truth
    concepts = [c for c in vocab if c.name in names]
    held = split_holdout(pairs.patient_ids, 0.3, seed)
    texts = build_text_inputs(pairs, tagger)
    model = load_vlm(seed=seed)
    init = {k: v.clone() for k, v in model.state_dict().items()}
    ys = target_values(pairs, target)
    results: dict[str, Any] = {"n_wounds": len(pairs), "n_heldout": int(held.sum()), "epochs": epochs, "seed": seed,
                               "synthetic": True, "variants": {}}
    for variant in VARIANTS:
        t0 = time.perf_counter()
        model.load_state_dict(init)
        trainer = Trainer(model, pairs, texts, TrainConfig(objective="clip" if variant == "untrained" else variant,
                                                           epochs=epochs, seed=seed))
        if variant != "untrained":
            trainer.fit(np.flatnonzero(~held), progress=True)
        g, patches, grid = trainer.embed()
        scorer = ConceptScorer(model, concepts)
        sc = scorer.scores(g, patches)
        order = [scorer.names.index(n) for n in names]
        res = {kind: concept_auroc(sc[kind][held][:, order], labels[held], names) for kind in ("global", "local", "fused")}
        heat = scorer.heatmaps(patches, grid)[:, scorer.names.index("fibrin")]
        res["heatmap"] = heatmap_test(ws, pairs, heat, labels[:, names.index("fibrin")])
        known = np.array([y is not None for y in ys])
        cbm = ConceptBottleneck(names, random_state=seed).fit(sc["fused"][known & ~held][:, order],
                                                              [ys[i] for i in np.flatnonzero(known & ~held)])
        res["bottleneck_top3"] = cbm.top_concepts(3)
        res["bottleneck_heldout_accuracy"] = cbm.score(sc["fused"][known & held][:, order],
                                                       [ys[i] for i in np.flatnonzero(known & held)])
        res["seconds"] = round(time.perf_counter() - t0, 1)
        results["variants"][variant] = res
    results["truth_lift_top3"] = truth_lift(labels[np.array([y is not None for y in ys])], names,
                                            [y for y in ys if y is not None])
    results["names"] = names
    return results


def tables_and_notes(res: dict[str, Any]) -> tuple[list[dict], list[str]]:
    """The result file's tables (AUROC per concept, heatmap test, bottleneck) and notes."""
    names, variants = res["names"], list(res["variants"])
    vals = res["variants"].values()
    auroc = [[n, *(r["fused"].get(n) for r in vals)] for n in [*names, "mean"]]
    auroc += [[f"mean ({kind})", *(r[kind].get("mean") for r in vals)] for kind in ("global", "local")]
    heat = [[v, r["heatmap"]["n"], r["heatmap"]["rate"], r["heatmap"]["chance"],
             r["heatmap"]["rate"] / r["heatmap"]["chance"] if r["heatmap"]["chance"] else None]
            for v, r in res["variants"].items()]
    lift = res["truth_lift_top3"]
    cbm = []
    for v, r in res["variants"].items():
        overlaps = [len({n for n, _ in r["bottleneck_top3"][c]} & set(lift[c])) for c in lift]
        cbm.append([v, r["bottleneck_heldout_accuracy"], float(np.mean(overlaps)) / 3, 3 / len(names)])
    tables = [
        {"caption": f"Held-out concept AUROC (fused β = 0.5 unless stated), {res['n_heldout']} of "
                    f"{res['n_wounds']} wounds held out",
         "columns": ["concept", *variants], "rows": auroc},
        {"caption": "Fibrin heatmap peak inside the planted fibrin patch",
         "columns": ["variant", "wounds", "hit rate", "chance", "ratio to chance"], "rows": heat},
        {"caption": f"Concept bottleneck → {res['target']}: held-out accuracy and top-3 overlap with the truth lift",
         "columns": ["variant", "held-out accuracy", "top-3 overlap", "overlap by chance"], "rows": cbm},
    ]
    notes = [f"Towers frozen, {res['epochs']} epochs, {res['size']} px crops, seed {res['seed']}; one seed, so no "
             f"sd or paired test: differences between variants are not tested.",
             "Truth lift per class (the concepts most over-represented in it): "
             + "; ".join(f"{c}: {', '.join(lift[c])}" for c in lift) + "."]
    return tables, notes


def main(argv: list[str] | None = None) -> int:
    """The ``python -m benchmarks.concepts`` benchmark; returns the exit status."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.concepts", description=__doc__.split("\n\n")[0])
    cli.add_workspace(p, help="a phantom workspace (default: generate one in a temp dir)")
    cli.add_device(p)
    cli.add_epochs(p, 40)
    cli.add_seed(p, help="phantom, split, initialisation and training seed")
    p.add_argument("--target", default="body_region")
    cli.deprecated(p, "--size", cli.add_crop_size(p, 160))
    p.add_argument("--quick", action="store_true", help="smoke setting: 2 epochs, 96 px crops")
    p.add_argument("--results", type=Path, default=RESULTS_DIR, help="folder of the result file concepts.json")
    args = cli.parse_args(p, argv)
    epochs, size = (2, 96) if args.quick else (args.epochs, args.crop_size)
    if epochs < 1 or size < 32:
        p.error(f"--epochs must be ≥ 1 and --crop-size ≥ 32, got {epochs} and {size}")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        if args.workspace:
            from annotations.infra.workspace import Workspace

            ws = Workspace(args.workspace)
        else:
            ws = phantom_workspace(Path(tmp), args.seed)
        res = run(ws, epochs, args.seed, args.target, size)
    res.update(target=args.target, size=size)
    tables, notes = tables_and_notes(res)
    print(render_tables(tables))
    print("\n".join(notes))
    title = "Concept models (CLIP, MAKE, ConceptCLIP) on the wound phantoms" + (" [quick]" if args.quick else "")
    path = write_result("concepts", title, command_line("benchmarks.concepts", argv), [args.seed], tables,
                        notes=notes, synthetic=True, seconds=time.perf_counter() - t0, results_dir=args.results)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
