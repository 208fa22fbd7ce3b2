"""Triplet judgments: is the query photo more like the left or the right reference?"""

from __future__ import annotations

import dataclasses
import math
import time

import pandas as pd
import streamlit as st
import streamlit.components.v1 as components

import app_common as ac
from annotations.consistency import inter_annotator_kappa, self_consistency
from annotations.scheduler import TripletScheduler
from annotations.session import target

LEFT, RIGHT, SKIP, UNDO = "◀ More like left", "More like right ▶", "Skip", "↶ Undo last"

KEYS_JS = """
<script>
const doc = window.parent.document;
if (doc.__tridermKeys) { doc.removeEventListener('keydown', doc.__tridermKeys); }
doc.__tridermKeys = function (e) {
  const t = e.target;
  if (t && (t.tagName === 'INPUT' || t.tagName === 'TEXTAREA' || t.isContentEditable)) return;
  if (e.ctrlKey || e.metaKey || e.altKey) return;
  const map = {ArrowLeft: %(left)s, '1': %(left)s, ArrowRight: %(right)s, '2': %(right)s,
               ' ': %(skip)s, '0': %(skip)s, Backspace: %(undo)s, u: %(undo)s};
  const label = map[e.key];
  if (!label) return;
  const button = Array.from(doc.querySelectorAll('button'))
    .find(b => b.innerText.trim().startsWith(label));
  if (button && !button.disabled) { e.preventDefault(); button.click(); }
};
doc.addEventListener('keydown', doc.__tridermKeys);
</script>
"""


def distances_for_active(ws):
    """(ids, D, run) of the newest finished embedding run, or None (core not available / no run)."""
    try:
        from core.eval.report import embedding_runs, run_image_distances
    except ImportError:
        return None
    for run in embedding_runs(ws):
        got = run_image_distances(ws, run)
        if got is not None:
            return got[0], got[1], run
    return None


ws = ac.page("Triplet judgments", needs_name=True)
name = ac.annotator()
state = st.session_state

with st.expander("Settings", expanded=False):
    c1, c2, c3, c4 = st.columns(4)
    per_target = c1.number_input("My target (triplets)", min_value=1, max_value=100_000,
                                 value=target(ws, "target_per_annotator"), key="my_target")
    repeat_share = c2.slider("Planned repeats (self-consistency)", 0.0, 0.5, 0.1, 0.05)
    shared_share = c3.slider("Shared with other annotators (κ)", 0.0, 0.9, 0.2, 0.05)
    active = distances_for_active(ws)
    mode = c4.radio("Reference choice", ["random", "active"], horizontal=True,
                    disabled=active is None,
                    help="active: the pair with the smallest distance margin under the newest embedding run"
                    if active else "active needs a finished embedding run (Train page)")
    if active is not None and mode == "active":
        st.caption(f"Active mode uses run {active[2]['id']} ({active[2]['kind']}).")

settings = (name, repeat_share, shared_share, mode)
if state.get("_sched_settings") != settings:
    state["_sched"] = TripletScheduler(
        ws, name, repeat_share=repeat_share, shared_share=shared_share, mode=mode,
        distances=(active[0], active[1]) if (mode == "active" and active) else None)
    state["_sched_settings"] = settings
sched: TripletScheduler = state["_sched"]
state.setdefault("history", [])  # [(triplet id, question)] newest last, for undo
state.setdefault("pending", [])  # questions put aside by an undo


def current():
    if state.get("question") is None:
        state["question"] = state["pending"].pop() if state["pending"] else sched.next()
    return state["question"]


def answer(choice: str, token: tuple) -> None:
    q = state.get("question")
    if q is None or dataclasses.astuple(q) != token:  # a stale click (double press): ignore
        return
    row_id = sched.answer(q, choice)
    if row_id is not None:
        state["history"].append((row_id, q))
    state["question"] = None


def undo() -> None:
    if not state["history"]:
        return
    row_id, q = state["history"].pop()
    ws.store.delete_triplet(row_id)
    if state.get("question") is not None:
        state["pending"].append(state["question"])
    state["question"] = dataclasses.replace(q, served_at=time.time())


q = current()
done = sched.progress()
st.progress(min(1.0, done["answered"] / per_target),
            text=f"{ac.escape_md(name)}: {done['answered']} of {per_target} triplets "
                 f"({done['repeats']} planned repeats, {done['skips']} skipped)")

if q is None:
    if ws.store.counts()["images"] < 3:
        st.info("This workspace needs at least three photos. Import a dataset or build the demo on the Home page.")
    else:
        st.success("You have seen every possible triplet of this workspace. Thank you!")
else:
    token = dataclasses.astuple(q)
    st.markdown("#### Is the **query** photo (centre) more similar to the **left** or the **right** photo?")
    left, mid, right = st.columns(3, gap="medium")
    with left:
        st.image(ac.letterboxed(str(ws.image_path(q.ref_j))), caption=f"Left · {q.ref_j}", width="stretch")
        st.button(f"{LEFT}  [1 / ←]", on_click=answer, args=("j", token), type="primary",
                  width="stretch", key="btn_left")
    with mid:
        st.image(ac.letterboxed(str(ws.image_path(q.anchor))), caption=f"Query · {q.anchor}", width="stretch")
        st.button(f"{SKIP}  [0 / space]", on_click=answer, args=("skip", token), width="stretch",
                  key="btn_skip", help="Skip when the photos cannot be compared")
    with right:
        st.image(ac.letterboxed(str(ws.image_path(q.ref_k))), caption=f"Right · {q.ref_k}", width="stretch")
        st.button(f"{RIGHT}  [2 / →]", on_click=answer, args=("k", token), type="primary",
                  width="stretch", key="btn_right")
    if q.kind != "new":
        st.caption("This is a planned repeat to measure consistency." if q.kind == "repeat"
                   else "Another annotator answered this triplet too (for inter-annotator agreement).")

st.button(f"{UNDO}  [u]", on_click=undo, disabled=not state["history"], key="btn_undo")
components.html(KEYS_JS % {"left": repr(LEFT), "right": repr(RIGHT), "skip": repr(SKIP), "undo": repr(UNDO)},
                height=0)

st.divider()
st.subheader("Reliability")
rows = ws.store.expert_triplets()
sc = self_consistency(rows)
kappa = inter_annotator_kappa(rows)
c1, c2 = st.columns(2)
with c1:
    st.markdown("**Self-consistency on planned repeats**")
    if sc:
        st.dataframe(pd.DataFrame([{"annotator": a, "repeats": v["n"], "same answer": v["agree"],
                                    "consistency": None if math.isnan(v["rate"]) else round(v["rate"], 3)}
                                   for a, v in sorted(sc.items())]), hide_index=True, width="stretch")
    else:
        st.caption("No expert judgments yet.")
with c2:
    mean = kappa["mean_kappa"]
    st.markdown("**Inter-annotator Cohen's κ on shared triplets**"
                + ("" if math.isnan(mean) else f" — mean κ = {mean:.3f}"))
    if kappa["pairs"]:
        st.dataframe(pd.DataFrame([{"annotator A": p["a"], "annotator B": p["b"], "shared": p["n"],
                                    "agreement": round(p["agreement"], 3),
                                    "κ": None if math.isnan(p["kappa"]) else round(p["kappa"], 3)}
                                   for p in kappa["pairs"]]), hide_index=True, width="stretch")
    else:
        st.caption("No triplet has been answered by two annotators yet.")
