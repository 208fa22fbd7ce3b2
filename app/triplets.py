"""The Triplet judgments page's logic: the scheduler's settings, the answer loop (a fragment) and its event
functions, each acting on the :class:`Judging` the page computed (pages/2_Triplets.py wires them)."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import streamlit as st

from annotations.accounts import session
from annotations.accounts.session import target
from annotations.infra.workspace import Workspace
from annotations.scheduling.scheduler import Question, TripletScheduler
from app import auth, images, markup

state = st.session_state

LEFT, RIGHT, SKIP, UNDO = "◀ More like left", "More like right ▶", "Skip", "↶ Undo last"
#: Keyboard shortcuts (st.button(shortcut=…)): answers, undo, zoom of the left / query / right photo,
#: whole photo / wound crop, outlines on / off.
KEYS = {"j": "left", "k": "right", "skip": "down", "undo": "u", "zoom_j": "q", "zoom_q": "w", "zoom_k": "e",
        "whole": "f", "outline": "o"}
FRAME = (960, 720)  # letterbox of each photo (4:3), shown at the column's width
ZOOM = (1280, 960)
#: The zoom's pan buttons: label, half windows right and down, icon.
PAN = (("Left", -1, 0, ":material/arrow_back:"), ("Up", 0, -1, ":material/arrow_upward:"),
       ("Down", 0, 1, ":material/arrow_downward:"), ("Right", 1, 0, ":material/arrow_forward:"))
UNDO_WINDOW = timedelta(hours=1)  # how far back "Undo" reaches (answers stored this long ago or later)
#: The zoom dialog (zoom choice, photo, pan buttons) fits a 768-px-high screen: its photo is at most 56 % of
#: the window's height.
ZOOM_CSS = ("<style>[data-testid='stDialog'] [data-testid='stImage'] img {max-height: 56vh; width: auto; "
            "max-width: 100%; margin: auto; display: block;}</style>")


@st.cache_data(show_spinner="Loading the newest embedding run's distances…", max_entries=4)
def active_distances(root: str, run_id: int, stamp: str):
    """(ids, D) of one finished embedding run, computed once per run (not on every click)."""
    from core.eval.retrieval import run_image_distances

    got = run_image_distances(auth.workspace(), auth.workspace().store.run(run_id))
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


@dataclass(frozen=True)
class Judging:
    """What the page computed for this run: the workspace, the annotator (judgments are stored as theirs) and the
    session's scheduler; every function of the answer loop acts on it."""

    ws: Workspace
    name: str  #: the annotator
    actor: str  #: the name recorded in the revisions table
    sched: TripletScheduler


def scheduler(ws: Workspace, name: str) -> TripletScheduler:
    """The settings panel; the session's scheduler, rebuilt only when a setting changes."""
    with st.columns([3, 2])[1].expander("Settings", expanded=False):
        st.number_input("My target (triplets)", min_value=1, max_value=100_000,
                        value=target(ws, "target_per_annotator"), key="my_target")
        repeat_share = st.slider("Planned repeats", 0.0, 0.5, 0.1, 0.05,
                                 help="share of questions that re-ask one of your earlier triplets")
        repeat_gap = st.number_input("A repeat comes back after at least … other questions", min_value=0,
                                     max_value=10_000, value=20, step=5,
                                     help="enough questions in between that the first answer cannot be remembered")
        shared_share = st.slider("Shared with other annotators", 0.0, 0.9, 0.2, 0.05)
        active = newest_active(ws)
        mode = st.radio("Reference choice", ["random", "active"], horizontal=True,
                        disabled=active is None,
                        help="active: the pair with the smallest distance margin under the newest embedding run"
                        if active else "active needs a finished embedding run (Train page)")
        st.toggle("Show wound descriptions", value=False, key="show_descriptions")
        if active is not None and mode == "active":
            st.caption(f"Active mode uses run {active[2]['id']} ({markup.escape_md(active[2]['kind'])}).")
    settings = (name, repeat_share, int(repeat_gap), shared_share, mode, active[2]["id"] if active else None)
    if state.get("_sched_settings") != settings:
        state["_sched"] = TripletScheduler(
            ws, name, repeat_share=repeat_share, repeat_gap=int(repeat_gap), shared_share=shared_share, mode=mode,
            distances=(active[0], active[1]) if (mode == "active" and active) else None)
        state["_sched_settings"] = settings
    return state["_sched"]


def undo_since() -> str:
    """The earliest answer time (ISO, UTC) an undo may still take back."""
    return (datetime.now(timezone.utc) - UNDO_WINDOW).isoformat(timespec="milliseconds")


def current(judging: Judging) -> Question | None:
    """The question on screen: one put aside by an undo, else the prefetched one (served from now
    on, for its answer latency), else a fresh draw."""
    if state.get("question") is None:
        if state["pending"]:
            state["question"] = state["pending"].pop()
        elif state.get("upcoming") is not None:
            state["question"] = dataclasses.replace(state.pop("upcoming"), served_at=time.time())
        else:
            state["question"] = judging.sched.next()
    return state["question"]


def answer(judging: Judging, choice: str, token: tuple) -> None:
    """Store ``choice`` for the question on screen (a stale click, whose ``token`` no longer matches, is ignored)."""
    q = state.get("question")
    if q is None or dataclasses.astuple(q) != token:  # a stale click (double press): ignore
        return
    if judging.sched.answer(q, choice, actor=judging.actor) is None:  # the store's unique key: another window answered it first
        state["_notice"] = ("This triplet was already answered under your account (another browser window?). "
                            "Your answer was not stored twice; here is the next one.")
    state["question"] = None


def undo(judging: Judging) -> None:
    """Take back the newest answer of the undo window and show its question again."""
    back = judging.sched.undo_last(undo_since(), actor=judging.actor)
    if back is None:
        return
    if state.get("question") is not None:
        state["pending"].append(state["question"])
    state["question"] = back


def flip(key: str) -> None:
    """Toggle the boolean session setting ``key``."""
    state[key] = not state[key]


def view(ws: Workspace, image_id: str) -> tuple[bytes, int]:
    """The photo's picture as shown in the triplet (cropped or whole, outlines on or off) and its width."""
    return images.wound_view(ws, image_id, *FRAME, crop=not state["whole_photo"], outline=state["outlines"])


def open_zoom(ws: Workspace, image_id: str, role: str) -> None:
    """Open the zoom dialog on ``image_id``, fitted to its wounds (the whole photo when none is outlined)."""
    state["zoom_level"] = "Wounds" if ws.store.wounds(image_id) else "Whole photo"
    state["zoom_centre"] = None
    zoom(ws, image_id, role)


def recentre() -> None:
    """Centre the zoom on the wounds again (a new zoom level's callback)."""
    state["zoom_centre"] = None


def pan(dx: int, dy: int, box: tuple[int, int, int, int]) -> None:
    """Move the zoom's window by half a window (a pan button's callback)."""
    state["zoom_centre"] = session.panned(box, dx, dy)


@st.dialog("Photo", width="large")
def zoom(ws: Workspace, image_id: str, role: str) -> None:
    """A dialog with the photo fitted to its wounds (2× / 4× closer, or the whole photo, pan by half a
    window), cut from the photo on the server, and its wounds' descriptions."""
    level = st.segmented_control("Zoom", list(session.ZOOM_LEVELS), key="zoom_level", label_visibility="collapsed",
                                 on_change=recentre) or "Wounds"
    picture, box = images.zoom_view(ws, image_id, session.ZOOM_LEVELS[level], state.get("zoom_centre"), *ZOOM,
                                outline=state["outlines"])
    st.image(picture, caption=f"{role} · {markup.escape_md(image_id)} · {level.lower()} · photo pixels "
                              f"{box[0]}–{box[2]} × {box[1]}–{box[3]}")
    if level != "Whole photo":
        for col, (label, dx, dy, icon) in zip(st.columns(4), PAN):
            col.button(label, key=f"zoom_pan_{label.lower()}", on_click=pan, args=(dx, dy, box), width="stretch",
                       icon=icon, help="Move the view by half its width or height")
    descriptions(ws, image_id)


def descriptions(ws: Workspace, image_id: str) -> None:
    """A caption per wound of the photo that has a description."""
    for w in ws.store.wounds(image_id):
        if w["description"].strip():
            st.caption(f"Wound {int(w['wound_index'])}: {markup.escape_md(w['description'])}")


def which_wounds(count: int) -> str:
    """What the question is about when a photo holds several wounds (triplets compare whole photos)."""
    if count >= 2:
        return f"{count} wounds outlined (1–{count}): judge them together"
    return "1 wound outlined" if count == 1 else "no wound outlined: the whole photo"


def prefetch(judging: Judging) -> None:
    """Draw the next question now and render its three pictures into the cache, so the next answer
    only has to send them."""
    if state.get("upcoming") is None:
        state["upcoming"] = judging.sched.next()
    upcoming = state["upcoming"]
    if upcoming is not None:
        for image_id in (upcoming.ref_j, upcoming.anchor, upcoming.ref_k):
            view(judging.ws, image_id)


@st.fragment
def answer_loop(judging: Judging) -> None:
    """Progress, the three photos, answer / zoom / view / undo buttons: reruns alone on every answer."""
    ws, sched = judging.ws, judging.sched
    q = current(judging)
    done, per_target = sched.progress(), int(state["my_target"])
    st.progress(min(1.0, done["answered"] / per_target),
                text=f"{markup.escape_md(judging.name)}: {done['answered']} of {per_target} triplets "
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
        shown_as = "the whole photo" if state["whole_photo"] else "cropped around the outlined wounds"
        st.markdown(f"**Is the query photo (centre) more similar to the left or the right photo?** Shown: {shown_as}. "
                    "Keys: ← left · → right · ↓ skip · U undo · Q / W / E zoom · F whole photo / crop · "
                    "O outlines on / off")
        columns = st.columns(3, gap="small")
        shown = ((q.ref_j, "Left", "j", LEFT, "zoom_j"), (q.anchor, "Query", None, SKIP, "zoom_q"),
                 (q.ref_k, "Right", "k", RIGHT, "zoom_k"))
        for col, (image_id, role, choice, label, zoom_key) in zip(columns, shown):
            with col:
                picture, wounds = view(ws, image_id)
                st.image(picture, width="stretch")
                if choice is None:
                    st.button(label, on_click=answer, args=(judging, "skip", token), width="stretch", key="btn_skip",
                              shortcut=KEYS["skip"], help="Skip when the photos cannot be compared")
                else:
                    st.button(label, on_click=answer, args=(judging, choice, token), type="primary", width="stretch",
                              key=f"btn_{role.lower()}", shortcut=KEYS[choice])
                st.caption(which_wounds(wounds))
                if st.button(f"Zoom {role.lower()} · {markup.escape_md(image_id)}", key=f"btn_{zoom_key}", shortcut=KEYS[zoom_key],
                             type="tertiary", icon=":material/zoom_in:"):
                    open_zoom(ws, image_id, role)
                if state.get("show_descriptions"):
                    descriptions(ws, image_id)
    undo_col, whole_col, outline_col = st.columns(3)
    undo_col.button(UNDO, on_click=undo, args=(judging,), disabled=not sched.has_answer_since(undo_since()), key="btn_undo",
                    shortcut=KEYS["undo"], help="takes back your newest answer of the last hour")
    whole_col.button("Wound crop" if state["whole_photo"] else "Whole photo", on_click=flip, args=("whole_photo",),
                     key="btn_whole", shortcut=KEYS["whole"], icon=":material/crop_free:")
    outline_col.button("Outlines off" if state["outlines"] else "Outlines on", on_click=flip, args=("outlines",),
                       key="btn_outline", shortcut=KEYS["outline"], icon=":material/border_style:")
    if q is not None:
        prefetch(judging)
