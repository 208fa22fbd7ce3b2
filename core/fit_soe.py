"""Fit a Soft Ordinal Embedding to a triplet source and record it as a ``text-soe`` run.

TriDerm-T (paper §2.2, §3.2): SOE on the LLM's triplet answers gives the text embedding;
``python -m core.fit_soe --source llm:<model> --dim 4`` fits it, saves the embedding
(``runs/<id>/embeddings.npz``) and prints its agreement with the expert's triplets.
Photos that appear in no triplet of the source carry no information and are left out
(the evaluation counts expert triplets naming them as missing).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import numpy as np

from annotations.workspace import Workspace, resolve_workspace
from core.metrics import METRICS, evaluate
from core.runs import pairwise_euclidean, save_embeddings
from core.soe import SOE


def oriented_triplets(rows: list[dict], index: dict[str, int]) -> np.ndarray:
    """(m, 3) [anchor, chosen, other] index triplets from store rows; skips dropped."""
    out = []
    for r in rows:
        if r["choice"] not in ("j", "k"):
            continue
        chosen, other = (r["ref_j"], r["ref_k"]) if r["choice"] == "j" else (r["ref_k"], r["ref_j"])
        out.append((index[r["anchor"]], index[chosen], index[other]))
    return np.array(out, dtype=np.int64).reshape(-1, 3)


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
    config = {"modality": "text", "method": "soe", "source": source, "n_triplets": int(len(triplets)),
              "n_images": len(ids), "synthetic": ws.is_synthetic, **soe.get_params()}
    run_id = ws.store.start_run("text-soe", config, seed=soe.random_state,
                                name=name or f"SOE {source} d={soe.n_components}")
    try:
        t0 = time.perf_counter()
        soe.fit(triplets, n_objects=len(ids))
        seconds = time.perf_counter() - t0
        save_embeddings(ws, run_id, ids, image_emb=soe.embedding_)
        expert = evaluate(ids, pairwise_euclidean(soe.embedding_), ws.store.expert_triplets())
    except BaseException as exc:
        ws.store.finish_run(run_id, status="failed", message=f"{type(exc).__name__}: {exc}")
        raise
    metrics = {"train_score": soe.score(triplets), "fit_seconds": seconds, "loss": soe.loss_curve_,
               "expert": {k: expert[k] for k in (*METRICS, "n", "n_anchors", "n_skipped", "n_missing") if k in expert},
               **{k: expert[k] for k in METRICS}}
    ws.store.finish_run(run_id, status="done", metrics=metrics)
    n_all = len(ws.store.images())
    return {"run_id": run_id, "source": source, "n_images": len(ids), "n_images_without_triplets": n_all - len(ids),
            "n_triplets": int(len(triplets)), "train_score": metrics["train_score"],
            "fit_seconds": round(seconds, 3), "expert_agreement": metrics["expert"], "synthetic": ws.is_synthetic}


def agreement_table(summary: dict[str, Any]) -> str:
    """A small text table of the agreement with the expert's triplets."""
    e = summary["expert_agreement"]
    head = f"{'metric':<10} {'value':>8}"
    lines = [f"SOE on {summary['source']} (run {summary['run_id']}"
             + (", SYNTHETIC data)" if summary["synthetic"] else ")"), head, "-" * len(head)]
    for m in METRICS:
        v = e.get(m)
        lines.append(f"{m:<10} {('%.3f' % v) if v is not None and v == v else 'n/a':>8}")
    lines.append(f"expert triplets scored: {e.get('n', 0)} over {e.get('n_anchors', 0)} anchors "
                 f"(skipped {e.get('n_skipped', 0)}, photos without text triplets {e.get('n_missing', 0)})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m core.fit_soe",
                                     description="Fit SOE to a triplet source (e.g. llm:<model>) and record a text-soe run.")
    parser.add_argument("--workspace", default=None)
    parser.add_argument("--source", default=None,
                        help="triplet source, e.g. llm:gpt-oss:120b (default: the llm:* source with most triplets)")
    parser.add_argument("--dim", type=int, default=4, help="embedding dimension (paper: 4)")
    parser.add_argument("--paper-protocol", action="store_true",
                        help="the paper's settings (δ=0, batch 2048, 50 epochs) instead of the measured default")
    parser.add_argument("--margin", type=float, default=None)
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--lr", type=float, default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.dim < 1:
        parser.error("--dim must be ≥ 1")
    ws = Workspace(resolve_workspace(args.workspace))
    source = args.source
    if source is None:
        llm = {s: n for s, n in ws.store.triplet_sources().items() if s.startswith("llm:")}
        if not llm:
            parser.error(f"no llm:* triplets in {ws.root}; run `python -m core.llm_triplets` first or pass --source")
        source = max(llm, key=llm.get)
    overrides = {k: v for k, v in (("margin", args.margin), ("epochs", args.epochs), ("lr", args.lr)) if v is not None}
    base = SOE.paper_protocol() if args.paper_protocol else SOE()
    soe = base.set_params(n_components=args.dim, random_state=args.seed, **overrides)
    try:
        summary = fit_source(ws, source, soe)
    except ValueError as exc:
        parser.error(str(exc))
    print(agreement_table(summary), file=sys.stderr)
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
