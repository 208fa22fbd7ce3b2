"""Real wounds: how often a new patient's nearest photos share the specialist's wound type.

    python -m benchmarks.real_retrieval --data ../shared/data/azh-dev [--seeds 0 1 2] [--views 4] [--quick]

Any dataset folder in the product layout whose photos carry a type label (``images.csv`` column
``--label``, default ``wound_type``) and whose triplets train the fine-tuned row. The folds are
:mod:`benchmarks.real_vision`'s (:class:`~benchmarks.real_vision.Bench`, :class:`~benchmarks.real_vision.Methods`):
every seed draws one random patient-disjoint split into ``--folds`` halves, and a fold's model learns only
from the triplets and photos outside the fold. Each photo of the fold is then a query
(:func:`core.eval.retrieval.same_label_retrieval`: precision@1, 5, 10 and average precision of same-type
neighbours; the query and every photo of its own patient are never candidates) against two galleries:

- **strict** — the other held-out patients' photos only: no photo of the ranking was seen by training;
- **archive** — every other patient's photo, training photos included (a new photo searched among the
  study's photos, embedded by the same fold model).

Rows: the frozen centred embedding, the fine-tuned last stage + head (the real-data supervised default, with its
test-time views) and the same fits' inference view alone, each with its strict triplet agreement on the same folds
beside it, and chance (the query's type's share of
its candidates, what a random ranking's precision averages). A query's figures are averaged over seeds;
95 % CIs resample patients; paired tests compare rows over patients. Writes ``results/<section>.json``.
"""
from __future__ import annotations

import argparse
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from annotations.infra.workspace import Workspace
from benchmarks.real_vision import (
    FINETUNE,
    FROZEN,
    Bench,
    Methods,
    add_dataset_options,
    check_dataset,
    dataset_workspace,
    frozen_bank,
    stage6_photos,
)
from benchmarks.results import command_line, multiple_tests_note, render_tables, write_result
from core import cli
from core.eval.protocol import cross_validate, patient_paired_test
from core.eval.retrieval import RETRIEVAL_KS, retrieval_summary, same_label_retrieval
from core.runtime import torch_threads
from core.vision.backbones import load_backbone
from core.vision.baseline import mean_pooled
from core.vision.finetune import FineTuneConfig, LastStageTuner
from core.vision.triderm_config import DEFAULT

GALLERIES = ("strict", "archive")
CHANCE = "chance: the query's type's share of its candidates (a random ranking)"
INFERENCE_ROW = "the same fine-tuned last stage, inference view alone (the default before test-time views; same fits)"
METRICS = (*(f"p@{k}" for k in RETRIEVAL_KS), "ap")
QUICK_STEPS = 10


def labels_of(ws: Workspace, image_ids: list[str], label: str) -> list[str]:
    """Each photo's ``label`` metadata, in row order; one clear error naming the photos without one."""
    meta = {im["image_id"]: (im.get("metadata") or {}).get(label) for im in ws.store.images()}
    missing = [i for i in image_ids if not meta.get(i)]
    if missing:
        raise ValueError(f"images.csv: {len(missing)} photos have no {label!r} (first: {missing[0]}); "
                         "retrieval quality needs every photo's type")
    return [str(meta[i]) for i in image_ids]


def chance(labels: list[str], patients: list[str], queries: np.ndarray, gallery: np.ndarray) -> dict[int, dict]:
    """Per query row: its type's share of its candidates (gallery photos of other patients) for every metric."""
    lab, pat = np.asarray(labels, dtype=object), np.asarray(patients, dtype=object)
    out = {}
    for q in queries:
        cand = gallery[pat[gallery] != pat[q]]
        share = float((lab[cand] == lab[q]).mean()) if len(cand) else 0.0
        out[int(q)] = {m: (share if share > 0 or m != "ap" else None) for m in METRICS}
    return out


def run(args: argparse.Namespace, ws: Workspace) -> dict[str, Any]:
    """Every row's per-query retrieval records (query id → gallery → list over seeds) and the bench."""
    b = Bench(ws, args.folds, not args.quiet)
    if not len(b.triplets):
        raise ValueError(f"{args.data} has no triplets: the fine-tuned row has nothing to learn from")
    labels = labels_of(ws, b.image_ids, args.label)
    pats = [b.patients[i] for i in b.image_ids]
    full = frozen_bank(ws, "full", b.keys, b.image_ids, 0, b.progress)
    image_order, frozen = mean_pooled(full)[1:]
    if image_order != b.image_ids:
        raise RuntimeError("the token bank's photo order differs from the workspace's")
    tune = FineTuneConfig(steps=QUICK_STEPS) if args.quick else FineTuneConfig()
    tuner = LastStageTuner(load_backbone("efficientnet-lite0", layer="stage6"),
                           stage6_photos(ws, b.image_ids, args.views, b.progress), tune)
    methods = Methods(b, full, frozen, DEFAULT, tuner)
    everyone = np.arange(len(b.image_ids))
    records: dict[str, dict[str, dict[str, list[dict]]]] = {}

    def keep(name: str, per_query: dict[int, dict], gallery: str) -> None:
        for q, rec in per_query.items():
            records.setdefault(name, {}).setdefault(gallery, {}).setdefault(b.image_ids[q], []).append(rec)

    for seed in tqdm(args.seeds, desc="seeds", unit="seed", disable=args.quiet):
        split = [b.split(seed)]
        for name, method in ((FROZEN, "frozen"), (FINETUNE, "finetune"), (INFERENCE_ROW, "finetune-inference")):
            folds = b.record(name, partial(cross_validate, split, b.triplets, methods.fixed(method, seed)))
            for rows, D in folds or []:
                for gallery, cand in zip(GALLERIES, (rows, everyone)):
                    keep(name, same_label_retrieval(D, labels, pats, rows, gallery=cand), gallery)
                    if method == "frozen":
                        keep(CHANCE, chance(labels, pats, rows, cand), gallery)
    return {"bench": b, "records": records, "tune": tune, "labels": labels}


def averaged(recs: dict[str, list[dict]]) -> dict[str, dict[str, float | None]]:
    """Query id → metric → its mean over seeds (None when no seed had a value)."""
    out = {}
    for q, rs in recs.items():
        out[q] = {m: (float(np.mean([r[m] for r in rs if r[m] is not None]))
                      if any(r[m] is not None for r in rs) else None) for m in METRICS}
    return out


def pct(s: dict[str, Any]) -> dict[str, Any] | None:
    """A table cell: mean % with its patient-bootstrap 95 % CI."""
    if s["mean"] is None:
        return None
    return {"mean": 100 * s["mean"], "sd": None, "ci": [100 * s["ci"][0], 100 * s["ci"][1]]}


def paired(records: dict, a: str, base: str, gallery: str, metric: str, claim: str,
           patients: dict[str, str]) -> dict[str, Any]:
    """Row ``a`` vs row ``base`` over patients (each patient's mean of its queries' ``metric``)."""
    rows = [[{"anchor": q, "accuracy": r[metric]} for q, r in averaged(records[name][gallery]).items()
             if r[metric] is not None] for name in (a, base)]
    t = patient_paired_test(rows[0], rows[1], patients)
    p = t["t_p"] if np.isfinite(t["t_p"]) else 1.0
    return {"claim": claim, "test": f"{gallery} gallery, {metric}: mean difference {100 * t['mean_diff']:+.1f} pp; "
                                    f"paired t-test over {t['n_patients']} patients, Wilcoxon p = {t['wilcoxon_p']:.2g}",
            "p": p, "holds": bool(t["mean_diff"] > 0 and p < 0.05)}


def report(args: argparse.Namespace, argv: list[str] | None, out: dict[str, Any], seconds: float) -> dict[str, Any]:
    """The result record: the retrieval table, the paired claims and the notes."""
    b: Bench = out["bench"]
    records = out["records"]
    rows = []
    for gallery in GALLERIES:
        for name in (CHANCE, FROZEN, FINETUNE, INFERENCE_ROW):
            s = retrieval_summary(averaged(records[name][gallery]), b.patients)
            agree = None
            if name in b.rows:
                strict = b.summary(name, "strict")
                agree = {"mean": 100 * strict["balanced"], "sd": None, "ci": [100 * c for c in strict["ci"]]}
            seconds_row = round(float(np.mean(b.rows[name]["seconds"])), 1) if name in b.rows else None
            rows.append([name, gallery, *(pct(s[m]) for m in METRICS), agree, s["ap"]["n"], seconds_row])
    claims = [
        paired(records, FINETUNE, FROZEN, "strict", "ap", "the fine-tuned embedding retrieves same-type photos better "
               "than the frozen centred one (mAP, strict gallery)", b.patients),
        paired(records, FINETUNE, FROZEN, "strict", "p@5", "the fine-tuned embedding beats the frozen centred one "
               "at precision@5 (strict gallery)", b.patients),
        paired(records, FINETUNE, FROZEN, "archive", "ap", "the fine-tuned embedding beats the frozen centred one "
               "(mAP, archive gallery)", b.patients),
        paired(records, FROZEN, CHANCE, "strict", "ap", "the frozen centred embedding retrieves same-type photos "
               "above chance (mAP, strict gallery)", b.patients),
        paired(records, FINETUNE, CHANCE, "strict", "ap", "the fine-tuned embedding retrieves same-type photos "
               "above chance (mAP, strict gallery)", b.patients),
        paired(records, FINETUNE, INFERENCE_ROW, "strict", "ap", "test-time views (the default) retrieve better "
               "than the same fit's inference view alone (mAP, strict gallery)", b.patients),
        paired(records, FINETUNE, INFERENCE_ROW, "strict", "p@1", "test-time views (the default) retrieve better "
               "than the same fit's inference view alone (precision@1, strict gallery)", b.patients),
    ]
    tune: FineTuneConfig = out["tune"]
    counts = {t: out["labels"].count(t) for t in sorted(set(out["labels"]))}
    n_pat = len({b.patients[i] for i in b.image_ids})
    notes = [
        f"{len(b.image_ids)} photos of {n_pat} patients, types ({args.label}) from {Path(args.data).name}'s "
        f"images.csv: " + ", ".join(f"{t} {n}" for t, n in counts.items()) + "; the fine-tuned row learns from "
        f"the {len(b.triplets)} label-derived triplets that name no photo of the fold.",
        "Honesty: the query and every photo of the query's own patient (source photo) are never candidates; "
        "precision@k counts missing candidates as misses; average precision runs over the whole ranked gallery, "
        "and a query with no same-type candidate has none (left out of mAP).",
        "Strict: each held-out photo is embedded by a model trained without its patient (the fold's); the strict "
        "gallery holds only other held-out patients' photos, so no photo of the ranking was seen by training. "
        "The archive gallery adds the training photos, embedded by the same fold model (which saw their "
        "triplets, i.e. their types).",
        f"Fine-tuning: {tune.steps} AdamW steps at {tune.lr:g} (cosine), hinge margin {tune.margin:g}, "
        f"{tune.batch_triplets} triplets per step, every training photo through a random one of {args.views} cached "
        "views (+ the inference view) at each step (real_vision's fixed configuration); a photo embedded as the "
        "mean over its inference view and those views (test-time views), and in the inference-view row by its "
        "inference view alone (the same fits: its seconds are the fine-tuned row's)"
        + (f"; --quick cut it to {QUICK_STEPS} steps: not a result" if args.quick else "") + ".",
        "Fused (vision + text) row: not measurable here — the data set has no wound descriptions, so there is "
        "no text embedding to fuse.",
        f"Beside each row, its balanced agreement (%) with the strict triplets of the same folds (real_vision's "
        f"protocol); records of {len(args.seeds)} seed(s) × {args.folds} patient folds, a query's figures "
        "averaged over seeds.",
        multiple_tests_note(claims),
    ]
    legend = ("Cells read mean % over queries [95 % CI, resampling patients]; the agreement column is balanced "
              "strict triplet agreement of the same folds.")
    tables = [{"caption": f"Same-type retrieval of held-out patients' photos ({Path(args.data).name}): precision@k "
                          "and mean average precision (%)",
               "columns": ["row", "gallery", *(f"P@{k} %" for k in RETRIEVAL_KS), "mAP %", "strict agreement %",
                           "queries", "seconds / seed"], "rows": rows, "legend": legend}]
    return {"section": args.section,
            "title": f"Real wounds: same-type retrieval, frozen vs fine-tuned ({Path(args.data).name})"
                     + (" [quick]" if args.quick else ""),
            "command": command_line("benchmarks.real_retrieval", argv), "seeds": list(args.seeds), "tables": tables,
            "claims": claims, "notes": notes, "synthetic": False, "seconds": seconds}


def main(argv: list[str] | None = None) -> int:
    """The ``python -m benchmarks.real_retrieval`` benchmark; returns the exit status."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.real_retrieval", description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, required=True, help="a dataset folder in the product layout")
    p.add_argument("--label", default="wound_type", help="the images.csv column holding each photo's type")
    cli.add_seeds(p)
    p.add_argument("--views", type=int, default=DEFAULT.views, help="cached augmented views per photo (fine-tuning)")
    p.add_argument("--quick", action="store_true", help=f"{QUICK_STEPS} fine-tuning steps, 4 views, one seed (a smoke run)")
    add_dataset_options(p, "real_retrieval")
    args = cli.parse_args(p, argv)
    check_dataset(p, args)
    if args.quick:
        args.seeds, args.views = args.seeds[:1], 4
    t0 = time.perf_counter()
    with dataset_workspace(args, "real-retrieval-") as ws, torch_threads(1):
        try:
            out = run(args, ws)
        except ValueError as exc:
            p.error(str(exc))
        res = report(args, argv, out, time.perf_counter() - t0)
    print(render_tables(res["tables"]))
    for c in res["claims"]:
        print(f"- {c['claim']}: {'holds' if c['holds'] else 'does not hold'} (p = {c['p']:.3g}; {c['test']})")
    print("\n".join(f"note: {n}" for n in res["notes"]))
    target = write_result(results_dir=args.results, **res)
    print(f"→ {target} ({res['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
