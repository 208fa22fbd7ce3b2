"""LLM oracle: a language model answers triplets from the wound descriptions, in the background."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from annotations.infra import jobs
from annotations.store import runs as run_kinds
from app import extras, markup, navigation
from app.jobs import any_job_running, job_panel
from core.text.llm import DEFAULT_MODELS, ollama_hosts

JOB = "llm-triplets"

ws = navigation.page("LLM oracle", need="jobs")


def choose_oracle(disabled: bool) -> str:
    """The oracle, chosen outside the form so that the model shown is always the chosen oracle's."""
    return st.columns(3)[0].selectbox("Oracle", ["local", "ollama", "phantom"], disabled=disabled,
                                      help="local: SmolLM2-135M offline (a demo oracle, not a clinical one); "
                                           "ollama: a model served by Ollama; phantom: reads the SYNTHETIC "
                                           "descriptions like a calibrated expert would (benchmarks only)")


def run_form(oracle: str, allowed: list[str], running: bool, hint: str | None) -> tuple[list[str], str] | None:
    """The run's settings; on submit, the job's arguments and the budget as typed (else ``None``). Every
    control is disabled while the job runs or, with the install ``hint`` of a missing ``[llm]`` extra, always.

    The form starts the run with exactly the values submitted with it (nothing typed is left behind).
    """
    off = hint is not None
    with st.form("llm_form"):
        c2, c3 = st.columns(2)
        if oracle == "ollama":
            model = c2.text_input("Model (ollama)", value=DEFAULT_MODELS["ollama"], disabled=off)
            host = c3.selectbox("Ollama host", allowed, disabled=off or not allowed,
                                help="Only the hosts an administrator allowed (workspace setting ollama_hosts)")
        else:
            c2.text_input("Model", value=DEFAULT_MODELS[oracle], disabled=True,
                          help="The model this oracle always uses")
        c4, c5, c6, c7, c8 = st.columns(5)
        budget = c4.text_input("Budget", value="200", disabled=off,
                               help="A count of triplets, or a fraction of all combinations (0.1)")
        sampling = c5.selectbox("Sampling", ["uniform", "anchor-balanced", "active"], disabled=off)
        workers = c6.number_input("Workers", min_value=1, max_value=32, value=1, disabled=off)
        seed = c7.number_input("Seed", min_value=0, value=0, disabled=off)
        max_failures = c8.number_input("Max failures", min_value=1, value=5, disabled=off,
                                       help="Stop asking after this many questions failed after retries")
        debias = st.checkbox("Order debiasing (ask both orders, keep agreeing answers)", disabled=off)
        start = st.form_submit_button("Start LLM run", type="primary", disabled=running or off,
                                      help=f"Needs the [llm] extra: {hint}" if off else
                                      "Stop the running LLM job first" if running else None)
    if not start:
        return None
    args = ["--oracle", oracle, "--budget", budget.strip(), "--sampling", sampling, "--workers", str(int(workers)),
            "--seed", str(int(seed)), "--max-failures", str(int(max_failures))]
    if oracle == "ollama":
        args += ["--model", model.strip() or DEFAULT_MODELS["ollama"], "--ollama-host", str(host)]
    if debias:
        args.append("--debias")
    return args, budget


def start_run(args: list[str], budget: str, oracle: str, allowed: list[str]) -> None:
    """Start the background job, or show why not (a malformed budget, no allowed Ollama host)."""
    from core.text.sampling import parse_budget

    try:
        parse_budget(budget)
        if oracle == "ollama" and not allowed:
            raise ValueError("no Ollama host is allowed on this installation; ask an administrator to add one")
        jobs.start_job(ws, JOB, "llm_triplets", args)
    except ValueError as err:
        st.error(markup.escape_md(str(err)))
    else:
        st.session_state["llm_started"] = " ".join(args)
        st.rerun()  # the form disables and the status refreshes itself while the job runs


@st.fragment(run_every=2.0 if any_job_running(ws) else None)
def status() -> None:
    """The LLM job's panel, the LLM triplets in the store per source and the table of LLM runs."""
    job_panel(ws, JOB, "llm_triplets", [], "LLM run", start=False)
    sources = {s: n for s, n in ws.store.triplet_sources().items() if s.startswith("llm:")}
    runs = ws.store.runs(kind=run_kinds.LLM_TRIPLETS)
    st.markdown("**LLM triplets in the store**")
    if sources:
        st.dataframe(pd.DataFrame([{"source": s, "triplets": n} for s, n in sources.items()]),
                     hide_index=True, width="content")
    else:
        st.caption("None yet.")
    if runs:
        st.markdown("**LLM runs**")
        st.dataframe(pd.DataFrame([{
            "run": r["id"], "status": markup.status_badge(r["status"]), "progress": float(r["progress"] or 0),
            "oracle": r["config"].get("oracle", ""), "model": r["config"].get("model", ""),
            "budget": str(r["config"].get("budget", "")), "message": r["message"] or "",
            "summary": ", ".join(f"{k}={v}" for k, v in r["metrics"].items() if isinstance(v, (int, float))),
        } for r in runs]), hide_index=True, width="stretch",
            column_config={"progress": st.column_config.ProgressColumn("progress", min_value=0, max_value=1)})


def main() -> None:
    """What the oracle does, its run form (disabled, naming the extra, where ``[llm]`` is not installed), and the
    background run's status."""
    st.caption("The LLM acts as a *synthetic expert*: it reads the three photos' wound descriptions and says "
               "whether the query is more like the first or the second reference (TriDerm §2.2). Answers are "
               "cached in the store, so a stopped run resumes with only the missing questions.")
    if ws.store.counts()["described_wounds"] == 0:
        st.info("No wound has a description yet. Write descriptions on the Wound masks page (or import them) first.")
    if started := st.session_state.pop("llm_started", None):
        st.success(f"Started python -m core.llm_triplets {markup.escape_md(started)}")
    allowed = ollama_hosts(ws.store.get_meta("ollama_hosts"))
    record = jobs.job(ws, JOB)
    running = bool(record and record["alive"])
    hint = extras.missing_extra("llm")
    if hint:
        st.warning(f"The LLM oracle runs a language model, which needs the `[llm]` extra this server does not have. "
                   f"To use it, install it on the server and restart the app: `{hint}`.",
                   icon=":material/extension:")
    oracle = choose_oracle(running or hint is not None)
    if submitted := run_form(oracle, allowed, running, hint):
        start_run(*submitted, oracle, allowed)
    st.subheader("Background run")
    status()


main()
