"""The agreement report (TriDerm Table 1): every embedding run against the expert's triplets, with
the training-free fusions of the latest vision and text runs.
"""
from __future__ import annotations

import csv
import logging
from typing import Any

from tqdm import tqdm

from annotations.infra.fileio import atomic_write, write_json, write_text
from annotations.infra.workspace import Workspace
from annotations.io.csvsafe import neutralise
from annotations.store.runs import FUSION, REPORT, TEXT_SOE, VISION_FINETUNE, VISION_TRIDERM, recording
from core.eval.formatting import agreement_text
from core.eval.fusion import DEFAULT_ALPHA, METHODS, fuse
from core.eval.metrics import METRICS, evaluate
from core.eval.retrieval import has_embeddings, run_image_distances
from core.eval.verdict import verdict
from core.runtime import json_safe, save_embeddings

log = logging.getLogger(__name__)

MODALITY_ORDER = ("vision", "text", "fusion", "nested", "concept")


#: The kinds an unnamed input is taken from, in order of preference (the newest run of the first kind that has
#: one): vision prefers the default mode's fine-tuned runs, then TriDerm-V's; text the SOE embedding.
PREFERRED_KINDS = {"vision": (VISION_FINETUNE, VISION_TRIDERM), "text": (TEXT_SOE,)}


# Paper Table 1 (real RDEB photos, 513 expert triplets), for orientation only.
PAPER_TABLE1 = {
    "TriDerm-T (text)": (67.4, 66.1, 66.1, 0.321),
    "TriDerm-V (vision)": (71.6, 70.2, 70.1, 0.403),
    "fusion, similarity": (72.5, 72.1, 72.1, 0.442),
    "fusion, uncertainty": (73.5, 72.3, 72.3, 0.446),
}


def embedding_runs(ws: Workspace, include_ablation: bool = False) -> list[dict]:
    """Finished runs (newest first) whose image distances can be evaluated.

    Runs trained for an ablation cell (tagged ``metrics["ablation_cell"]`` by
    :mod:`core.ablate`) are left out unless ``include_ablation``.
    """
    return [r for r in ws.store.runs(status="done")
            if "modality" in r["config"] and has_embeddings(ws, r)
            and (include_ablation or "ablation_cell" not in r["metrics"])]


def pick_input(ws: Workspace, modality: str, run_id: int | None) -> dict | None:
    """The named run, else the newest run of the first of :data:`PREFERRED_KINDS` that has one (vision:
    ``vision-finetune``, then ``vision-triderm``; text: ``text-soe``), else the newest of that modality."""
    if run_id is not None:
        run = ws.store.run(run_id)
        if run is None:
            raise ValueError(f"--{modality}: no run {run_id} in {ws.root}")
        if run_image_distances(ws, run) is None:
            raise ValueError(f"--{modality}: run {run_id} ({run['kind']}, status {run['status']}) "
                             "is not a finished run with image embeddings")
        return run
    candidates = [r for r in embedding_runs(ws) if r["config"].get("modality") == modality]
    for kind in PREFERRED_KINDS[modality]:
        if preferred := [r for r in candidates if r["kind"] == kind]:
            return preferred[0]
    return candidates[0] if candidates else None


def fusion_config(method: str, vision_id: int, text_id: int, alpha: float) -> dict[str, Any]:
    """The run configuration recorded for a fusion of a vision and a text run."""
    config: dict[str, Any] = {"modality": "fusion", "method": method, "inputs": [int(vision_id), int(text_id)]}
    if method == "uncertainty":
        config["alpha"] = float(alpha)
    return config


def fusion_run(ws: Workspace, method: str, vision: dict, text: dict, alpha: float = DEFAULT_ALPHA,
               expert: list[dict] | None = None) -> tuple[int, bool]:
    """Record (or reuse) the ``method`` fusion of two runs; returns (run id, reused).

    Images missing from either input are left out of the fused matrix, printed and
    listed in the run's metrics (``missing``).
    """
    config = fusion_config(method, vision["id"], text["id"], alpha)
    for run in ws.store.runs(kind=FUSION, status="done"):
        if run["config"] == config and has_embeddings(ws, run):
            return run["id"], True
    vision_d, text_d = run_image_distances(ws, vision), run_image_distances(ws, text)
    assert vision_d is not None and text_d is not None  # pick_input gives runs with image embeddings
    inputs = [vision_d, text_d]
    with recording(ws, FUSION, config, name=f"{method} fusion of runs {vision['id']} + {text['id']}") as rec:
        run_id = rec.id
        fused = fuse(inputs, method=method, alpha=alpha, allow_missing=True)
        missing = {("vision", "text")[m]: ids for m, ids in fused.missing.items()}
        for modality, ids in missing.items():
            log.warning("warning: %d image(s) missing from the %s run, left out of the %s fusion: %s",
                        len(ids), modality, method, ", ".join(ids))
        save_embeddings(ws, run_id, fused.ids, distance=fused.D)
        metrics: dict[str, Any] = {"n_images": len(fused.ids), "missing": missing}
        if expert:
            metrics.update({k: v for k, v in evaluate(fused.ids, fused.D, expert).items()})
        rec.metrics = metrics
    return run_id, False


def _label(run: dict) -> str:
    cfg = run["config"]
    detail = run.get("name") or cfg.get("backbone") or cfg.get("model") or ""
    return f"#{run['id']} {run['kind']}" + (f" ({detail})" if detail else "")


#: what a row's figure measures
ALL_TRIPLETS = "all triplets (no labels used in training)"
STRICT = "strict out of fold: all three photos unseen by training, CI over patients"
IN_SAMPLE = "IN-SAMPLE: trained on these triplets (optimistic; run --cv for its figure)"


def strict_figure(result: dict[str, Any], cv: dict[str, Any]) -> dict[str, Any]:
    """A supervised run's row figures: its stored strict out-of-fold balanced agreement and
    patient-bootstrap CI (the other metrics were not stored: NaN); the in-sample balanced
    agreement is kept as ``in_sample_balanced`` only."""
    nan = float("nan")
    return {**result, **{m: nan for m in METRICS}, "balanced": cv["balanced"],
            "ci": {**{m: [nan, nan] for m in METRICS}, "balanced": list(cv["ci"])},
            "n": cv["n"], "n_anchors": cv["n_anchors"], "per_anchor": [], "in_sample_balanced": result["balanced"]}


def run_figure(run: dict) -> str:
    """A run's figure for a label: a supervised run's stored strict out-of-fold agreement (or that
    it has none: only in-sample), nothing for a run that used no expert labels."""
    if not run["config"].get("supervise"):
        return ""
    cv = run["metrics"].get("cv") or {}
    if cv.get("protocol") != "strict" or cv.get("balanced") is None:
        return " · no strict figure (trained on the triplets, in-sample only)"
    return f" · strict out of fold {agreement_text(cv['balanced'], cv['ci'], unit=' %')}"


def retrieval_figure(run: dict) -> str:
    """A run's stored same-type retrieval of held-out photos for a label (``metrics["cv"]["retrieval"]``, written
    when the photos carry a type: :func:`core.vision.triderm.strict_cv_metrics`), its mAP with the
    patient-bootstrap CI; nothing for a run that stores none."""
    ap = ((run["metrics"].get("cv") or {}).get("retrieval") or {}).get("ap") or {}
    if ap.get("mean") is None:
        return ""
    lo, hi = ap["ci"]
    label = run["metrics"]["cv"]["retrieval"]["label"].replace("_", " ")
    return f" · same-{label} retrieval mAP {100 * ap['mean']:.1f} % [{100 * lo:.1f}, {100 * hi:.1f}]"


def build_rows(ws: Workspace, runs: list[dict], expert: list[dict], n_boot: int, seed: int) -> list[dict]:
    """One result row per run: metrics, CIs, counts, the per-anchor breakdown and ``protocol``.
    A run trained on the expert's triplets shows its stored strict out-of-fold figure
    (``metrics["cv"]``), never its agreement with the triplets it was trained on; without one, the
    in-sample figure is labelled as such."""
    rows = []
    for run in tqdm(runs, desc="evaluating runs", unit="run"):
        pair = run_image_distances(ws, run)
        if pair is None:
            continue
        result = evaluate(*pair, expert, ci=True, n_boot=n_boot, seed=seed)
        protocol = ALL_TRIPLETS
        if run["config"].get("supervise"):
            cv = run["metrics"].get("cv") or {}
            if cv.get("protocol") == "strict" and cv.get("balanced") is not None:
                result, protocol = strict_figure(result, cv), STRICT
            else:
                protocol = IN_SAMPLE
        suffix = {STRICT: " — strict out of fold", IN_SAMPLE: " — IN-SAMPLE"}.get(protocol, "")
        rows.append({"run_id": run["id"], "kind": run["kind"], "modality": run["config"]["modality"],
                     "label": _label(run) + suffix, "n_images": len(pair[0]), "protocol": protocol, **result})
    order = {m: n for n, m in enumerate(MODALITY_ORDER)}
    rows.sort(key=lambda r: (order.get(r["modality"], len(order)), r["modality"], r["run_id"]))
    return rows


def _cell(row: dict, metric: str) -> str:
    kappa = metric == "kappa"
    return agreement_text(row[metric], row["ci"][metric], scale=1 if kappa else 100, digits=3 if kappa else 1)


def title(ws: Workspace) -> str:
    """The report's title: dataset name, marked SYNTHETIC for phantom data."""
    synthetic = " — SYNTHETIC phantom data" if ws.is_synthetic else ""
    return f"Agreement with expert triplets: {ws.dataset_name}{synthetic}"


def markdown(ws: Workspace, rows: list[dict], n_expert: int, n_boot: int) -> str:
    """The agreement report as Markdown: a table per modality, the hardest anchors and the paper's figures."""
    head = ["Run", "Bal. %", "Micro %", "Macro-F1 %", "κ", "triplets", "anchors", "scored on"]
    lines = [f"# {title(ws)}", "",
             f"{n_expert} expert triplet rows; 95 % CIs from {n_boot} bootstrap resamples of anchors (of "
             "patients for a strict out-of-fold figure). A run trained on these triplets shows its strict "
             "out-of-fold figure (micro, macro-F1 and κ not stored: –).", ""]
    for modality in dict.fromkeys(r["modality"] for r in rows):
        lines += [f"## {modality}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in (r for r in rows if r["modality"] == modality):
            cells = [r["label"], *(_cell(r, m) for m in METRICS), str(r["n"]), str(r["n_anchors"]), r["protocol"]]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["## Hardest anchors (lowest per-anchor agreement, 5 per run)", ""]
    for r in rows:
        worst = ", ".join(f"{a['anchor']} {100 * a['accuracy']:.0f}% of {a['n']}" for a in r["per_anchor"][:5])
        lines.append(f"- {r['label']}: {worst}")
    lines += ["", "Paper Table 1 (real RDEB photos, for orientation; Bal./Micro/Macro-F1/κ): "
              + "; ".join(f"{k} {'/'.join(str(x) for x in v)}" for k, v in PAPER_TABLE1.items()), ""]
    return "\n".join(lines)


def text_table(ws: Workspace, rows: list[dict]) -> str:
    """The agreement table of ``rows`` as aligned plain text."""
    width = max([len("run"), *(len(r["label"]) for r in rows)])
    head = f"{'run':{width}s} {'balanced':>20s} {'micro':>20s} {'macro-F1':>20s} {'kappa':>24s} {'n':>5s}"
    lines = [title(ws), head]
    for modality in dict.fromkeys(r["modality"] for r in rows):
        lines.append(f"-- {modality}")
        for r in (r for r in rows if r["modality"] == modality):
            lines.append(f"{r['label']:{width}s} " + " ".join(f"{_cell(r, m):>{24 if m == 'kappa' else 20}s}"
                                                              for m in METRICS) + f" {r['n']:5d}  {r['protocol']}")
    return "\n".join(lines)


def write_report(ws: Workspace, rows: list[dict], n_expert: int, n_boot: int,
                 stated: dict[str, Any] | None = None) -> dict[str, str]:
    """Write report.md / report.csv / report.json (with ``stated``, the :func:`core.eval.verdict.verdict`) under
    runs/report/; return their paths."""
    out = ws.runs_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    paths = {"markdown": out / "report.md", "csv": out / "report.csv", "json": out / "report.json"}
    write_text(paths["markdown"], markdown(ws, rows, n_expert, n_boot))
    with atomic_write(paths["csv"], "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["modality", "run_id", "kind", "label", "protocol", "n_images", "n", "n_anchors",
                         "n_skipped", "n_missing"] + [f"{m}{s}" for m in METRICS for s in ("", "_lo", "_hi")])
        for r in rows:
            writer.writerow(map(neutralise, [r["modality"], r["run_id"], r["kind"], r["label"], r["protocol"],
                                             r["n_images"], r["n"], r["n_anchors"], r["n_skipped"], r["n_missing"]]
                                + [v for m in METRICS for v in (r[m], *r["ci"][m])]))
    report = {"title": title(ws), "synthetic": ws.is_synthetic, "workspace": str(ws.root),
              "expert_triplets": n_expert, "n_boot": n_boot, "rows": rows, "verdict": stated}
    write_json(paths["json"], json_safe(report), indent=1)
    return {k: str(v) for k, v in paths.items()}


def run_report(ws: Workspace, vision: int | None = None, text: int | None = None, alpha: float = DEFAULT_ALPHA,
               n_boot: int = 1000, seed: int = 0, include_ablation: bool = False) -> dict[str, Any]:
    """Compute fusions, evaluate every embedding run, state the verdict (:func:`core.eval.verdict.verdict`),
    write the report; returns {rows, paths, run_id, fusion_runs, verdict}."""
    expert = ws.store.expert_triplets()
    if not expert:
        raise ValueError(f"workspace {ws.root} has no expert triplets to evaluate against")
    if not embedding_runs(ws):
        raise ValueError(f"workspace {ws.root} has no finished runs with image embeddings")
    v, t = pick_input(ws, "vision", vision), pick_input(ws, "text", text)
    config = {"vision": v and v["id"], "text": t and t["id"], "alpha": alpha, "n_boot": n_boot,
              "include_ablation": include_ablation}
    with recording(ws, REPORT, config, seed=seed, name="agreement report") as rec:
        report_id = rec.id
        fusions = {}
        if v is not None and t is not None:
            for method in METHODS:
                fusions[method], reused = fusion_run(ws, method, v, t, alpha, expert)
                log.info("%s fusion of runs %s (vision) + %s (text): run %s%s", method, v["id"], t["id"],
                         fusions[method], " (reused)" if reused else "")
        else:
            log.info("no fusion: need a vision and a text run (found vision=%s, text=%s)", config["vision"],
                     config["text"])
        rows = build_rows(ws, embedding_runs(ws, include_ablation), expert, n_boot, seed)
        found = verdict(ws, embedding_runs(ws), n_boot, seed)
        paths = write_report(ws, rows, len(expert), n_boot, found)
        summary = {str(r["run_id"]): {m: r[m] for m in METRICS} for r in rows}
        rec.metrics = {"runs": summary, "fusion_runs": fusions, "expert_triplets": len(expert)}
        rec.artifacts = paths
    return {"rows": rows, "paths": paths, "run_id": report_id, "fusion_runs": fusions, "verdict": found}

