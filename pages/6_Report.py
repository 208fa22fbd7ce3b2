"""Report: agreement with the expert triplets (with CIs), ablation tables, benchmark charts; downloads."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pandas as pd
import plotly.express as px
import plotly.io as pio
import streamlit as st

import app_common as ac
from annotations.fileio import read_json

METRICS = {"balanced": "Balanced %", "micro": "Micro %", "macro_f1": "Macro-F1 %", "kappa": "κ"}

ws = ac.page("Report", need="view")
report_dir = ws.runs_dir / "report"
ablation_dir = ws.runs_dir / "ablation"
bench_dir = ws.runs_dir / "bench_contrastive"


def fmt(value, metric: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:.3f}" if metric == "kappa" else f"{100 * value:.1f}"


def cell(row: dict, metric: str) -> str:
    lo, hi = (row.get("ci") or {}).get(metric, (None, None))
    ci = f" [{fmt(lo, metric)}, {fmt(hi, metric)}]" if lo is not None else ""
    return fmt(row.get(metric), metric) + ci


st.subheader("Agreement with the expert's triplets")
report_json = report_dir / "report.json"
if report_json.exists():
    report = read_json(report_json)
    st.markdown(f"**{ac.escape_md(report.get('title', 'Agreement report'))}** — {report.get('expert_triplets', '?')} "
                f"expert triplet rows, 95 % CIs from {report.get('n_boot', '?')} bootstrap resamples of anchors "
                "(of patients for a strict out-of-fold figure). A run trained on these triplets shows its strict "
                "out-of-fold figure — all three photos of a triplet unseen by training — never its in-sample one.")
    if report.get("synthetic"):
        st.caption("SYNTHETIC phantom data: these numbers describe the demo, not clinical performance.")
    rows = report.get("rows", [])
    table = pd.DataFrame([{
        "modality": r.get("modality"), "run": r.get("run_id"), "method": r.get("label"),
        **{label: cell(r, m) for m, label in METRICS.items()}, "triplets": r.get("n"), "anchors": r.get("n_anchors"),
        "scored on": r.get("protocol", "all triplets"),
    } for r in rows])
    st.dataframe(table, hide_index=True, width="stretch")
    if rows:
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
    c1, c2, c3 = st.columns(3)
    for col, name, mime in ((c1, "report.csv", "text/csv"), (c2, "report.md", "text/markdown"),
                            (c3, "report.json", "application/json")):
        path = report_dir / name
        if path.exists():
            col.download_button(f"Download {name}", path.read_bytes(), file_name=name, mime=mime,
                                key=f"dl_{name}")
else:
    st.info("No evaluation report yet. Start an evaluation on the Train page (`python -m core.evaluate`): it "
            "compares every finished embedding run with the expert's triplets.")

st.subheader("Ablations (paper Table 2)")
ablation_json = ablation_dir / "ablation.json"
if ablation_json.exists():
    abl = read_json(ablation_json)
    if abl.get("synthetic"):
        st.caption("SYNTHETIC phantom data.")
    for table, title in (abl.get("titles") or {}).items():
        rows = [r for r in abl.get("rows", []) if r.get("table") == table]
        if not rows:
            continue
        st.markdown(f"**{ac.escape_md(title)}**")
        st.dataframe(pd.DataFrame([{
            "factor": r.get("factor"), "setting": r.get("label"), "seeds": r.get("seeds"),
            "balanced % (mean ± sd)": f"{100 * (r.get('balanced_mean') or 0):.1f} ± {100 * (r.get('balanced_sd') or 0):.1f}",
            "micro % (mean ± sd)": f"{100 * (r.get('micro_mean') or 0):.1f} ± {100 * (r.get('micro_sd') or 0):.1f}",
            "paper %": r.get("paper"),
        } for r in rows]), hide_index=True, width="stretch")
    for note in abl.get("notes", []):
        st.caption(note)
    md = ablation_dir / "ablation.md"
    if md.exists():
        st.download_button("Download ablation.md", md.read_bytes(), file_name="ablation.md", mime="text/markdown")
    table = pd.DataFrame(abl.get("rows", []))
    if not table.empty:
        st.download_button("Download ablation.csv", table.drop(columns=["config"], errors="ignore").to_csv(index=False),
                           file_name="ablation.csv", mime="text/csv")
else:
    st.info("No ablation results yet. Start them on the Train page (`python -m core.ablate --quick`).")

results = bench_dir / "results.json"
if results.exists():
    res = read_json(results)
    st.subheader("Contrastive-objective benchmark")
    settings = res.get("settings", {})
    st.caption(f"{settings.get('n_seeds', settings.get('seeds', '?'))} seed(s), {settings.get('epochs', '?')} epochs, "
               f"{settings.get('n_wounds', '?')} wounds ({settings.get('n_heldout', '?')} held out per seed on "
               f"average), model {settings.get('model', '?')}. Chance: Recall@K = K / held-out wounds; the linear "
               f"probe ({settings.get('target', '?')}) against `probe_majority`.")
    if res.get("synthetic"):
        st.caption("SYNTHETIC phantom data: these numbers describe the demo, not clinical performance.")
    st.dataframe(pd.DataFrame([{"variant": v, **{m: f"{ms[0]:.3f} ± {ms[1]:.3f}" for m, ms in metrics.items()}}
                               for v, metrics in res.get("summary", {}).items()]), hide_index=True, width="stretch")
    for variant, why in res.get("skipped", {}).items():
        st.caption(f"{variant} skipped: {why}")
    paired = res.get("paired_vs_baseline") or {}
    if paired:
        st.markdown("**Seed-paired difference from `clip`** (mean ± sd; * paired t-test p < 0.05)")
        st.dataframe(pd.DataFrame([{"variant": v, **{m: f"{d[0]:+.3f} ± {d[1]:.3f}{'*' if d[2] else ''}"
                                                     for m, d in metrics.items() if m != "probe_majority"}}
                                   for v, metrics in paired.items()]), hide_index=True, width="stretch")
    chart = bench_dir / "chart.json"
    if chart.exists():
        st.plotly_chart(pio.from_json(chart.read_text(encoding="utf-8")), width="stretch")
    for name, mime in (("table.csv", "text/csv"), ("table.md", "text/markdown")):
        path = bench_dir / name
        if path.exists():
            st.download_button(f"Download benchmark {name}", path.read_bytes(), file_name=f"bench_contrastive_{name}",
                               mime=mime)
else:
    st.info("No contrastive-objective benchmark yet. Start it on the Train page "
            "(`python -m core.bench_contrastive --quick`).")

st.subheader("Real wounds: vision benchmark")
RESULTS = Path(os.environ.get("TRIDERM_RESULTS_DIR") or Path(__file__).resolve().parents[1] / "results")
real = sorted(RESULTS.glob("real_vision*.json"))
if not real:
    st.info("No real-data vision benchmark yet (`python -m benchmarks.real_vision --data DATASET_FOLDER`).")
for path in real:
    res = read_json(path)
    st.markdown(f"**{res['title']}** — seeds {', '.join(map(str, res['seeds']))}, {res['date'][:10]}, "
                f"`{res['command']}`")
    st.caption("Data: " + ("SYNTHETIC phantoms." if res.get("synthetic") else
                           "REAL wound photos (not the synthetic demo of this workspace)."))

    def show(c, seeds: int = len(res["seeds"])):
        """A mean [± sd] [95% CI] cell, saying over how many seeds; no interval where there is none."""
        if not isinstance(c, dict):
            return "–" if c is None else c  # no triplets in the dataset: no agreement to show
        n = c.get("n", seeds)
        ci = c.get("ci")
        interval = f" [{ci[0]:.1f}, {ci[1]:.1f}]" if ci and ci[0] != ci[1] else ""
        if c.get("sd") is None or n < 2:
            return f"{c['mean']:.1f}{interval} (1 seed)"
        if c["sd"] == 0:
            return f"{c['mean']:.1f}{interval} (same on all {n} seeds)"
        return f"{c['mean']:.1f} ± {c['sd']:.1f}{interval} ({n} seeds)"

    for table in res["tables"]:
        if "training triplets" in table["columns"]:  # a learning curve: plotted
            points = [{"method": m, "training triplets": n, "balanced %": c["mean"]} for m, n, c in table["rows"] if c]
            if points:
                fig = px.line(pd.DataFrame(points), x="training triplets", y="balanced %", color="method",
                              markers=True, log_x=True, title=table["caption"])
                st.plotly_chart(fig, width="stretch")
            continue
        st.caption(table["caption"] + (f" — {table['legend']}" if table.get("legend") else ""))
        st.dataframe(pd.DataFrame([[show(c) for c in row] for row in table["rows"]], columns=table["columns"]),
                     hide_index=True, width="stretch",
                     column_config={table["columns"][0]: st.column_config.TextColumn(width="large")})
    for claim in res["claims"]:
        verdict = "holds" if claim["holds"] else "does not hold"
        st.markdown(f"- {claim['claim']}: **{verdict}** (p = {claim['p']:.3g}; {claim['test']})")
    for note in res["notes"]:
        st.caption(note)
