"""One concepts run (``python -m core.train_concepts``; METHODS.md §3–4): the labelled wound pairs
and their patient-grouped split (:class:`ConceptData`), training, the held-out evaluation (concept
AUROC global/local/fused, the concept bottleneck) and the run's stored embeddings and heads.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import numpy as np
import torch

from annotations.infra.fileio import atomic_write
from annotations.store.runs import Recording
from core.concepts.scores import ConceptBottleneck, ConceptScorer
from core.concepts.training import (
    SIGMOID_OBJECTIVES,
    Trainer,
    WoundPairs,
    concept_auroc,
    concept_labels,
    load_pairs,
    split_holdout,
    target_values,
)
from core.concepts.vocabulary import Concept, ConceptTagger, load_vocab
from core.runtime import save_embeddings


@dataclass
class ConceptData:
    """The described wounds as crops, their concept labels (``source``: phantom truth or the
    description tagger) and the held-out mask of a patient-grouped split."""

    concepts: list[Concept]  # the vocabulary scored
    tagger: ConceptTagger
    pairs: WoundPairs
    names: list[str]
    labels: np.ndarray  # N×C, 1/0, −1 unknown
    source: str
    held: np.ndarray  # N, bool

    @classmethod
    def load(cls, ws: Any, concepts: list[Concept], size: int, holdout: float, seed: int) -> ConceptData:
        """:class:`~core.concepts.training.NotEnoughData` when the workspace has too few described
        wounds or patients to split."""
        tagger = ConceptTagger(load_vocab(groups=("wound",)))
        pairs = load_pairs(ws, size=size)
        names, labels, source = concept_labels(ws, pairs, tagger)
        held = split_holdout(pairs.patient_ids, holdout, seed)
        return cls(concepts, tagger, pairs, names, labels, source, held)

    def labelled(self) -> bool:
        """Whether any scored concept has labels (else there is no AUROC to report)."""
        return bool({c.name for c in self.concepts} & set(self.names))


def concept_metrics(data: ConceptData, scorer: ConceptScorer, scores: dict[str, np.ndarray], target: str,
                    seed: int) -> dict[str, Any]:
    """Held-out concept AUROC (``auroc_global``/``_local``/``_fused``) and, when ``target`` has at least
    two classes over four known wounds, a concept bottleneck's top concepts and held-out accuracy."""
    held, names = data.held, data.names
    col = {n: i for i, n in enumerate(scorer.names)}
    common = [n for n in names if n in col]
    metrics: dict[str, Any] = {}
    for kind in ("global", "local", "fused"):
        s = scores[kind][held][:, [col[n] for n in common]]
        metrics[f"auroc_{kind}"] = concept_auroc(s, data.labels[held][:, [names.index(n) for n in common]], common)
    ys = target_values(data.pairs, target)
    known = np.array([y is not None for y in ys])
    if known.sum() >= 4 and len({y for y in ys if y}) >= 2:
        cbm = ConceptBottleneck(scorer.names, random_state=seed)
        tr, te = known & ~held, known & held
        cbm.fit(scores["fused"][tr], [ys[i] for i in np.flatnonzero(tr)])
        metrics["bottleneck"] = {"target": target, "top3": cbm.top_concepts(3),
                                 "heldout_accuracy": cbm.score(scores["fused"][te], [ys[i] for i in np.flatnonzero(te)])
                                 if te.any() else None}
    return metrics


def save_concept_run(ws: Any, run_id: int, data: ConceptData, trainer: Trainer, wound_emb: np.ndarray,
                     scorer: ConceptScorer, scores: dict[str, np.ndarray], heatmaps: np.ndarray) -> str:
    """Write the run's embeddings.npz (photo = mean of its wounds) and its trained heads; the heads' path."""
    pairs = data.pairs
    photo_ids = sorted(set(pairs.image_ids))
    photo_emb = np.stack([wound_emb[[i for i, p in enumerate(pairs.image_ids) if p == pid]].mean(0)
                          for pid in photo_ids])
    save_embeddings(ws, run_id, photo_ids, image_emb=photo_emb, wound_keys=pairs.keys, wound_emb=wound_emb,
                    concept_names=np.asarray(scorer.names), concept_global=scores["global"],
                    concept_local=scores["local"], concept_fused=scores["fused"],
                    concept_heatmaps=heatmaps.astype(np.float16), crop_boxes=pairs.boxes, heldout=data.held)
    heads = ws.run_dir(run_id) / "heads.pt"
    with atomic_write(heads, "wb", suffix=".pt") as fh:
        torch.save(trainer.model.extra_state_dict(), fh)
    return str(heads)


def train_and_evaluate(ws: Any, rec: Recording, data: ConceptData, trainer: Trainer, beta: float, target: str,
                       train: bool = True, progress: bool = True, started: float | None = None) -> dict[str, Any]:
    """Train (unless ``train`` is false: the untrained heads), score the concepts, evaluate on the
    held-out wounds and set the metrics and heads the open run ``rec`` finishes with; its metrics.
    ``started``: ``time.perf_counter()`` when the run began (its ``seconds`` include loading the model)."""
    run_id = rec.id
    t0 = time.perf_counter() if started is None else started
    cfg = trainer.cfg
    stamps = [time.perf_counter()]

    def on_epoch(epoch: int, losses: list[float]) -> None:
        stamps.append(time.perf_counter())
        ws.store.update_run(run_id, progress=(epoch + 1) / cfg.epochs, metrics={"loss": losses})

    history = trainer.fit(np.flatnonzero(~data.held), progress=progress, on_epoch=on_epoch) if train else []
    g, patches, grid = trainer.embed()
    scorer = ConceptScorer(trainer.model, data.concepts, beta=beta, sigmoid=cfg.objective in SIGMOID_OBJECTIVES)
    scores = scorer.scores(g, patches)
    heat = scorer.heatmaps(patches, grid)
    metrics: dict[str, Any] = {"loss": history, "auroc_source": data.source,
                               "seconds": round(time.perf_counter() - t0, 1),
                               "epoch_seconds": [round(b - a, 4) for a, b in pairwise(stamps)],
                               **concept_metrics(data, scorer, scores, target, cfg.seed)}
    heads = save_concept_run(ws, run_id, data, trainer, g.numpy(), scorer, scores, heat)
    rec.metrics, rec.artifacts = metrics, {"heads": heads}
    return metrics
