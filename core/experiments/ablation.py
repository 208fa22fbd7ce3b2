"""The ablation study (TriDerm Table 2): SOE dimension and LLM budget (text), pooling and loss
(vision), each cell resumable and recorded.
"""
from __future__ import annotations

import hashlib
import inspect
import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from annotations.infra.fileio import read_json, write_json, write_text
from annotations.infra.workspace import Workspace
from annotations.store import runs
from core.eval.distances import pairwise_euclidean
from core.eval.metrics import METRICS, evaluate
from core.eval.protocol import oriented_triplets
from core.runtime import json_safe, pick_device
from core.vision import triderm_config

CORE = Path(__file__).resolve().parents[1]

SOE_DIMS = (2, 3, 4, 5, 6)


BUDGETS = (0.001, 0.01, 0.1, 1.0)


POOLINGS = ("mean", "attention")


LOSSES = ("vicreg", "contrastive", "triplet")


DEFAULT_DIM = 4


VISION_DEFAULT = {"pooling": "attention", "loss": "vicreg"}


# Paper Table 2 (balanced agreement %, real RDEB data), printed beside our numbers.
PAPER = {
    ("dim", 2): 62.6, ("dim", 3): 65.0, ("dim", 4): 67.4, ("dim", 5): 64.2, ("dim", 6): 64.9,
    ("budget", 0.001): 55.2, ("budget", 0.01): 62.6, ("budget", 0.1): 63.6, ("budget", 1.0): 67.4,
    ("oracle", "medgemma-27b"): 61.1, ("oracle", "gpt-oss-20b"): 61.7, ("oracle", "gpt-oss-120b"): 67.4,
    ("pooling", "mean"): 69.3, ("pooling", "attention"): 71.6,
    ("loss", "vicreg"): 71.6,
    # the paper quotes contrastive and triplet at their best settings (§3.4), measured as extra rows
    ("loss", "contrastive, batch 128, lr 1e-3"): 68.1, ("loss", "triplet, batch 8"): 70.1,
}


# The paper's best settings for the non-VICReg losses (Table 2b note): extra rows beside the defaults.
TUNED_LOSSES = (("contrastive, batch 128, lr 1e-3", {"loss": "contrastive", "batch_size": 128, "lr": 1e-3}),
                ("triplet, batch 8", {"loss": "triplet", "batch_size": 8}))


class AblationInputError(ValueError):
    """The workspace or the options cannot give an ablation (reported as a usage error)."""


@dataclass
class Row:
    """One table row: a factor's value and the cell configuration that measures it."""

    table: str
    factor: str
    value: Any
    config: dict[str, Any]
    results: list[dict[str, Any]] = field(default_factory=list)

    @property
    def label(self) -> str:
        """The row's label in the table (the factor's value, readable)."""
        if self.factor == "budget":
            return f"budget {100 * self.value:g}%"
        return f"{self.factor} {self.value}"


def _fingerprint(rows: list[dict]) -> str:
    """Content hash of triplet rows (anchor, references, choice, source, rep), whatever their store order
    (concurrent oracle workers insert answers in a varying order)."""
    lines = sorted(f"{r['anchor']}|{r['ref_j']}|{r['ref_k']}|{r['choice']}|{r['source']}|{r['rep']}\n" for r in rows)
    return hashlib.sha256("".join(lines).encode()).hexdigest()[:16]


def source_hash(*parts: Path | Callable) -> str:
    """Hash of the source text of the files (or functions) that compute a cached value: any edit to
    them, and only to them, gives a new key (unlike the git commit, which changes on every commit)."""
    h = hashlib.sha256()
    for part in parts:
        text = part.read_bytes() if isinstance(part, Path) else inspect.getsource(part).encode()
        h.update(hashlib.sha256(text).digest())
    return h.hexdigest()[:16]


def text_code_hash() -> str:
    """Source hash of what computes a text cell: SOE, the metrics and the cell functions."""
    return source_hash(CORE / "text" / "soe.py", CORE / "eval" / "metrics.py", CORE / "eval" / "distances.py",
                       oriented_triplets, soe_cell)


def vision_code_hash() -> str:
    """Source hash of what computes a vision cell: the vision and loss packages, the metrics, the evaluation
    protocol, distances, run artifacts and the cell function."""
    files = sorted((CORE / "vision").glob("*.py")) + sorted((CORE / "losses").glob("*.py"))
    return source_hash(*files, CORE / "eval" / "metrics.py", CORE / "eval" / "protocol.py", CORE / "eval" / "distances.py",
                       CORE / "runtime.py", vision_cell)


def backbone_identity(name: str) -> dict[str, str]:
    """What the backbone contributes to a vision cell: its name, architecture, input size, token layer
    (channels × grid) and a hash of its weights."""
    from core.vision.backbones import load_backbone

    backbone = load_backbone(name, device="cpu")
    h = hashlib.sha256()
    for key, tensor in sorted(backbone.model.state_dict().items()):
        h.update(key.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return {"name": backbone.name, "arch": backbone.arch, "layer": repr(backbone).replace(", cpu)", ")"),
            "weights": h.hexdigest()[:16]}


def cell_key(config: dict[str, Any], seed: int, data: str, code: str, context: dict[str, Any] | None = None) -> str:
    """Cache key of one cell: the resolved config (every default filled in), the seed, a hash of the
    data content, a hash of the computing code and the context (device; backbone and its weights)."""
    blob = json.dumps({"config": config, "seed": seed, "data": data, "code": code, "context": context or {}},
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


# ------------------------------------------------------------------------------------- text
def soe_defaults(dim: int) -> dict[str, Any]:
    """Every SOE hyperparameter of a text cell, defaults filled in (seed, device and the number of
    photos are keyed apart)."""
    from core.text.soe import SOE

    return {k: v for k, v in SOE(n_components=dim).get_params().items() if k not in ("random_state", "device", "n_objects")}


def text_rows(sources: list[str], default_source: str) -> list[Row]:
    """Table 2a rows, each with its resolved cell config."""
    def cfg(source: str, dim: int, budget: float) -> dict[str, Any]:
        return {"kind": "soe", "source": source, "dim": dim, "budget": budget, "soe": soe_defaults(dim)}

    rows = [Row("text", "dim", d, cfg(default_source, d, 1.0)) for d in SOE_DIMS]
    rows += [Row("text", "budget", b, cfg(default_source, DEFAULT_DIM, b)) for b in BUDGETS]
    rows += [Row("text", "oracle", s.removeprefix("llm:"), cfg(s, DEFAULT_DIM, 1.0)) for s in sources]
    return rows


def soe_cell(ids: list[str], llm: np.ndarray, expert: list[dict], config: dict, seed: int) -> dict[str, Any]:
    """Fit SOE (``config["soe"]``) on a ``budget`` fraction of the oracle's triplets drawn from the run
    seed; agreement with the expert. The same seed and triplets (in any order) give the same metrics
    on the same device."""
    from core.text.soe import SOE

    llm = llm[np.lexsort(llm.T[::-1])]  # canonical order: the seeded subset must not depend on store order
    rng = np.random.default_rng([seed, int(round(config["budget"] * 1e6))])
    m = max(1, int(round(config["budget"] * len(llm))))
    subset = llm[np.sort(rng.choice(len(llm), size=m, replace=False))]
    soe = SOE(**config["soe"], n_objects=len(ids), random_state=seed).fit(subset)
    result = evaluate(ids, pairwise_euclidean(soe.embedding_), expert)
    return {**{k: result[k] for k in METRICS}, "n_train_triplets": m, "train_score": soe.score(subset)}


# ----------------------------------------------------------------------------------- vision
def vision_rows(epochs: int | None) -> list[Row]:
    """Table 2b rows, each with its resolved training config (every TriDerm-V default filled in)."""
    base = {"kind": "triderm", **{k: v for k, v in asdict(triderm_config.DEFAULT).items() if k != "seed"},
            **VISION_DEFAULT, **({"epochs": epochs} if epochs else {})}
    rows = [Row("vision", "pooling", p, {**base, "pooling": p}) for p in POOLINGS]
    rows += [Row("vision", "loss", loss, {**base, "loss": loss}) for loss in LOSSES]
    rows += [Row("vision", "loss", label, {**base, **params}) for label, params in TUNED_LOSSES]
    return rows


def vision_cell(ws: Workspace, expert: list[dict], config: dict, seed: int, key: str) -> dict[str, Any]:
    """Train TriDerm-V with the resolved ``config`` and score its image embedding against the expert.

    The training run is tagged with ``metrics["ablation_cell"] = key`` so the agreement
    report (:mod:`core.evaluate`) keeps ablation runs out of Table 1 and its fusions.
    """
    from core.eval.distances import image_distances
    from core.runtime import load_embeddings
    from core.vision.triderm import train

    params = {k: v for k, v in config.items() if k != "kind"}
    run_id = train(ws, progress=False, seed=seed, **params)
    ws.store.update_run(run_id, metrics={"ablation_cell": key})
    ids, D = image_distances(load_embeddings(ws, run_id))
    result = evaluate(ids, D, expert)
    return {**{k: result[k] for k in METRICS}, "run_id": run_id}


def vision_data_hash(ws: Workspace, expert_fp: str) -> str:
    """Content hash of what a vision cell reads: expert triplets, photos (sha256), wounds and mask files."""
    h = hashlib.sha256(expert_fp.encode())
    for im in ws.store.images():
        h.update(f"{im['image_id']}|{im['sha256']}\n".encode())
    for w in ws.store.wounds():
        h.update(f"{w['image_id']}|{w['wound_index']}|{w['area']}|{w['bbox']}\n".encode())
    for mask in sorted(ws.masks_dir.glob("*.png")):
        h.update(mask.name.encode() + hashlib.sha256(mask.read_bytes()).digest())
    return h.hexdigest()[:16]


# ------------------------------------------------------------------------------------ tables
def _mean_sd(values: list[float]) -> tuple[float, float]:
    arr = np.array([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64)
    if not len(arr):
        return float("nan"), float("nan")
    return float(arr.mean()), float(arr.std(ddof=1)) if len(arr) > 1 else 0.0


def summarise(rows: list[Row]) -> list[dict[str, Any]]:
    """Each row's configuration with the mean and sd of its seeds' balanced and micro agreement."""
    out = []
    for r in rows:
        bal = _mean_sd([x["balanced"] for x in r.results])
        micro = _mean_sd([x["micro"] for x in r.results])
        n_train = [x["n_train_triplets"] for x in r.results if "n_train_triplets" in x]
        out.append({"table": r.table, "factor": r.factor, "value": r.value, "label": r.label,
                    "config": r.config, "seeds": len(r.results), "balanced_mean": bal[0], "balanced_sd": bal[1],
                    "micro_mean": micro[0], "micro_sd": micro[1], "paper": PAPER.get((r.factor, r.value)),
                    "balanced_values": [x["balanced"] for x in r.results],
                    "n_train_triplets": int(np.mean(n_train)) if n_train else None})
    return out


def format_table(summary: list[dict], table: str, title: str) -> str:
    """One ablation table (``table``) of the summary as Markdown under ``title``."""
    rows = [s for s in summary if s["table"] == table]
    w = max([len("setting"), *(len(s["label"]) for s in rows)])
    lines = [title, f"{'setting':{w}s} {'balanced % (mean ± sd)':>24s} {'micro %':>16s} {'seeds':>5s} {'paper':>6s}"
                    + (f" {'triplets':>8s}" if table == "text" else "")]
    for s in rows:
        paper = f"{s['paper']:.1f}" if s["paper"] is not None else "–"
        lines.append(f"{s['label']:{w}s} {100 * s['balanced_mean']:17.1f} ± {100 * s['balanced_sd']:4.1f}"
                     f" {100 * s['micro_mean']:9.1f} ± {100 * s['micro_sd']:4.1f} {s['seeds']:5d} {paper:>6s}"
                     + (f" {s['n_train_triplets']:8d}" if table == "text" else ""))
    return "\n".join(lines)


# -------------------------------------------------------------------------------------- main
def run_ablation(ws: Workspace, seeds: int = 3, quick: bool = False, tables: tuple[str, ...] = ("text", "vision"),
                 source: str | None = None, vision_epochs: int | None = None) -> dict[str, Any]:
    """Compute (or reuse) every cell × seed; write runs/ablation/ablation.{md,json}; return the summary."""
    expert = ws.store.expert_triplets()
    if not expert:
        raise AblationInputError(f"workspace {ws.root} has no expert triplets to evaluate against")
    ids = [r["image_id"] for r in ws.store.images()]
    index = {image_id: n for n, image_id in enumerate(ids)}
    expert_fp = _fingerprint(expert)
    ids_fp = hashlib.sha256("|".join(ids).encode()).hexdigest()[:16]
    rows: list[Row] = []
    llm_by_source: dict[str, np.ndarray] = {}
    data_fp: dict[str, str] = {}
    notes: list[str] = []
    device = pick_device().type
    code = {"text": text_code_hash(), "vision": vision_code_hash()}
    context: dict[str, dict[str, Any]] = {"text": {"device": device}}
    if "text" in tables:
        sources = sorted(s for s in ws.store.triplet_sources() if s.startswith("llm:"))
        if source is not None and source not in sources:
            raise AblationInputError(f"--source {source}: no such triplet source (available: {', '.join(sources) or 'none'})")
        for s in sources:
            raw = ws.store.triplets(source=s)
            llm_by_source[s] = oriented_triplets(raw, index)
            data_fp[s] = f"{ids_fp}-{expert_fp}-{_fingerprint(raw)}"
        usable = [s for s in sources if len(llm_by_source[s])]
        if usable:
            default = source or max(usable, key=lambda s: len(llm_by_source[s]))
            rows += text_rows(usable, default)
        else:
            notes.append("Table 2a skipped: no llm:<model> triplets in the store "
                         "(run `python -m core.llm_triplets` first).")
    if "vision" in tables:
        epochs = vision_epochs or (10 if quick else None)
        vrows = vision_rows(epochs)
        rows += vrows
        data_fp["vision"] = vision_data_hash(ws, expert_fp)
        context["vision"] = {"device": device, "backbone": backbone_identity(vrows[0].config["backbone"])}

    def key_of(row: Row, seed: int) -> str:
        data = data_fp[row.config["source"]] if row.table == "text" else data_fp["vision"]
        return cell_key(row.config, seed, data, code[row.table], context[row.table])

    cache_dir = ws.runs_dir / "ablation" / "cells"
    cache_dir.mkdir(parents=True, exist_ok=True)
    jobs: dict[str, tuple[dict, int, str]] = {}
    for row in rows:
        for seed in range(seeds):
            jobs.setdefault(key_of(row, seed), (row.config, seed, row.table))
    config = {"seeds": seeds, "quick": quick, "tables": list(tables), "source": source,
              "vision_epochs": vision_epochs, "cells": len(jobs)}
    results: dict[str, dict] = {}
    reused = 0
    with runs.recording(ws, runs.ABLATION, config, name="Table 2 ablation") as rec:
        run_id = rec.id
        compute: dict[str, Callable[[dict, int, str], dict]] = {
            "text": lambda cfg, seed, key: soe_cell(ids, llm_by_source[cfg["source"]], expert, cfg, seed),
            "vision": lambda cfg, seed, key: vision_cell(ws, expert, cfg, seed, key),
        }
        bar = tqdm(jobs.items(), desc="ablation cells", unit="cell")
        for done, (key, (cfg, seed, table)) in enumerate(bar):
            path = cache_dir / f"{key}.json"
            if path.exists():
                results[key] = read_json(path)["result"]
                reused += 1
            else:
                bar.set_postfix_str(" ".join(f"{k} {cfg[k]}" for k in ("source", "dim", "budget", "pooling", "loss")
                                             if k in cfg) + f" seed {seed}")
                t0 = time.perf_counter()
                result = {**compute[table](cfg, seed, key), "seconds": time.perf_counter() - t0}
                write_json(path, {"config": cfg, "seed": seed, "code": code[table], "context": context[table],
                                  "result": result}, default=str, indent=None)
                results[key] = result
            ws.store.update_run(run_id, progress=(done + 1) / len(jobs))
        for row in rows:
            row.results.extend(results[key_of(row, seed)] for seed in range(seeds))
        summary = summarise(rows)
        paths = write_outputs(ws, summary, notes, seeds, quick)
        rec.metrics = {"cells_computed": len(jobs) - reused, "cells_reused": reused, "rows": json_safe(summary)}
        rec.artifacts = paths
    return {"summary": summary, "notes": notes, "paths": paths, "run_id": run_id,
            "computed": len(jobs) - reused, "reused": reused}


def titles(ws: Workspace, seeds: int, quick: bool) -> dict[str, str]:
    """The tables' titles (SYNTHETIC marked; seeds and the quick setting named)."""
    tag = " — SYNTHETIC phantom data" if ws.is_synthetic else ""
    q = ", quick" if quick else ""
    return {"text": f"Table 2a — text (SOE on LLM triplets), {seeds} seeds{q}{tag}",
            "vision": f"Table 2b — vision (TriDerm-V), {seeds} seeds{q}{tag}"}


def write_outputs(ws: Workspace, summary: list[dict], notes: list[str], seeds: int, quick: bool) -> dict[str, str]:
    """Write the tables as ``runs/ablation/ablation.md`` and ``.json``; returns the paths by format."""
    out = ws.runs_dir / "ablation"
    t = titles(ws, seeds, quick)
    text = "\n\n".join(format_table(summary, table, t[table]) for table in ("text", "vision")
                       if any(s["table"] == table for s in summary))
    md = "\n".join(["```", text, "```", *notes, ""])
    paths = {"markdown": out / "ablation.md", "json": out / "ablation.json"}
    write_text(paths["markdown"], md)
    write_json(paths["json"], json_safe({"titles": t, "synthetic": ws.is_synthetic, "notes": notes, "rows": summary}),
               indent=1, default=str)
    return {k: str(v) for k, v in paths.items()}

