"""The contrastive-objective benchmark (METHODS.md §5): CLIP variants trained under identical
settings and scored on the same metrics, with seed-paired tests against CLIP. :class:`ContrastiveBench`
runs the (variant, seed) cells of ``python -m core.bench_contrastive``, reusing finished ones.
"""
from __future__ import annotations

import csv
import hashlib
import json
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler

from annotations.infra.fileio import atomic_write, read_json, write_json, write_text
from annotations.io.csvsafe import neutralise
from annotations.store.runs import Recording
from core.concepts.scores import ConceptScorer
from core.concepts.training import (
    SIGMOID_OBJECTIVES,
    TrainConfig,
    Trainer,
    WoundPairs,
    build_text_inputs,
    concept_auroc,
    concept_labels,
    split_holdout,
)
from core.concepts.vocabulary import ConceptTagger, load_vocab
from core.eval.distances import pairwise_euclidean
from core.eval.metrics import evaluate
from core.experiments.defaults import OUT_DIR, VARIANTS, ContrastiveConfig  # noqa: F401 (re-exported)

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


def variant_config(variant: str, cfg: ContrastiveConfig, seed: int) -> TrainConfig:
    """The training configuration of one variant (shared settings from ``cfg``, settled)."""
    assert cfg.epochs is not None, "a settled config (ContrastiveConfig.settled)"
    unlock = {"clip": (-1, -1), "siglip": (-1, -1), "image_frozen": (0, -1), "text_frozen": (-1, 0),
              "image_partial": (cfg.partial_image, -1), "text_partial": (-1, cfg.partial_text),
              "clip_unimodal": (-1, -1), "clip_masked": (-1, -1), "flip": (-1, -1)}[variant]
    return TrainConfig(
        objective="siglip" if variant == "siglip" else "clip", epochs=cfg.epochs, batch=cfg.batch_size, lr=cfg.lr,
        tower_lr=cfg.tower_lr, image_unlock=unlock[0], text_unlock=unlock[1],
        unimodal={"clip_unimodal": "augment", "clip_masked": "mask"}.get(variant),
        unimodal_lambda=cfg.lam, patch_dropout=cfg.patch_dropout if variant == "flip" else 0.0, seed=seed)


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
            w.writerow([neutralise(v), *[x for m in METRICS for x in ms[m]], ""])
        for v, why in skipped.items():
            w.writerow([neutralise(v), *[""] * (2 * len(METRICS)), neutralise(why)])
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



ARTIFACTS = ("table.md", "table.csv", "results.json", "chart.json", "chart.html")


@dataclass
class Cell:
    """One finished (variant, seed) cell: its metrics, and whether they were reused from ``cells/``."""

    variant: str
    seed: int
    metrics: dict[str, float]
    cached: bool


class ContrastiveBench:
    """The benchmark's cells on one workspace and model: every variant starts from the same
    pretrained weights and, per seed, the same held-out split and head initialisation. Each
    finished cell is written to ``out/cells/`` (with a key of its settings, reused next time unless
    ``cfg.fresh``) and advances the progress of the open run ``rec``, which :meth:`finish` gives its metrics.
    ``cfg``: the benchmark's config, settled (:meth:`~core.experiments.defaults.ContrastiveConfig.settled`)."""

    def __init__(self, ws: Any, model: Any, pairs: WoundPairs, targets: list[str | None], cfg: ContrastiveConfig,
                 out: Path, rec: Recording) -> None:
        assert cfg.n_seeds is not None, "a settled config"
        self.ws, self.model, self.pairs, self.targets = ws, model, pairs, targets
        self.cfg, self.n_seeds, self.settings, self.out, self.rec = cfg, cfg.n_seeds, cfg.settings(), out, rec
        vocab = load_vocab(groups=("wound",))
        tagger = ConceptTagger(vocab)
        self.texts = build_text_inputs(pairs, tagger)
        names, labels, self.label_source = concept_labels(ws, pairs, tagger)
        self.scorer_concepts = [c for c in vocab if c.name in names]
        keep = [i for i, n in enumerate(names) if n in {c.name for c in self.scorer_concepts}]
        self.names, self.labels = [names[i] for i in keep], labels[:, keep]
        self.init = {k: v.clone() for k, v in model.state_dict().items()}
        self.cells: dict[str, list[dict[str, float]]] = {}
        self.skipped: dict[str, str] = {}

    def run(self) -> Iterator[Cell]:
        """Train (or reuse) every cell of the config's variants × seeds ``0 … n_seeds − 1``, yielding each when
        done; variants the model cannot run are recorded in :attr:`skipped` with the reason."""
        todo = [(v, s) for v in self.cfg.names for s in range(self.n_seeds)]
        for n_done, (variant, seed) in enumerate(todo):
            reason = skip_reason(variant, self.model)
            if reason:
                self.skipped[variant] = reason
                continue
            path = self.out / "cells" / f"{variant}_s{seed}.json"
            key = cell_key(variant, seed, self.settings)
            cached = read_json(path) if path.is_file() and not self.cfg.fresh else {}
            if cached.get("key") == key:
                self.cells.setdefault(variant, []).append({**cached["metrics"], "seed": seed})
                yield Cell(variant, seed, cached["metrics"], cached=True)
                continue
            metrics = self.train_cell(variant, seed)
            write_json(path, {"key": key, "variant": variant, "seed": seed, "metrics": metrics}, indent=1)
            self.cells.setdefault(variant, []).append({**metrics, "seed": seed})
            self.ws.store.update_run(self.rec.id, progress=(n_done + 1) / len(todo))
            yield Cell(variant, seed, metrics, cached=False)

    def train_cell(self, variant: str, seed: int) -> dict[str, float]:
        """Train one variant from the pretrained weights with seed ``seed``; its held-out metrics."""
        t1 = time.perf_counter()
        held = split_holdout(self.pairs.patient_ids, self.cfg.holdout, seed)
        self.model.load_state_dict(self.init)
        torch.manual_seed(seed)
        self.model.reset_heads()  # per-seed head initialisation (pretrained projections stay)
        trainer = Trainer(self.model, self.pairs, self.texts, variant_config(variant, self.cfg, seed))
        history = trainer.fit(np.flatnonzero(~held), progress=True)
        metrics = evaluate_cell(trainer, held, self.names, self.labels, self.scorer_concepts, self.targets, self.ws)
        metrics["final_loss"] = history[-1]
        metrics["seconds"] = round(time.perf_counter() - t1, 1)
        return metrics

    def finish(self, seconds: float) -> Path:
        """Write the tables and chart (:func:`write_outputs`) and set the run's metrics; the table.md path."""
        summary = summarise(self.cells)
        held_sizes = [r["n_heldout"] for rows in self.cells.values() for r in rows if "n_heldout" in r]
        settings_out = {**self.settings, "n_seeds": self.n_seeds, "concept_labels": self.label_source,
                        "n_wounds": len(self.pairs),
                        "n_heldout": round(float(np.mean(held_sizes)), 1) if held_sizes else None}
        write_outputs(self.out, summary, self.skipped, settings_out, self.ws.is_synthetic,
                      paired_vs_baseline(self.cells))
        self.rec.metrics = {"summary": summary, "skipped": self.skipped, "seconds": round(seconds, 1)}
        self.rec.artifacts = {name: str(self.out / name) for name in ARTIFACTS}
        return self.out / "table.md"
