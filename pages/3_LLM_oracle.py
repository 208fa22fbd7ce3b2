"""LLM oracle: a language model answers triplets from the wound descriptions, in the background."""

from __future__ import annotations

import pandas as pd
import streamlit as st

import app_common as ac

ws = ac.page("LLM oracle", need="jobs")
st.caption("The LLM acts as a *synthetic expert*: it reads the three photos' wound descriptions and says whether "
           "the query is more like the first or the second reference (TriDerm §2.2). Answers are cached in the "
           "store, so a stopped run resumes with only the missing questions.")

counts = ws.store.counts()
if counts["described_wounds"] == 0:
    st.info("No wound has a description yet. Write descriptions on the Wound masks page (or import them) first.")

with st.form("llm_form"):
    c1, c2, c3 = st.columns(3)
    oracle = c1.selectbox("Oracle", ["local", "ollama", "phantom"],
                          help="local: SmolLM2-135M offline (a demo oracle, not a clinical one); "
                               "ollama: a model served by Ollama; phantom: reads the SYNTHETIC descriptions "
                               "like a calibrated expert would (benchmarks only)")
    model = c2.text_input("Model (ollama)", value="gpt-oss:120b", help="Ignored by the local and phantom oracles")
    host = c3.text_input("Ollama host", value="", placeholder="default: $OLLAMA_HOST or localhost")
    c4, c5, c6, c7 = st.columns(4)
    budget = c4.text_input("Budget", value="200", help="A count of triplets, or a fraction of all combinations (0.1)")
    sampling = c5.selectbox("Sampling", ["uniform", "anchor-balanced", "active"])
    workers = c6.number_input("Workers", min_value=1, max_value=32, value=1)
    seed = c7.number_input("Seed", min_value=0, value=0)
    debias = st.checkbox("Order debiasing (ask both orders, keep agreeing answers)")
    submitted = st.form_submit_button("Use these settings")

args = ["--oracle", oracle, "--budget", budget.strip() or "200", "--sampling", sampling,
        "--workers", str(int(workers)), "--seed", str(int(seed))]
if oracle == "ollama":
    if model.strip():
        args += ["--model", model.strip()]
    if host.strip():
        args += ["--host", host.strip()]
if debias:
    args.append("--debias")


@st.fragment(run_every=2.0 if ac.any_job_running(ws) else None)
def status() -> None:
    ac.job_panel(ws, "llm-triplets", "llm_triplets", args, "LLM run")
    sources = {s: n for s, n in ws.store.triplet_sources().items() if s.startswith("llm:")}
    runs = ws.store.runs(kind="llm-triplets")
    st.markdown("**LLM triplets in the store**")
    if sources:
        st.dataframe(pd.DataFrame([{"source": s, "triplets": n} for s, n in sources.items()]),
                     hide_index=True, width="content")
    else:
        st.caption("None yet.")
    if runs:
        st.markdown("**LLM runs**")
        st.dataframe(pd.DataFrame([{
            "run": r["id"], "status": ac.status_badge(r["status"]), "progress": float(r["progress"] or 0),
            "oracle": r["config"].get("oracle", ""), "model": r["config"].get("model", ""),
            "budget": str(r["config"].get("budget", "")), "message": r["message"] or "",
            "summary": ", ".join(f"{k}={v}" for k, v in r["metrics"].items() if isinstance(v, (int, float))),
        } for r in runs]), hide_index=True, width="stretch",
            column_config={"progress": st.column_config.ProgressColumn("progress", min_value=0, max_value=1)})


st.subheader("Background run")
status()
