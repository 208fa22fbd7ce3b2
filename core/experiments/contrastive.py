"""The contrastive-objective benchmark (METHODS.md §5): CLIP variants trained under identical
settings and scored on the same metrics, with seed-paired tests against CLIP.
"""
from __future__ import annotations

import argparse
import csv
import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler

from annotations.fileio import atomic_write, write_json, write_text
from core.concepts.scores import ConceptScorer
from core.concepts.training import SIGMOID_OBJECTIVES, TrainConfig, Trainer, concept_auroc
from core.eval.distances import pairwise_euclidean
from core.eval.metrics import evaluate
from core.experiments.defaults import OUT_DIR, VARIANTS  # noqa: F401 (re-exported)

METRICS = ("i2t_R@1", "i2t_R@5", "i2t_R@10", "t2i_R@1", "t2i_R@5", "t2i_R@10",
           "concept_auroc", "linear_probe_acc", "probe_majority", "triplet_agreement")


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
        objective="siglip" if variant == "siglip" else "clip", epochs=args.epochs, batch=args.batch_size, lr=args.lr,
        tower_lr=args.tower_lr, image_unlock=unlock[0], text_unlock=unlock[1],
        unimodal={"clip_unimodal": "augment", "clip_masked": "mask"}.get(variant),
        unimodal_lambda=args.lam, patch_dropout=args.patch_dropout if variant == "flip" else 0.0, seed=seed)


def skip_reason(variant: str, model) -> str | None:
    """Why ``variant`` cannot run on ``model`` (None when it can)."""
    if variant == "flip" and model.image.is_cnn:
        return ("FLIP patch dropout drops ViT patch tokens; the image tower is a CNN "
                f"({model.image.backbone.name}), whose convolutions have no tokens to drop")
    return None


def evaluate_cell(trainer: Trainer, held: np.ndarray, concept_names: list[str], labels: np.ndarray,
                  scorer_concepts, targets: list[str | None], ws) -> dict[str, float]:
    """All benchmark metrics for a trained model."""
    g, patches, _ = trainer.embed()
    t = trainer.embed_texts()
    gi, ti = g[held].numpy(), t[held].numpy()
    out: dict[str, float] = {"n_heldout": int(held.sum())}
    for direction, sim in (("i2t", gi @ ti.T), ("t2i", ti @ gi.T)):
        for k, v in recall_at_k(sim).items():
            out[f"{direction}_R@{k}"] = v
    scorer = ConceptScorer(trainer.model, scorer_concepts, sigmoid=trainer.cfg.objective in SIGMOID_OBJECTIVES)
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
    trip = ws.store.expert_triplets()
    out["triplet_agreement"] = float(evaluate(photos, pairwise_euclidean(emb), trip)["balanced"]) if trip else float("nan")
    return out


def cell_key(variant: str, seed: int, settings: dict[str, Any]) -> str:
    """A short stable key of one cell (variant, seed and settings) for the results cache."""
    blob = json.dumps({"variant": variant, "seed": seed, **settings}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def summarise(cells: dict[str, list[dict[str, float]]]) -> dict[str, dict[str, tuple[float, float]]]:
    """Variant → metric → (mean, sd over seeds; sd 0 with one seed)."""
    out: dict[str, dict[str, tuple[float, float]]] = {}
    for variant, rows in cells.items():
        out[variant] = {}
        for m in METRICS:
            vals = np.array([r[m] for r in rows if m in r and r[m] == r[m]], dtype=float)
            out[variant][m] = (float(vals.mean()), float(vals.std(ddof=1)) if len(vals) > 1 else 0.0) \
                if len(vals) else (float("nan"), float("nan"))
    return out


def paired_vs_baseline(cells: dict[str, list[dict[str, float]]], baseline: str = BASELINE,
                       alpha: float = 0.05) -> dict[str, dict[str, tuple[float, float, bool]]]:
    """Variant → metric → (mean, sd of the per-seed difference variant − baseline, significant).

    Cells of the same seed share the held-out split and head initialisation, so differences are
    paired by seed; ``significant`` is a two-sided paired t-test at ``alpha`` (needs ≥ 3 seeds).
    """
    from scipy.stats import ttest_rel

    base = {r["seed"]: r for r in cells.get(baseline, [])}
    out: dict[str, dict[str, tuple[float, float, bool]]] = {}
    for variant, rows in cells.items():
        if variant == baseline:
            continue
        out[variant] = {}
        for m in METRICS:
            pairs = np.array([(r[m], base[r["seed"]][m]) for r in rows if r["seed"] in base
                              and r[m] == r[m] and base[r["seed"]][m] == base[r["seed"]][m]], dtype=float).reshape(-1, 2)
            d = pairs[:, 0] - pairs[:, 1]
            if len(d) < 2:
                out[variant][m] = (float(d.mean()) if len(d) else float("nan"), float("nan"), False)
                continue
            p_value = float(ttest_rel(pairs[:, 0], pairs[:, 1]).pvalue) if len(d) >= 3 else float("nan")
            out[variant][m] = (float(d.mean()), float(d.std(ddof=1)), bool(p_value < alpha))
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
    write_text(out / "table.md", "\n".join(lines) + "\n")
    with atomic_write(out / "table.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["variant", *[f"{m}_{s}" for m in METRICS for s in ("mean", "sd")], "skipped"])
        for v, ms in summary.items():
            w.writerow([v, *[x for m in METRICS for x in ms[m]], ""])
        for v, why in skipped.items():
            w.writerow([v, *[""] * (2 * len(METRICS)), why])
    write_json(out / "results.json", {"settings": settings, "synthetic": synthetic, "summary": summary,
                                      "paired_vs_baseline": paired or {}, "skipped": skipped}, indent=1)
    shown = ("i2t_R@5", "t2i_R@5", "concept_auroc", "linear_probe_acc", "triplet_agreement")
    fig = go.Figure()
    for v, ms in summary.items():
        fig.add_bar(name=v, x=list(shown), y=[ms[m][0] for m in shown],
                    error_y={"type": "data", "array": [ms[m][1] for m in shown]})
    fig.update_layout(barmode="group", title=f"Contrastive-objective benchmark{label}", yaxis_title="score")
    write_text(out / "chart.json", fig.to_json())
    write_text(out / "chart.html", fig.to_html(include_plotlyjs="cdn"))

