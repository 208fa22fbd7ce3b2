"""TriDerm Studio — ``streamlit run app.py [-- --workspace PATH]``.

Home page (sign-in, workspace overview, import / demo) and the router for the pages in
``pages/``. Until the access code (``TRIDERM_ACCESS_CODE`` or the ``access_code`` secret) is
given, only the sign-in form exists: no other page is even routable.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pandas as pd
import streamlit as st

import app_common as ac
from annotations import session
from annotations.dataset import import_dataset
from annotations.readers import DatasetError

PAGES = [
    ("pages/1_Wound_masks.py", "Wound masks", ":material/draw:"),
    ("pages/2_Triplets.py", "Triplet judgments", ":material/compare:"),
    ("pages/3_LLM_oracle.py", "LLM oracle", ":material/smart_toy:"),
    ("pages/4_Train.py", "Train", ":material/model_training:"),
    ("pages/5_Explore.py", "Explore", ":material/scatter_plot:"),
    ("pages/6_Report.py", "Report", ":material/table_chart:"),
]


def sign_in_form(need_code: bool) -> None:
    with st.form("sign_in", border=True):
        st.subheader("Sign in")
        name = st.text_input("Your name (annotator)", value=ac.annotator() or "",
                             help="Your triplet judgments are stored under this name.")
        code = st.text_input("Access code", type="password") if need_code else None
        if st.form_submit_button("Sign in", type="primary"):
            if need_code and not session.access_granted(code, ac.required_code()):
                st.error("Wrong access code.")
                return
            try:
                clean = session.clean_annotator_name(name)
            except ValueError as err:
                st.error(str(err))
                return
            st.session_state["access_code"] = code
            st.session_state["annotator"] = clean
            ac.workspace().store.add_annotator(clean)
            st.rerun()


def overview_section(ws) -> None:
    info = session.overview(ws)
    st.subheader(f"Workspace · {ws.dataset_name}")
    if info["images"] == 0:
        st.info("This workspace is empty. Import a dataset folder or build the synthetic demo below.")
        return
    cols = st.columns(6)
    cols[0].metric("Photos", info["images"])
    cols[1].metric("Patients", info["patients"])
    cols[2].metric("Wounds outlined", info["wounds"])
    cols[3].metric("Descriptions", info["described_wounds"])
    cols[4].metric("Expert triplets", info["expert_triplets"])
    cols[5].metric("LLM triplets", info["llm_triplets"])
    st.markdown("**Progress toward targets**")
    for label, (done, goal) in info["progress"].items():
        frac = min(1.0, done / goal) if goal else 0.0
        st.progress(frac, text=f"{label}: {done:,} / {goal:,}")
    if info["annotators"]:
        st.caption("Annotators: " + ", ".join(ac.escape_md(a) for a in info["annotators"]))
    runs = ws.store.runs()[:8]
    st.markdown("**Latest runs**")
    if runs:
        st.dataframe(pd.DataFrame([{
            "run": r["id"], "kind": r["kind"], "name": r["name"] or "", "status": ac.status_badge(r["status"]),
            "progress": float(r["progress"] or 0), "started": str(r["created"])[:16].replace("T", " "),
            "message": r["message"] or "",
        } for r in runs]), hide_index=True, width="stretch",
            column_config={"progress": st.column_config.ProgressColumn("progress", min_value=0, max_value=1)})
    else:
        st.caption("No runs yet — start one on the LLM oracle or Train page.")


def data_section(ws) -> None:
    with st.expander("Import a dataset folder or build the demo", expanded=ws.store.counts()["images"] == 0):
        left, right = st.columns(2)
        with left:
            st.markdown("**Import a dataset folder** (`images/`, `masks/`, `wounds.csv`, optional CSVs)")
            folder = st.text_input("Dataset folder on the server", key="import_folder")
            if st.button("Import", disabled=not folder):
                try:
                    summary = import_dataset(ws, Path(folder).expanduser())
                except DatasetError as err:
                    st.error(f"Nothing imported: {err}")
                else:
                    st.success(f"Imported {summary['images']} photos, {summary['wounds']} wounds, "
                               f"{summary['new_triplets']} new triplets.")
        with right:
            st.markdown("**Build the synthetic demo** (phantom wounds, labelled SYNTHETIC everywhere)")
            photos = st.number_input("Photos", min_value=6, max_value=200, value=53)
            if st.button("Build demo"):
                from core.phantoms import build

                with st.spinner("Rendering phantom photos…"):
                    with tempfile.TemporaryDirectory() as tmp:
                        out = Path(tmp) / "demo"
                        n = int(photos)
                        build(out, seed=0, photos=n, patients=max(1, round(n * 21 / 53)),
                              wounds=max(n, round(n * 120 / 53)),
                              triplets=min(513, n * (n - 1) * (n - 2) // 2))
                        summary = import_dataset(ws, out)
                st.success(f"Demo imported: {summary['images']} synthetic photos, {summary['wounds']} wounds.")
                st.rerun()


def home() -> None:
    ws = ac.page("TriDerm Studio")
    st.caption("Collect expert wound-similarity judgments, learn image and text embeddings, explore them.")
    if ac.annotator():
        st.success(f"Signed in as **{ac.escape_md(ac.annotator())}**. "
                   "Use the pages on the left: outline wounds, judge triplets, run the models.")
    else:
        sign_in_form(need_code=False)
    overview_section(ws)
    data_section(ws)


def main() -> None:
    st.set_page_config(page_title="TriDerm Studio", page_icon=":material/healing:", layout="wide")
    if not ac.access_ok():
        nav = st.navigation([st.Page(gate, title="Sign in", icon=":material/lock:", default=True)])
    else:
        nav = st.navigation([st.Page(home, title="Home", icon=":material/home:", default=True)]
                            + [st.Page(p, title=t, icon=i) for p, t, i in PAGES])
    nav.run()


def gate() -> None:
    st.title("TriDerm Studio")
    st.caption("Access is restricted. Enter your name and the study's access code.")
    sign_in_form(need_code=True)


main()
