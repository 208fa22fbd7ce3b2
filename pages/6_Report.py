"""Report: the real-wound benchmark, then this workspace's agreement with the expert triplets (with CIs),
ablation tables and benchmark charts; downloads. Each part says what data it is on: the SYNTHETIC banner
heads this workspace's sections only, never the real-data one.

One function per section (:func:`main` draws them); the tables' cells and rows come from plain
functions of :mod:`app_common` (``metric_cell``, ``seeds_cell``, ``agreement_rows``, ``ablation_rows``,
``benchmark_rows``)."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import plotly.express as px
import plotly.io as pio
import streamlit as st

import app_common as ac
from annotations.csvsafe import neutralise
from annotations.fileio import read_json

ws = ac.page("Report", need="view", banner=False)  # the banner heads the workspace's sections below
report_dir = ws.runs_dir / "report"
ablation_dir = ws.runs_dir / "ablation"
bench_dir = ws.runs_dir / "bench_contrastive"


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
        st.dataframe(pd.DataFrame([[ac.seeds_cell(c, len(res["seeds"])) for c in row] for row in table["rows"]],
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


def agreement_chart(rows: list[dict]) -> None:
    """Balanced agreement per run with its 95 % CI, beside chance (50 %)."""
    chart = pd.DataFrame([{"method": f"{r.get('label')} (run {r.get('run_id')})", "modality": r.get("modality"),
                           "balanced": 100 * (r.get("balanced") or 0),
                           "lo": 100 * ((r.get("ci") or {}).get("balanced", [0, 0])[0] or 0),
                           "hi": 100 * ((r.get("ci") or {}).get("balanced", [0, 0])[1] or 0)} for r in rows])
    fig = px.bar(chart, x="balanced", y="method", color="modality", orientation="h",
                 error_x=chart["hi"] - chart["balanced"], error_x_minus=chart["balanced"] - chart["lo"],
                 labels={"balanced": "balanced agreement % (95 % CI)", "method": ""})
    fig.add_vline(x=50, line_dash="dot", annotation_text="chance")
    low = max(0.0, min(45.0, float(chart["lo"].min()) - 5))
    fig.update_layout(height=120 + 36 * len(rows), margin={"t": 20, "b": 40}, yaxis={"autorange": "reversed"},
                      xaxis={"range": [low, min(100.0, float(chart["hi"].max()) + 5)]})
    st.plotly_chart(fig, width="stretch")


def agreement_section() -> None:
    """Each embedding run's agreement with the expert's triplets, from the evaluation report."""
    st.subheader("Agreement with the expert's triplets")
    report_json = report_dir / "report.json"
    if not report_json.exists():
        st.info("No evaluation report yet. Start an evaluation on the Train page (`python -m core.evaluate`): it "
                "compares every finished embedding run with the expert's triplets.")
        return
    report = read_json(report_json)
    st.markdown(f"**{ac.escape_md(report.get('title', 'Agreement report'))}** — {report.get('expert_triplets', '?')} "
                f"expert triplet rows, 95 % CIs from {report.get('n_boot', '?')} bootstrap resamples of anchors "
                "(of patients for a strict out-of-fold figure). A run trained on these triplets shows its strict "
                "out-of-fold figure — all three photos of a triplet unseen by training — never its in-sample one.")
    if report.get("synthetic"):
        st.caption("SYNTHETIC phantom data: these numbers describe the demo, not clinical performance.")
    rows = report.get("rows", [])
    st.dataframe(pd.DataFrame(ac.agreement_rows(rows)), hide_index=True, width="stretch")
    if rows:
        agreement_chart(rows)
    for col, name, mime in zip(st.columns(3), ("report.csv", "report.md", "report.json"),
                               ("text/csv", "text/markdown", "application/json")):
        path = report_dir / name
        if path.exists():
            col.download_button(f"Download {name}", path.read_bytes(), file_name=name, mime=mime,
                                key=f"dl_{name}")


def ablation_section() -> None:
    """The ablation table (paper Table 2), when the ablations have run."""
    st.subheader("Ablations (paper Table 2)")
    ablation_json = ablation_dir / "ablation.json"
    if not ablation_json.exists():
        st.info("No ablation results yet. Start them on the Train page (`python -m core.ablate --quick`).")
        return
    abl = read_json(ablation_json)
    if abl.get("synthetic"):
        st.caption("SYNTHETIC phantom data.")
    for table, title in (abl.get("titles") or {}).items():
        rows = [r for r in abl.get("rows", []) if r.get("table") == table]
        if rows:
            st.markdown(f"**{ac.escape_md(title)}**")
            st.dataframe(pd.DataFrame(ac.ablation_rows(rows)), hide_index=True, width="stretch")
    for note in abl.get("notes", []):
        st.caption(note)
    md = ablation_dir / "ablation.md"
    if md.exists():
        st.download_button("Download ablation.md", md.read_bytes(), file_name="ablation.md", mime="text/markdown")
    table = pd.DataFrame(abl.get("rows", []))
    if not table.empty:
        st.download_button("Download ablation.csv", table.drop(columns=["config"], errors="ignore").map(neutralise)
                           .to_csv(index=False),
                           file_name="ablation.csv", mime="text/csv")


def contrastive_section() -> None:
    """The contrastive-objective benchmark: summary, seed-paired differences from ``clip``, chart and downloads."""
    results = bench_dir / "results.json"
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
    st.dataframe(pd.DataFrame(ac.benchmark_rows(res.get("summary", {}))), hide_index=True, width="stretch")
    for variant, why in res.get("skipped", {}).items():
        st.caption(f"{variant} skipped: {why}")
    paired = res.get("paired_vs_baseline") or {}
    if paired:
        st.markdown("**Seed-paired difference from `clip`** (mean ± sd; * paired t-test p < 0.05)")
        st.dataframe(pd.DataFrame(ac.benchmark_rows(paired, paired=True)), hide_index=True, width="stretch")
    chart = bench_dir / "chart.json"
    if chart.exists():
        st.plotly_chart(pio.from_json(chart.read_text(encoding="utf-8")), width="stretch")
    for name, mime in (("table.csv", "text/csv"), ("table.md", "text/markdown")):
        path = bench_dir / name
        if path.exists():
            st.download_button(f"Download benchmark {name}", path.read_bytes(), file_name=f"bench_contrastive_{name}",
                               mime=mime)


def main() -> None:
    """The Report page: the real-wound benchmark, then this workspace's sections."""
    real_vision_section()
    st.divider()
    st.header(f"This workspace · {ac.escape_md(ws.dataset_name)}")
    if ws.is_synthetic:
        st.warning("**SYNTHETIC DATA** — this workspace holds phantom wounds generated by `core.phantoms`: every "
                   "number and chart from here down is synthetic, not clinical. The real-wound benchmark above is not.",
                   icon=":material/science:")
    agreement_section()
    ablation_section()
    contrastive_section()


main()
