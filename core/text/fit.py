"""Fit a Soft Ordinal Embedding (TriDerm-T, §2.3) to one triplet source of a workspace and record
it as a ``text-soe`` run.
"""
from __future__ import annotations

import time
from typing import Any


from annotations.store import runs
from annotations.infra.workspace import Workspace
from core.eval.distances import pairwise_euclidean
from core.eval.metrics import METRICS, evaluate
from core.eval.protocol import oriented_triplets
from core.runtime import save_embeddings
from core.text.soe import SOE


def fit_source(ws: Workspace, source: str, soe: SOE, name: str | None = None) -> dict[str, Any]:
    """Fit ``soe`` to the triplets of ``source``; write the run; return its summary."""
    rows = [r for r in ws.store.triplets(source=source) if r["choice"] in ("j", "k")]
    if not rows:
        known = ", ".join(s for s in ws.store.triplet_sources()) or "none"
        raise ValueError(f"no j/k triplets with source {source!r} in {ws.root} (sources: {known})")
    ids = sorted({r[c] for r in rows for c in ("anchor", "ref_j", "ref_k")})
    if len(ids) < 3:
        raise ValueError(f"source {source!r} covers only {len(ids)} photos; need at least 3")
    index = {im: n for n, im in enumerate(ids)}
    triplets = oriented_triplets(rows, index)
    soe.set_params(n_objects=len(ids))
    config = {"modality": "text", "method": "soe", "source": source, "n_triplets": len(triplets),
              "n_images": len(ids), "synthetic": ws.is_synthetic, **soe.get_params()}
    with runs.recording(ws, runs.TEXT_SOE, config, seed=soe.random_state,
                        name=name or f"SOE {source} d={soe.n_components}") as rec:
        run_id = rec.id
        t0 = time.perf_counter()
        soe.fit(triplets)
        seconds = time.perf_counter() - t0
        save_embeddings(ws, run_id, ids, image_emb=soe.embedding_)
        expert = evaluate(ids, pairwise_euclidean(soe.embedding_), ws.store.expert_triplets())
        metrics = {"train_score": soe.score(triplets), "fit_seconds": seconds, "loss": soe.loss_curve_,
                   "expert": {k: expert[k] for k in (*METRICS, "n", "n_anchors", "n_skipped", "n_missing")
                              if k in expert},
                   **{k: expert[k] for k in METRICS}}
        rec.metrics = metrics
    n_all = len(ws.store.images())
    return {"run_id": run_id, "source": source, "n_images": len(ids), "n_images_without_triplets": n_all - len(ids),
            "n_triplets": len(triplets), "train_score": metrics["train_score"],
            "fit_seconds": round(seconds, 3), "expert_agreement": metrics["expert"], "synthetic": ws.is_synthetic}

