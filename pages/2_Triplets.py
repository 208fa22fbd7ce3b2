"""Triplet judgments: is the query photo more like the left or the right reference?

Made for judging wounds: the three photos fill a 1366-px screen (sidebar collapsed, narrow
margins), each with its outlined wounds drawn on it; any photo opens full screen (button or key);
descriptions are optional. Annotators see their own progress only — agreement scores are for
admins (Review page), since showing them to the people being measured biases them.
"""

from __future__ import annotations

import dataclasses
import time

import streamlit as st

import app_common as ac
from annotations.scheduler import TripletScheduler
from annotations.session import target

LEFT, RIGHT, SKIP, UNDO = "◀ More like left", "More like right ▶", "Skip", "↶ Undo last"
#: Keyboard shortcuts (st.button(shortcut=…)): answers, undo, zoom of the left / query / right photo.
KEYS = {"j": "left", "k": "right", "skip": "down", "undo": "u", "zoom_j": "q", "zoom_q": "w", "zoom_k": "e"}
FRAME = (960, 720)  # letterbox of each photo (4:3), shown at the column's width


@st.cache_data(show_spinner="Loading the newest embedding run's distances…", max_entries=4)
def active_distances(root: str, run_id: int, stamp: str):
    """(ids, D) of one finished embedding run, computed once per run (not on every click)."""
    from core.eval.report import run_image_distances

    got = run_image_distances(ac.workspace(), ac.workspace().store.run(run_id))
    return None if got is None else (got[0], got[1])


def newest_active(ws):
    """(ids, D, run) of the newest finished embedding run with distances, or None."""
    try:
        from core.eval.report import embedding_runs
    except ImportError:  # core not installed: active mode unavailable
        return None
    for run in embedding_runs(ws):
        got = active_distances(str(ws.root), run["id"], str(run.get("finished") or run["created"]))
        if got is not None:
            return got[0], got[1], run
    return None


ws = ac.page("Triplet judgments", need="annotate", compact=True)
name = ac.annotator()
actor = ac.actor()
state = st.session_state

progress_col, settings_col = st.columns([3, 2], vertical_alignment="center")
with settings_col.expander("Settings", expanded=False):
    per_target = st.number_input("My target (triplets)", min_value=1, max_value=100_000,
                                 value=target(ws, "target_per_annotator"), key="my_target")
    repeat_share = st.slider("Planned repeats", 0.0, 0.5, 0.1, 0.05,
                             help="share of questions that re-ask one of your earlier triplets")
    shared_share = st.slider("Shared with other annotators", 0.0, 0.9, 0.2, 0.05)
    active = newest_active(ws)
    mode = st.radio("Reference choice", ["random", "active"], horizontal=True,
                    disabled=active is None,
                    help="active: the pair with the smallest distance margin under the newest embedding run"
                    if active else "active needs a finished embedding run (Train page)")
    show_text = st.toggle("Show wound descriptions", value=False, key="show_descriptions")
    if active is not None and mode == "active":
        st.caption(f"Active mode uses run {active[2]['id']} ({active[2]['kind']}).")

settings = (name, repeat_share, shared_share, mode, active[2]["id"] if active else None)
if state.get("_sched_settings") != settings:
    state["_sched"] = TripletScheduler(
        ws, name, repeat_share=repeat_share, shared_share=shared_share, mode=mode,
        distances=(active[0], active[1]) if (mode == "active" and active) else None)
    state["_sched_settings"] = settings
sched: TripletScheduler = state["_sched"]
state.setdefault("history", [])  # [(triplet id, question, choice)] newest last, for undo
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
    if row_id is None:  # the store's unique key: another window of this account answered it first
        state["_notice"] = ("This triplet was already answered under your account (another browser window?). "
                            "Your answer was not stored twice; here is the next one.")
    else:
        ws.store.record_revision("triplets", row_id, "choice", "insert", None, choice, actor)
        state["history"].append((row_id, q, choice))
    state["question"] = None


def undo() -> None:
    if not state["history"]:
        return
    row_id, q, choice = state["history"].pop()
    ws.store.delete_triplet(row_id)
    ws.store.record_revision("triplets", row_id, "choice", "delete", choice, None, actor)
    if state.get("question") is not None:
        state["pending"].append(state["question"])
    state["question"] = dataclasses.replace(q, served_at=time.time())


@st.dialog("Photo", width=1600)
def zoom(image_id: str, role: str) -> None:
    st.image(ac.outlined(ws, image_id, 1600, 1200), caption=f"{role} · {image_id}", width="stretch")
    descriptions(image_id)


def descriptions(image_id: str) -> None:
    for w in ws.store.wounds(image_id):
        if w["description"].strip():
            st.caption(f"Wound {int(w['wound_index'])}: {ac.escape_md(w['description'])}")


q = current()
done = sched.progress()
progress_col.progress(min(1.0, done["answered"] / per_target),
            text=f"{ac.escape_md(name)}: {done['answered']} of {per_target} triplets "
                 f"({done['repeats']} planned repeats, {done['skips']} skipped)")
notice = state.pop("_notice", None)
if notice:
    st.warning(notice)

if q is None:
    if ws.store.counts()["images"] < 3:
        st.info("This workspace needs at least three photos. An admin can import a dataset on the Home page.")
    else:
        st.success("You have seen every possible triplet of this workspace. Thank you!")
else:
    token = dataclasses.astuple(q)
    st.markdown("**Is the query photo (centre) more similar to the left or the right photo?** "
                "Keys: ← left · → right · ↓ skip · U undo · Q / W / E zoom left / query / right")
    columns = st.columns(3, gap="small")
    shown = ((q.ref_j, "Left", "j", LEFT, "zoom_j"), (q.anchor, "Query", None, SKIP, "zoom_q"),
             (q.ref_k, "Right", "k", RIGHT, "zoom_k"))
    for col, (image_id, role, choice, label, zoom_key) in zip(columns, shown):
        with col:
            st.image(ac.outlined(ws, image_id, *FRAME), width="stretch")
            if choice is None:
                st.button(label, on_click=answer, args=("skip", token), width="stretch", key="btn_skip",
                          shortcut=KEYS["skip"], help="Skip when the photos cannot be compared")
            else:
                st.button(label, on_click=answer, args=(choice, token), type="primary", width="stretch",
                          key=f"btn_{role.lower()}", shortcut=KEYS[choice])
            if st.button(f"Zoom {role.lower()} · {image_id}", key=f"btn_{zoom_key}", shortcut=KEYS[zoom_key], type="tertiary",
                         icon=":material/zoom_in:"):
                zoom(image_id, role)
            if show_text:
                descriptions(image_id)

st.button(UNDO, on_click=undo, disabled=not state["history"], key="btn_undo", shortcut=KEYS["undo"])
