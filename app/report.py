"""The Report page's logic: one function per section (:func:`main` draws them; pages/6_Report.py starts the page
and calls it), the tables' cells and rows from plain functions (``metric_cell``, ``seeds_cell``, ``agreement_rows``,
``ablation_rows``, ``benchmark_rows``)."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path

import pandas as pd
import plotly.express as px
import plotly.io as pio
import streamlit as st

from annotations.infra.fileio import read_json
from annotations.infra.workspace import Workspace
from annotations.io.csvsafe import neutralise
from app import markup

REPORT_METRICS = {"balanced": "Balanced %", "micro": "Micro %", "macro_f1": "Macro-F1 %", "kappa": "κ"}


def metric_text(value: float | None, metric: str) -> str:
    """An agreement figure as the report shows it: κ to 3 decimals, the others in % to 1; "–" when missing."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:.3f}" if metric == "kappa" else f"{100 * value:.1f}"


def metric_cell(row: Mapping, metric: str) -> str:
    """A report row's ``metric`` with its 95 % CI in brackets when it has one."""
    lo, hi = (row.get("ci") or {}).get(metric, (None, None))
    ci = f" [{metric_text(lo, metric)}, {metric_text(hi, metric)}]" if lo is not None else ""
    return metric_text(row.get(metric), metric) + ci


def seeds_cell(c: object, seeds: int) -> object:
    """A benchmark cell ``{"mean", "sd", "ci", "n"}`` as mean [± sd] [95% CI], saying over how many seeds
    (``seeds`` when the cell does not say); a cell without sd or ``n`` is one estimate from records pooled
    over the seeds (its table's legend says so) and gets no seed count; no interval where there is none;
    other values as they are."""
    if not isinstance(c, dict):
        return "–" if c is None else c  # no triplets in the dataset: no agreement to show
    ci = c.get("ci")
    interval = f" [{ci[0]:.1f}, {ci[1]:.1f}]" if ci and ci[0] != ci[1] else ""
    if c.get("sd") is None and "n" not in c:
        return f"{c['mean']:.1f}{interval}"
    n = c.get("n", seeds)
    if c.get("sd") is None or n < 2:
        return f"{c['mean']:.1f}{interval} (1 seed)"
    if c["sd"] == 0:
        return f"{c['mean']:.1f}{interval} (same on all {n} seeds)"
    return f"{c['mean']:.1f} ± {c['sd']:.1f}{interval} ({n} seeds)"


def agreement_rows(rows: list[dict]) -> list[dict]:
    """The agreement report's table: one row per run with each metric and its CI."""
    return [{"modality": r.get("modality"), "run": r.get("run_id"), "method": r.get("label"),
             **{label: metric_cell(r, m) for m, label in REPORT_METRICS.items()}, "triplets": r.get("n"),
             "anchors": r.get("n_anchors"), "scored on": r.get("protocol", "all triplets")} for r in rows]


def ablation_rows(rows: list[dict]) -> list[dict]:
    """An ablation table's rows: factor, setting, seeds, balanced and micro % as mean ± sd, the paper's figure."""
    def pm(r: dict, m: str) -> str:
        return f"{100 * (r.get(f'{m}_mean') or 0):.1f} ± {100 * (r.get(f'{m}_sd') or 0):.1f}"

    return [{"factor": r.get("factor"), "setting": r.get("label"), "seeds": r.get("seeds"),
             "balanced % (mean ± sd)": pm(r, "balanced"), "micro % (mean ± sd)": pm(r, "micro"),
             "paper %": r.get("paper")} for r in rows]


def benchmark_rows(summary: dict, paired: bool = False) -> list[dict]:
    """The contrastive benchmark's table: mean ± sd per variant and metric, or with ``paired`` the seed-paired
    difference from ``clip`` (``*`` where its paired t-test has p < 0.05; the majority baseline left out)."""
    if paired:
        return [{"variant": v, **{m: f"{d[0]:+.3f} ± {d[1]:.3f}{'*' if d[2] else ''}"
                                  for m, d in metrics.items() if m != "probe_majority"}}
                for v, metrics in summary.items()]
    return [{"variant": v, **{m: f"{ms[0]:.3f} ± {ms[1]:.3f}" for m, ms in metrics.items()}}
            for v, metrics in summary.items()]


def real_vision_result(res: dict) -> None:
    """One real-data result file: its tables (a learning curve plotted), claims and notes."""
    st.markdown(f"**{res['title']}** — seeds {', '.join(map(str, res['seeds']))}, {res['date'][:10]}, "
                f"`{res['command']}`")
    st.caption("Data: " + ("SYNTHETIC phantoms." if res.get("synthetic") else
                           "REAL wound photos (not the synthetic demo of this workspace)."))
    for table in res["tables"]:
        if "training triplets" in table["columns"]:  # a learning curve: plotted
            points = [{"method": m, "training triplets": n, "balanced %": c["mean"]}
                      for m, n, c in table["rows"] if c]
            if points:
                fig = px.line(pd.DataFrame(points), x="training triplets", y="balanced %", color="method",
                              markers=True, log_x=True, title=table["caption"])
                st.plotly_chart(fig, width="stretch")
            continue
        st.caption(table["caption"] + (f" — {table['legend']}" if table.get("legend") else ""))
        st.dataframe(pd.DataFrame([[seeds_cell(c, len(res["seeds"])) for c in row] for row in table["rows"]],
                                  columns=table["columns"]),
                     hide_index=True, width="stretch", height="content",  # every row: the headline is last
                     column_config={table["columns"][0]: st.column_config.TextColumn(width="large")})
    for claim in res["claims"]:
        verdict = "holds" if claim["holds"] else "does not hold"
        st.markdown(f"- {claim['claim']}: **{verdict}** (p = {claim['p']:.3g}; {claim['test']})")
    for note in res["notes"]:
        st.caption(note)


def real_vision_section() -> None:
    """The real-wound vision benchmarks of the repository's results (not this workspace's data)."""
    st.subheader("Real wounds: vision benchmark")
    results_dir = Path(os.environ.get("TRIDERM_RESULTS_DIR") or Path(__file__).resolve().parents[1] / "results")
    real = sorted(results_dir.glob("real_vision*.json"))
    if not real:
        st.info("No real-data vision benchmark yet (`python -m benchmarks.real_vision --data DATASET_FOLDER`).")
    for path in real:
        real_vision_result(read_json(path))


def interval_chart(bars: list[dict], height: int) -> None:
    """Horizontal bars ``{"method", "balanced", "lo", "hi"}`` (%, with an optional ``modality`` colour) and their
    95 % CIs on an axis from 0 to 100 %, beside chance (50 %)."""
    chart = pd.DataFrame(bars)
    fig = px.bar(chart, x="balanced", y="method", color="modality" if "modality" in chart else None,
                 orientation="h", error_x=chart["hi"] - chart["balanced"],
                 error_x_minus=chart["balanced"] - chart["lo"],
                 labels={"balanced": "balanced agreement % (95 % CI)", "method": ""})
    fig.add_vline(x=50, line_dash="dot", annotation_text="chance (50 %)")
    fig.update_layout(height=height, margin={"t": 20, "b": 40}, yaxis={"autorange": "reversed"},
                      xaxis={"range": [0, 100]})
    st.plotly_chart(fig, width="stretch")


def agreement_chart(rows: list[dict]) -> None:
    """Balanced agreement per run with its 95 % CI, beside chance (50 %)."""
    interval_chart([{"method": f"{r.get('label')} (run {r.get('run_id')})", "modality": r.get("modality"),
                     "balanced": 100 * (r.get("balanced") or 0),
                     "lo": 100 * ((r.get("ci") or {}).get("balanced", [0, 0])[0] or 0),
                     "hi": 100 * ((r.get("ci") or {}).get("balanced", [0, 0])[1] or 0)} for r in rows],
                   120 + 36 * len(rows))


def verdict_section(report: dict | None) -> None:
    """The workspace's result in one line (:func:`core.eval.verdict.verdict`, saved with the report), the two
    runs on their common held-out triplets, and the next step."""
    st.subheader("Verdict")
    if report is None:
        st.info("No evaluation yet. Start training on the Train page (mode auto; it evaluates when it ends) or an "
                "evaluation (`python -m core.evaluate`): the verdict compares the trained embedding with the "
                "untrained one on the same triplets.")
        return
    found = report.get("verdict")
    if not found:
        st.info("This evaluation was saved before the verdict existed: start the evaluation again on the Train page.")
        return
    st.markdown(f"**{markup.escape_md(found['line'])}**")
    st.markdown(f"**Next step:** {markup.escape_md(found['next_step'])}")
    if "n" not in found:
        return
    interval_chart([{"method": f"{name} (run {found[f'{key}_run']})", "balanced": 100 * found[key]["balanced"],
                     "lo": 100 * found[key]["ci"][0], "hi": 100 * found[key]["ci"][1]}
                    for key, name in (("trained", "trained"), ("untrained", "untrained"))], 190)
    others = [f"{found[f'n_{key}_only']} scored only for the {key} run" for key in ("trained", "untrained")
              if found[f"n_{key}_only"]]
    st.caption(f"Both runs on the same {found['n']} held-out triplets ({found['n_anchors']} anchor photos, "
               f"{found['n_patients']} patients); 95 % CIs resample patients"
               + (f"; left out: {', '.join(others)}" if others else "") + ".")


def agreement_section(ws: Workspace, report: dict | None) -> None:
    """Each embedding run's agreement with the expert's triplets, from the evaluation report."""
    st.subheader("Agreement with the expert's triplets")
    if report is None:
        st.info("No evaluation report yet. Start an evaluation on the Train page (`python -m core.evaluate`): it "
                "compares every finished embedding run with the expert's triplets.")
        return
    st.markdown(f"**{markup.escape_md(report.get('title', 'Agreement report'))}** — {report.get('expert_triplets', '?')} "
                f"expert triplet rows, 95 % CIs from {report.get('n_boot', '?')} bootstrap resamples of anchors "
                "(of patients for a strict out-of-fold figure). A run trained on these triplets shows its strict "
                "out-of-fold figure — all three photos of a triplet unseen by training — never its in-sample one. "
                "Each row is scored on its own triplets (column *triplets*): the verdict above compares two runs "
                "on the same ones.")
    if report.get("synthetic"):
        st.caption("SYNTHETIC phantom data: these numbers describe the demo, not clinical performance.")
    rows = report.get("rows", [])
    st.dataframe(pd.DataFrame(agreement_rows(rows)), hide_index=True, width="stretch")
    if rows:
        agreement_chart(rows)
    for col, name, mime in zip(st.columns(3), ("report.csv", "report.md", "report.json"),
                               ("text/csv", "text/markdown", "application/json")):
        path = ws.runs_dir / "report" / name
        if path.exists():
            col.download_button(f"Download {name}", path.read_bytes(), file_name=name, mime=mime,
                                key=f"dl_{name}")


def ablation_section(ws: Workspace) -> None:
    """The ablation table (paper Table 2), when the ablations have run."""
    st.subheader("Ablations (paper Table 2)")
    ablation_json = ws.runs_dir / "ablation" / "ablation.json"
    if not ablation_json.exists():
        st.info("No ablation results yet. Start them on the Train page (`python -m core.ablate --quick`).")
        return
    abl = read_json(ablation_json)
    if abl.get("synthetic"):
        st.caption("SYNTHETIC phantom data.")
    for table, title in (abl.get("titles") or {}).items():
        rows = [r for r in abl.get("rows", []) if r.get("table") == table]
        if rows:
            st.markdown(f"**{markup.escape_md(title)}**")
            st.dataframe(pd.DataFrame(ablation_rows(rows)), hide_index=True, width="stretch")
    for note in abl.get("notes", []):
        st.caption(note)
    md = ws.runs_dir / "ablation" / "ablation.md"
    if md.exists():
        st.download_button("Download ablation.md", md.read_bytes(), file_name="ablation.md", mime="text/markdown")
    table = pd.DataFrame(abl.get("rows", []))
    if not table.empty:
        st.download_button("Download ablation.csv", table.drop(columns=["config"], errors="ignore").map(neutralise)
                           .to_csv(index=False),
                           file_name="ablation.csv", mime="text/csv")


def contrastive_section(ws: Workspace) -> None:
    """The contrastive-objective benchmark: summary, seed-paired differences from ``clip``, chart and downloads."""
    results = ws.runs_dir / "bench_contrastive" / "results.json"
    if not results.exists():
        st.info("No contrastive-objective benchmark yet. Start it on the Train page "
                "(`python -m core.bench_contrastive --quick`).")
        return
    res = read_json(results)
    st.subheader("Contrastive-objective benchmark")
    settings = res.get("settings", {})
    st.caption(f"{settings.get('n_seeds', settings.get('seeds', '?'))} seed(s), {settings.get('epochs', '?')} epochs, "
               f"{settings.get('n_wounds', '?')} wounds ({settings.get('n_heldout', '?')} held out per seed on "
               f"average), model {settings.get('model', '?')}. Chance: Recall@K = K / held-out wounds; the linear "
               f"probe ({settings.get('target', '?')}) against `probe_majority`.")
    if res.get("synthetic"):
        st.caption("SYNTHETIC phantom data: these numbers describe the demo, not clinical performance.")
    st.dataframe(pd.DataFrame(benchmark_rows(res.get("summary", {}))), hide_index=True, width="stretch")
    for variant, why in res.get("skipped", {}).items():
        st.caption(f"{variant} skipped: {why}")
    paired = res.get("paired_vs_baseline") or {}
    if paired:
        st.markdown("**Seed-paired difference from `clip`** (mean ± sd; * paired t-test p < 0.05)")
        st.dataframe(pd.DataFrame(benchmark_rows(paired, paired=True)), hide_index=True, width="stretch")
    chart = ws.runs_dir / "bench_contrastive" / "chart.json"
    if chart.exists():
        st.plotly_chart(pio.from_json(chart.read_text(encoding="utf-8")), width="stretch")
    for name, mime in (("table.csv", "text/csv"), ("table.md", "text/markdown")):
        path = ws.runs_dir / "bench_contrastive" / name
        if path.exists():
            st.download_button(f"Download benchmark {name}", path.read_bytes(), file_name=f"bench_contrastive_{name}",
                               mime=mime)


def main(ws: Workspace) -> None:
    """The Report page: this workspace's verdict and sections, then the real-wound benchmark, collapsed."""
    st.header(f"This workspace · {markup.escape_md(ws.dataset_name)}")
    if ws.is_synthetic:
        st.warning("**SYNTHETIC DATA** — phantom wounds from `core.phantoms`: every number and chart of this "
                   "workspace is synthetic, not clinical (the real-wound benchmark at the bottom is not).",
                   icon=":material/science:")
    report_json = ws.runs_dir / "report" / "report.json"
    report = read_json(report_json) if report_json.exists() else None
    verdict_section(report)
    agreement_section(ws, report)
    ablation_section(ws)
    contrastive_section(ws)
    st.divider()
    with st.expander("Real wounds: the repository's vision benchmark (not this workspace's data)"):
        real_vision_section()
