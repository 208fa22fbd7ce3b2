"""The Follow-up page's logic: linking a visit's wounds to their tracks, area curves, a track's photos side by side
and the tidy CSV (:func:`main` draws them; pages/9_Follow_up.py starts the page and calls it)."""

from __future__ import annotations

import html
import io
from datetime import date

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from annotations.followup import followup
from annotations.followup.align import track_views
from annotations.infra.workspace import Workspace
from annotations.io.readers import DatasetError
from annotations.store.revisions import StaleEdit
from annotations.store.rows import wound_key
from app import auth, images, markup

#: Keyboard, as on the Triplets page: accept the first proposal, start a new track.
KEYS = {"accept": "a", "new": "n"}
CROP_PAD = 0.35  # margin around a wound's box, as a fraction of its size

@st.cache_data(show_spinner="Measuring the wounds…", max_entries=4)
def rows_of(root: str, version: tuple[int, int]) -> list[dict]:
    """Every wound of a dated photo with its size (cached until the store changes)."""
    ws = auth.workspace()
    return followup.followup_rows(ws, unlinked=True)


def version(ws: Workspace) -> tuple[int, int]:
    """Changes to the store: the last revision id and the number of wounds."""
    return ws.store.last_revision_id(), ws.store.counts()["wounds"]


def area_figure(linked: list[dict], unit: str) -> go.Figure:
    """Area against time, one line per track (Scattergl: 50 tracks × 10 visits draw at once). The traces
    are plain dicts: plotly validates them once, where ``add_trace`` per track took ~0.6 s for 66."""
    frame = pd.DataFrame(linked)
    traces = [{"type": "scattergl", "x": list(group["visit_date"]), "y": list(group[unit]), "mode": "lines+markers",
               "name": html.escape(f"{patient} · {track}"), "hovertemplate": "%{x|%Y-%m-%d}: %{y:.2f}"}
              for (patient, track), group in frame.groupby(["patient", "track"], sort=True)]
    fig = go.Figure(data=traces)
    fig.update_layout(height=420, margin={"l": 10, "r": 10, "t": 30, "b": 10}, xaxis_title="visit", xaxis_type="date",
                      yaxis_title="open area (cm²)" if unit == "area_cm2" else "area (px, no calibration)")
    return fig


@st.cache_data(show_spinner=False, max_entries=256)
def crop(root: str, image_id: str, wound_index: int, version: tuple[int, int], size: int = 220) -> np.ndarray:
    """The photo cropped on the wound (its box with a margin), outline drawn on the crop only (cached
    until the store changes)."""
    ws = auth.workspace()
    from PIL import Image

    labels = ws.load_mask(image_id)
    ys, xs = np.nonzero(labels == wound_index)
    image = ws.load_image(image_id)
    if len(xs) == 0:
        return np.asarray(image.resize((size, size)))
    extent = max(np.ptp(xs), np.ptp(ys))
    cx, cy, half = (xs.min() + xs.max()) / 2, (ys.min() + ys.max()) / 2, extent / 2 + CROP_PAD * extent + 10
    box = tuple(int(v) for v in (cx - half, cy - half, cx + half, cy + half))
    window = np.zeros((box[3] - box[1], box[2] - box[0]), labels.dtype)
    inside = labels[max(box[1], 0):box[3], max(box[0], 0):box[2]]
    top, left = max(-box[1], 0), max(-box[0], 0)
    window[top:top + inside.shape[0], left:left + inside.shape[1]] = inside
    im = images.outline_overlay(image.crop(box), np.where(window == wound_index, window, 0))
    return np.asarray(im.resize((size, size), Image.Resampling.LANCZOS))


@st.cache_data(show_spinner="Aligning the track's photos…", max_entries=32)
def aligned(root: str, visits: tuple[tuple[str, int], ...], version: tuple[int, int]) -> list[tuple[np.ndarray, str]]:
    """The track's photos aligned on the wound (annotations.followup.align), outline drawn (cached until the store
    changes)."""
    ws = auth.workspace()
    from PIL import Image

    out = []
    for view in track_views(ws, list(visits)):
        image = images.outline_overlay(Image.fromarray(view.image), view.mask.astype(np.int32))
        out.append((np.asarray(image), view.method))
    return out


def wound_runs(ws: Workspace) -> dict[int, str]:
    """Finished runs that stored wound embeddings, newest first: run id → label."""
    try:
        from core.eval.explore import has_wound_embedding
        from core.eval.retrieval import has_embeddings
    except ImportError:  # the ML part of the product is not installed: links use the other cues
        return {}
    return {r["id"]: f"run {r['id']} · {r['kind']}" + (f" · {r['name']}" if r.get("name") else "")
            for r in ws.store.runs(status="done") if has_embeddings(ws, r) and has_wound_embedding(ws, r["id"])}


@st.cache_data(show_spinner="Loading the wound embeddings…", max_entries=4)
def wound_embeddings(root: str, run_id: int) -> dict[tuple[str, int], np.ndarray]:
    """The run's wound embeddings by wound key (a linking cue: embedding similarity)."""
    ws = auth.workspace()
    from core.runtime import load_embeddings

    emb = load_embeddings(ws, run_id)
    return {(str(i), int(w)): np.asarray(v) for (i, w), v in zip(emb["wound_keys"], emb["wound_emb"])}


def link(ws: Workspace, r: dict, track: str | None) -> None:
    """Put the wound on ``track`` (None: a new track of its patient), provided it is still on the track this
    page showed (none); a refusal is kept for the page to show."""
    target = track or followup.next_track_id(ws.store, r["patient"])
    try:
        with ws.store.expecting("wounds", wound_key(r["image_id"], r["wound_index"]), {"metadata.track_id": r["track"]},
                             {"metadata.track_id": target}):
            followup.set_track(ws.store, r["image_id"], r["wound_index"], target, actor=auth.actor())
    except StaleEdit as err:
        theirs = err.conflicts["metadata.track_id"][0]
        st.session_state["fu_stale"] = (f"Not linked: {err.by or 'someone else'} put wound {r['wound_index']} of "
                                        f"{r['image_id']} on track {theirs} since this page showed it (yours: {target}).")
        return
    st.toast(markup.escape_md(f"Wound {r['wound_index']} of {r['image_id']} → {target}"))


def import_visit_form(ws: Workspace) -> None:
    """Admins: import a visit's photos from a dataset folder on the server."""
    with st.expander("Add a visit's photos (a dataset folder: images/, masks/, images.csv with visit_date)"):
        folder = st.text_input("Folder on the server", key="fu_folder")
        visit_day = st.date_input("Visit date of the new photos (where images.csv gives none)", value=None,
                                  max_value=date.today(), key="fu_visit_day")
        if st.button("Import the visit", key="fu_import", disabled=not folder):
            try:
                summary = followup.import_visit(ws, folder, visit_day, actor=auth.actor())
            except DatasetError as err:
                st.error(markup.escape_md(str(err)))
            else:
                st.success(f"Imported {summary['images']} photo(s), {summary['wounds']} wound(s).")


def visit_date_form(ws: Workspace, can_edit: bool) -> None:
    """Set the visit date of one photo (undated photos first)."""
    with st.expander("Visit date of a photo"):
        undated = [i["image_id"] for i in ws.store.images() if followup.VISIT_DATE not in i["metadata"]]
        photo = st.selectbox("Photo", undated or [i["image_id"] for i in ws.store.images()], key="fu_photo")
        current = (ws.store.image(photo) or {}).get("metadata", {}).get(followup.VISIT_DATE) if photo else None
        st.caption(f"Visit date now: {markup.escape_md(str(current)) if current else 'none'}")
        shown = st.session_state.get("fu_date_shown")  # (photo, visit date) as the previous run showed them
        day = st.date_input("Visit date", value=date.today(), max_value=date.today(), key="fu_day")
        if st.button("Set the visit date", key="fu_set_date", disabled=not (can_edit and photo)):
            loaded = shown[1] if shown and shown[0] == photo else current
            try:
                with ws.store.expecting("images", photo, {"metadata.visit_date": loaded},
                                     {"metadata.visit_date": day.isoformat()}):
                    followup.set_visit_date(ws.store, photo, day.isoformat(), actor=auth.actor())
            except StaleEdit as err:
                st.error(markup.escape_md(f"Not saved: {err.by or 'someone else'} set the visit date of {photo} to "
                                      f"{err.conflicts['metadata.visit_date'][0] or 'none'} since this page showed "
                                      f"it (yours: {day.isoformat()})."))
            except DatasetError as err:
                st.error(markup.escape_md(str(err)))
            else:
                current = day.isoformat()
        st.session_state["fu_date_shown"] = (photo, current)


def confirm_links(ws: Workspace, can_edit: bool, rows: list[dict], now: tuple[int, int]) -> None:
    """The next unlinked wound with its proposed track: accept, start a new track, or correct it."""
    cues = wound_runs(ws) if any(r["track"] is None for r in rows) else {}
    cue = st.selectbox("Embedding similarity as a linking cue", [None, *cues], index=1 if cues else 0,
                       format_func=lambda k: "none (site, position, size)" if k is None else cues[k],
                       key="fu_cue") if cues else None
    pending = followup.pending_links(rows, wound_embeddings(str(ws.root), cue) if cue is not None else None)
    if "fu_stale" in st.session_state:
        st.error(markup.escape_md(st.session_state.pop("fu_stale")))
    st.subheader(f"Links to confirm · {len(pending)}")
    if not pending:
        st.caption("Every wound of a dated photo is on a track.")
        return
    if not can_edit:
        return
    r = pending[0]
    best = r["proposals"][0][0]
    left, right = st.columns([1, 2])
    left.image(crop(str(ws.root), r["image_id"], r["wound_index"], now),
               caption=markup.escape_md(f"{r['image_id']} · wound {r['wound_index']} · {r['visit_date']} · {r['site'] or 'no site'}"))
    with right:
        st.markdown(f"Proposed: **{markup.escape_md(best) or 'a new track'}**" + (f" (cost {r['proposals'][0][1]:.1f})" if best else ""))
        c1, c2 = st.columns(2)
        c1.button(f"Accept · {markup.escape_md(best) or 'new track'}", key="fu_accept", type="primary", shortcut=KEYS["accept"],
                  on_click=link, args=(ws, r, best))
        c2.button("New track", key="fu_new", shortcut=KEYS["new"], on_click=link, args=(ws, r, None))
        others = [t for t, _ in r["proposals"][1:] if t is not None]
        tracks = [t["track_id"] for t in followup.tracks(ws.store) if t["patient_id"] == r["patient"]]
        choice = st.selectbox("Or correct it: another track", [*others, *[t for t in tracks if t not in others]],
                              index=None, key="fu_correct")
        st.button("Link to this track", key="fu_correct_btn", disabled=choice is None, on_click=link,
                  args=(ws, r, choice))
        st.caption(f"Keys: **{KEYS['accept']}** accept · **{KEYS['new']}** new track")


def healing_curves(linked: list[dict]) -> list[dict]:
    """Area curves and the healing table of the chosen patients; returns their linked wounds."""
    patients = sorted({str(r["patient"]) for r in linked})
    chosen = st.multiselect("Patients", patients, default=patients[: min(5, len(patients))], key="fu_patients")
    shown = [r for r in linked if str(r["patient"]) in chosen]
    unit = "area_cm2" if all(r["area_cm2"] is not None for r in shown) else "area_px"
    flagged = [r for r in shown if r.get("flag")]
    if flagged:
        st.warning(f"{len(flagged)} calibrated size(s) withheld as implausible, e.g. {flagged[0]['image_id']}: "
                   f"{flagged[0]['flag']}; areas in pixels.")
    elif unit == "area_px":
        st.warning("Some photos have neither the calibration marker nor a ruler: areas in pixels, no cm².")
    st.plotly_chart(area_figure(shown, unit) if shown else go.Figure(), width="stretch", key="fu_curves")
    st.dataframe(pd.DataFrame(followup.healing(shown)), hide_index=True, width="stretch")
    return shown


def track_photos(ws: Workspace, shown: list[dict], now: tuple[int, int]) -> None:
    """A track's photos side by side, aligned on the wound."""
    track = st.selectbox("Track photos", sorted({r["track"] for r in shown}), key="fu_track")
    visits = [r for r in shown if r["track"] == track]
    views = aligned(str(ws.root), tuple((r["image_id"], r["wound_index"]) for r in visits), now)
    for col, r, (picture, _) in zip(st.columns(max(len(visits), 1)), visits, views):
        size = f"{r['area_cm2']:.2f} cm²" if r["area_cm2"] is not None else f"{r['area_px']} px"
        col.image(picture, caption=f"{markup.escape_md(str(r['visit_date']))} · {size}" + (" · closed" if r["closed"] else "")
                  + (f" · {markup.escape_md(str(r['flag']))}" if r.get("flag") else ""))
    if views:
        registered = sum("(ECC)" in how for _, how in views[1:])
        st.caption(f"Aligned: {views[0][1]}; {registered} of the {len(views) - 1} later views registered on the "
                   "visit before (ECC on the skin around the wound; a registration that did not help is not used).")


def export_button(rows: list[dict]) -> None:
    """The tidy follow-up CSV of every wound on a track."""
    buf = io.StringIO()
    followup.write_csv(buf, [r for r in rows if r["track"] is not None], followup.COLUMNS)
    st.download_button("Download the follow-up CSV", buf.getvalue(), file_name="followup.csv", mime="text/csv",
                       key="fu_download")


def main(ws: Workspace, can_edit: bool) -> None:
    """Add visits and dates, confirm links, then curves, a track's photos and the CSV."""
    if auth.allowed("manage"):
        import_visit_form(ws)
    visit_date_form(ws, can_edit)
    now = version(ws)
    try:
        rows = rows_of(str(ws.root), now)
    except DatasetError as err:
        st.error(markup.escape_md(str(err)))
        return
    confirm_links(ws, can_edit, rows, now)
    linked = [r for r in rows if r["track"] is not None and r["visit_date"]]
    if not linked:
        st.info("No wound is on a track yet: set visit dates and link the wounds above.")
        return
    track_photos(ws, healing_curves(linked), now)
    export_button(rows)
