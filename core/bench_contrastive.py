"""Contrastive-objective benchmark: CLIP variants under identical settings, same metrics.

``python -m core.bench_contrastive [--quick]`` trains every variant of the contrastive
benchmark (papers/contrastive_benchmark_*.txt §2–3, Table 5; METHODS.md §5) on the
workspace's wound crops + descriptions — same patient-grouped split, batch, learning
rates, epochs and seeds — and evaluates them the same way:

- image→text and text→image Recall@1/5/10 on the held-out wounds;
- zero-shot concept AUROC (fused global/local prompt scores, mean over concepts; phantom
  truth labels when present, else the description tagger);
- linear-probe accuracy of the image embedding on a target column (held-out), next to the
  majority-class accuracy (``probe_majority``, the chance level of the probe);
- triplet agreement (balanced) of the photo embedding (mean of its wounds) vs the expert.

Variants (towers: ``all`` = fully trainable, ``0`` = frozen, ``L`` = top L blocks):
``clip`` (baseline, both towers trainable), ``siglip``, ``image_frozen``, ``text_frozen``,
``image_partial``, ``text_partial``, ``clip_unimodal`` (λ·L_clip + (1−λ)·NT-Xent on two
augmented views), ``clip_masked`` (unimodal term against a patch-masked view) and ``flip``
(FLIP: ``--patch-dropout`` of the patch tokens of a fully trainable ViT image tower dropped
in every training step; skipped with the reason on CNN backbones such as the offline default).

Outputs under ``runs/bench_contrastive/``: ``table.md``, ``table.csv``, ``results.json``
(mean ± sd over seeds, and each variant's seed-paired difference from ``clip`` with a paired
t-test), ``chart.json``/``chart.html`` (plotly bars) and ``cells/`` — one JSON per finished
(variant, seed) cell, reused on the next run when its settings match.
"""
from __future__ import annotations

import argparse
import csv
import hashlib
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler

from core.concept_scores import ConceptScorer
from core.concepts import ConceptTagger, load_vocab
from core.metrics import evaluate
from core.train_concepts import (TrainConfig, Trainer, build_text_inputs, concept_auroc, concept_labels, load_pairs,
                                 split_holdout, target_values)
from core.vlm import OFFLINE_DEFAULT, VLMUnavailable, load_vlm

VARIANTS = ("clip", "siglip", "image_frozen", "text_frozen", "image_partial", "text_partial",
            "clip_unimodal", "clip_masked", "flip")
METRICS = ("i2t_R@1", "i2t_R@5", "i2t_R@10", "t2i_R@1", "t2i_R@5", "t2i_R@10",
           "concept_auroc", "linear_probe_acc", "probe_majority", "triplet_agreement")
OUT_DIR = "bench_contrastive"
BASELINE = "clip"


def recall_at_k(sim: np.ndarray, ks: tuple[int, ...] = (1, 5, 10)) -> dict[int, float]:
    """Recall@K for queries (rows) whose match is the same-index candidate (column).

    The rank of the match is 1 + the number of candidates scoring strictly higher.
    """
    sim = np.asarray(sim, dtype=np.float64)
    if sim.ndim != 2 or sim.shape[0] != sim.shape[1]:
        raise ValueError(f"sim must be a square query×candidate matrix, got shape {sim.shape}")
    rank = 1 + (sim > np.diag(sim)[:, None]).sum(axis=1)
    return {k: float(np.mean(rank <= k)) for k in ks}


def variant_config(variant: str, args: argparse.Namespace, seed: int) -> TrainConfig:
    """The training configuration of one variant (shared settings from ``args``)."""
    unlock = {"clip": (-1, -1), "siglip": (-1, -1), "image_frozen": (0, -1), "text_frozen": (-1, 0),
              "image_partial": (args.partial_image, -1), "text_partial": (-1, args.partial_text),
              "clip_unimodal": (-1, -1), "clip_masked": (-1, -1), "flip": (-1, -1)}[variant]
    return TrainConfig(
        objective="siglip" if variant == "siglip" else "clip", epochs=args.epochs, batch=args.batch, lr=args.lr,
        tower_lr=args.tower_lr, image_unlock=unlock[0], text_unlock=unlock[1],
        unimodal={"clip_unimodal": "augment", "clip_masked": "mask"}.get(variant),
        unimodal_lambda=args.lam, patch_dropout=args.patch_dropout if variant == "flip" else 0.0, seed=seed)


def skip_reason(variant: str, model) -> str | None:  # noqa: ANN001 — DualEncoder
    """Why ``variant`` cannot run on ``model`` (None when it can)."""
    if variant == "flip" and model.image.is_cnn:
        return ("FLIP patch dropout drops ViT patch tokens; the image tower is a CNN "
                f"({model.image.backbone.name}), whose convolutions have no tokens to drop")
    return None


def evaluate_cell(trainer: Trainer, held: np.ndarray, concept_names: list[str], labels: np.ndarray,
                  scorer_concepts, targets: list[str | None], ws) -> dict[str, float]:  # noqa: ANN001
    """All benchmark metrics for a trained model."""
    g, patches, _ = trainer.embed()
    t = trainer.embed_texts()
    gi, ti = g[held].numpy(), t[held].numpy()
    out: dict[str, float] = {"n_heldout": int(held.sum())}
    for direction, sim in (("i2t", gi @ ti.T), ("t2i", ti @ gi.T)):
        for k, v in recall_at_k(sim).items():
            out[f"{direction}_R@{k}"] = v
    scorer = ConceptScorer(trainer.model, scorer_concepts)
    fused = scorer.scores(g, patches)["fused"]
    cols = [scorer.names.index(n) for n in concept_names]
    out["concept_auroc"] = concept_auroc(fused[held][:, cols], labels[held], concept_names).get("mean", float("nan"))
    known = np.array([y is not None for y in targets])
    tr, te = known & ~held, known & held
    ytr = [targets[i] for i in np.flatnonzero(tr)]
    if te.any() and len(set(ytr)) >= 2:
        scaler = StandardScaler().fit(g[tr].numpy())
        clf = LogisticRegression(max_iter=2000).fit(scaler.transform(g[tr].numpy()), ytr)
        yte = np.array([targets[i] for i in np.flatnonzero(te)])
        out["linear_probe_acc"] = float(np.mean(clf.predict(scaler.transform(g[te].numpy())) == yte))
        out["probe_majority"] = float(np.mean(yte == Counter(ytr).most_common(1)[0][0]))
    else:
        out["linear_probe_acc"] = out["probe_majority"] = float("nan")
    photos = sorted(set(trainer.pairs.image_ids))
    pid = np.array(trainer.pairs.image_ids)
    emb = np.stack([g[pid == p].numpy().mean(0) for p in photos])
    D = np.sqrt(((emb[:, None] - emb[None]) ** 2).sum(-1))
    trip = ws.store.expert_triplets()
    out["triplet_agreement"] = float(evaluate(photos, D, trip)["balanced"]) if trip else float("nan")
    return out


def _cell_key(variant: str, seed: int, settings: dict[str, Any]) -> str:
    blob = json.dumps({"variant": variant, "seed": seed, **settings}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def summarise(cells: dict[str, list[dict[str, float]]]) -> dict[str, dict[str, tuple[float, float]]]:
    """variant → metric → (mean, sd over seeds; sd 0 with one seed)."""
    out = {}
    for variant, rows in cells.items():
        out[variant] = {}
        for m in METRICS:
            vals = np.array([r[m] for r in rows if m in r and r[m] == r[m]], dtype=float)
            out[variant][m] = (float(vals.mean()), float(vals.std(ddof=1)) if len(vals) > 1 else 0.0) \
                if len(vals) else (float("nan"), float("nan"))
    return out


def paired_vs_baseline(cells: dict[str, list[dict[str, float]]], baseline: str = BASELINE,
                       alpha: float = 0.05) -> dict[str, dict[str, tuple[float, float, bool]]]:
    """variant → metric → (mean, sd of the per-seed difference variant − baseline, significant).

    Cells of the same seed share the held-out split and head initialisation, so differences are
    paired by seed; ``significant`` is a two-sided paired t-test at ``alpha`` (needs ≥ 3 seeds).
    """
    from scipy.stats import t as student_t

    base = {r["seed"]: r for r in cells.get(baseline, [])}
    out = {}
    for variant, rows in cells.items():
        if variant == baseline:
            continue
        out[variant] = {}
        for m in METRICS:
            d = np.array([r[m] - base[r["seed"]][m] for r in rows if r["seed"] in base
                          and r[m] == r[m] and base[r["seed"]][m] == base[r["seed"]][m]], dtype=float)
            if len(d) < 2:
                out[variant][m] = (float(d.mean()) if len(d) else float("nan"), float("nan"), False)
                continue
            sd = float(d.std(ddof=1))
            sig = len(d) >= 3 and abs(d.mean()) > student_t.ppf(1 - alpha / 2, len(d) - 1) * sd / np.sqrt(len(d))
            out[variant][m] = (float(d.mean()), sd, bool(sig))
    return out


def write_outputs(out: Path, summary: dict, skipped: dict[str, str], settings: dict[str, Any], synthetic: bool,
                  paired: dict | None = None) -> None:
    """table.md / table.csv / results.json / chart.json / chart.html."""
    import plotly.graph_objects as go

    label = " (SYNTHETIC phantom data)" if synthetic else ""
    lines = [f"# Contrastive-objective benchmark{label}", "",
             f"Settings: {json.dumps(settings, sort_keys=True)}", "",
             f"Chance: Recall@K = K / {settings.get('n_heldout', 'n')} held-out wounds; the linear probe's "
             "chance is the `probe_majority` column (majority training class).", "",
             "| variant | " + " | ".join(METRICS) + " |", "|---" * (len(METRICS) + 1) + "|"]
    for v, ms in summary.items():
        lines.append(f"| {v} | " + " | ".join(f"{m_[0]:.3f} ± {m_[1]:.3f}" for m_ in ms.values()) + " |")
    for v, why in skipped.items():
        lines.append(f"| {v} | skipped: {why} |" + " |" * (len(METRICS) - 1))
    if paired:
        shown_paired = [m for m in METRICS if m != "probe_majority"]
        lines += ["", f"Paired difference vs {BASELINE} (same seed = same split), mean ± sd over seeds; "
                  "* = paired t-test p < 0.05.", "",
                  "| variant | " + " | ".join(shown_paired) + " |", "|---" * (len(shown_paired) + 1) + "|"]
        for v, ms in paired.items():
            lines.append(f"| {v} | " + " | ".join(f"{ms[m][0]:+.3f} ± {ms[m][1]:.3f}{'*' if ms[m][2] else ''}"
                                                  for m in shown_paired) + " |")
    (out / "table.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    with open(out / "table.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["variant", *[f"{m}_{s}" for m in METRICS for s in ("mean", "sd")], "skipped"])
        for v, ms in summary.items():
            w.writerow([v, *[x for m in METRICS for x in ms[m]], ""])
        for v, why in skipped.items():
            w.writerow([v, *[""] * (2 * len(METRICS)), why])
    (out / "results.json").write_text(json.dumps({"settings": settings, "synthetic": synthetic, "summary": summary,
                                                  "paired_vs_baseline": paired or {}, "skipped": skipped}, indent=1), encoding="utf-8")
    shown = ("i2t_R@5", "t2i_R@5", "concept_auroc", "linear_probe_acc", "triplet_agreement")
    fig = go.Figure()
    for v, ms in summary.items():
        fig.add_bar(name=v, x=list(shown), y=[ms[m][0] for m in shown],
                    error_y={"type": "data", "array": [ms[m][1] for m in shown]})
    fig.update_layout(barmode="group", title=f"Contrastive-objective benchmark{label}", yaxis_title="score")
    (out / "chart.json").write_text(fig.to_json(), encoding="utf-8")
    fig.write_html(out / "chart.html", include_plotlyjs="cdn")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m core.bench_contrastive", description=__doc__.split("\n\n")[0])
    p.add_argument("--workspace", default=None, help="workspace folder (default: $TRIDERM_WORKSPACE or ./workspace)")
    p.add_argument("--quick", action="store_true", help="1 seed, 2 epochs, 96 px crops")
    p.add_argument("--model", default=OFFLINE_DEFAULT)
    p.add_argument("--seeds", type=int, default=None, help="number of seeds (default 5; quick 1)")
    p.add_argument("--epochs", type=int, default=None, help="epochs (default 8; quick 2)")
    p.add_argument("--size", type=int, default=None, help="crop size px (default 160; quick 96)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3, help="projection heads")
    p.add_argument("--tower-lr", type=float, default=1e-4, help="unlocked tower blocks")
    p.add_argument("--partial-image", type=int, default=2, help="image_partial: top L image blocks unlocked")
    p.add_argument("--partial-text", type=int, default=3, help="text_partial: top L text layers unlocked")
    p.add_argument("--lam", type=float, default=0.5, help="λ of λ·L_clip + (1−λ)·L_uni")
    p.add_argument("--patch-dropout", type=float, default=0.5, help="flip: fraction of ViT patches dropped")
    p.add_argument("--holdout", type=float, default=0.3)
    p.add_argument("--target", default="fitzpatrick", help="metadata column for the linear probe")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset")
    p.add_argument("--fresh", action="store_true", help="ignore cached cells")
    return p


def main(argv: list[str] | None = None) -> int:
    from core.embed import open_workspace

    parser = _parser()
    args = parser.parse_args(argv)
    defaults = {"seeds": (1, 5), "epochs": (2, 8), "size": (96, 160)}  # (quick, full)
    for name, (quick, full) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [v for v in variants if v not in VARIANTS]
    if bad or not variants:
        parser.error(f"unknown variant(s) {bad or args.variants!r}; choose from {VARIANTS}")
    for flag, ok in (("--seeds must be ≥ 1", args.seeds >= 1), ("--epochs must be ≥ 1", args.epochs >= 1),
                     ("--batch must be ≥ 2", args.batch >= 2), ("--size must be ≥ 32 px", args.size >= 32),
                     ("--holdout must be in (0, 1)", 0 < args.holdout < 1), ("--lam must be in [0, 1]", 0 <= args.lam <= 1),
                     ("--patch-dropout must be in [0, 1)", 0 <= args.patch_dropout < 1),
                     ("--partial-image and --partial-text must be ≥ 1", min(args.partial_image, args.partial_text) >= 1)):
        if not ok:
            parser.error(flag)
    ws = open_workspace(args.workspace)
    pairs = load_pairs(ws, size=args.size)
    targets = target_values(pairs, args.target)
    if all(t is None for t in targets):
        columns = sorted({k for m in pairs.metadata for k in m})
        parser.error(f"--target {args.target!r}: no wound, photo or patient has a value in that metadata column; "
                     f"columns: {', '.join(columns) or 'none'}")
    settings = {k: getattr(args, k) for k in ("model", "epochs", "size", "batch", "lr", "tower_lr", "partial_image",
                                               "partial_text", "lam", "patch_dropout", "holdout", "target")}
    try:
        model = load_vlm(args.model)
    except (VLMUnavailable, ValueError) as e:
        parser.exit(2, f"error: {e}\n")
    for flag, value, tower in (("--partial-image", args.partial_image, model.image),
                               ("--partial-text", args.partial_text, model.text)):
        if value > tower.n_levels:
            parser.error(f"{flag} {value}: {args.model} has {tower.n_levels} blocks in that tower")
    out = ws.runs_dir / OUT_DIR
    (out / "cells").mkdir(parents=True, exist_ok=True)
    run_id = ws.store.start_run("bench-contrastive", {**settings, "seeds": args.seeds, "variants": variants,
                                                      "quick": args.quick, "synthetic": ws.is_synthetic}, seed=0)
    t0 = time.perf_counter()
    try:
        vocab = load_vocab(groups=("wound",))
        tagger = ConceptTagger(vocab)
        texts = build_text_inputs(pairs, tagger)
        names, labels, source = concept_labels(ws, pairs, tagger)
        scorer_concepts = [c for c in vocab if c.name in names]
        keep = [i for i, n in enumerate(names) if n in {c.name for c in scorer_concepts}]
        names, labels = [names[i] for i in keep], labels[:, keep]
        init = {k: v.clone() for k, v in model.state_dict().items()}
        cells: dict[str, list[dict[str, float]]] = {}
        skipped: dict[str, str] = {}
        todo = [(v, s) for v in variants for s in range(args.seeds)]
        for n_done, (variant, seed) in enumerate(todo):
            reason = skip_reason(variant, model)
            if reason:
                skipped[variant] = reason
                continue
            key = _cell_key(variant, seed, settings)
            path = out / "cells" / f"{variant}_s{seed}.json"
            if path.is_file() and not args.fresh:
                cached = json.loads(path.read_text())
                if cached.get("key") == key:
                    cells.setdefault(variant, []).append({**cached["metrics"], "seed": seed})
                    print(f"[cached] {variant} seed {seed}")
                    continue
            t1 = time.perf_counter()
            held = split_holdout(pairs.patient_ids, args.holdout, seed)
            model.load_state_dict(init)
            torch.manual_seed(seed)
            for head in (model.image_head, model.text_head):  # per-seed head initialisation
                for mod in head.modules():
                    if hasattr(mod, "reset_parameters"):
                        mod.reset_parameters()
            trainer = Trainer(model, pairs, texts, variant_config(variant, args, seed))
            history = trainer.fit(np.flatnonzero(~held), progress=True)
            metrics = evaluate_cell(trainer, held, names, labels, scorer_concepts, targets, ws)
            metrics["final_loss"] = history[-1]
            metrics["seconds"] = round(time.perf_counter() - t1, 1)
            path.write_text(json.dumps({"key": key, "variant": variant, "seed": seed, "metrics": metrics}, indent=1))
            cells.setdefault(variant, []).append({**metrics, "seed": seed})
            print(f"{variant} seed {seed}: " + ", ".join(f"{k} {v:.3f}" for k, v in metrics.items()))
            ws.store.update_run(run_id, progress=(n_done + 1) / len(todo))
        summary = summarise(cells)
        held_sizes = [r["n_heldout"] for rows in cells.values() for r in rows if "n_heldout" in r]
        settings_out = {**settings, "seeds": args.seeds, "concept_labels": source, "n_wounds": len(pairs),
                        "n_heldout": round(float(np.mean(held_sizes)), 1) if held_sizes else None}
        write_outputs(out, summary, skipped, settings_out, ws.is_synthetic, paired_vs_baseline(cells))
        artifacts = {name: str(out / name) for name in ("table.md", "table.csv", "results.json", "chart.json", "chart.html")}
        ws.store.finish_run(run_id, metrics={"summary": summary, "skipped": skipped,
                                             "seconds": round(time.perf_counter() - t0, 1)}, artifacts=artifacts)
    except BaseException as e:
        ws.store.finish_run(run_id, status="stopped" if isinstance(e, KeyboardInterrupt) else "failed",
                            metrics={"error": str(e)})
        raise
    print((out / "table.md").read_text())
    print(f"total {time.perf_counter() - t0:.0f} s; outputs in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
