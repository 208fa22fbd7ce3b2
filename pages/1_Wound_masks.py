"""Wound masks: outline each wound on the photo, describe it; everything is saved at once."""

from __future__ import annotations

import streamlit as st
from streamlit_drawable_canvas import st_canvas

import app_common as ac
from annotations import session

TOOLS = {"Polygon (click points, click the first point to close)": "polygon",
         "Freehand (drag around the wound)": "freedraw",
         "Rectangle": "rect"}
CANVAS_W = 600  # fits the drawing column of the wide layout on a 1366 px screen

ws = ac.page("Wound masks", need="annotate")
state = st.session_state
images = ws.store.images()
if not images:
    st.info("No photos yet. Import a dataset folder or build the demo on the Home page.")
    st.stop()

counts: dict[str, int] = {}
for w in ws.store.wounds():
    counts[w["image_id"]] = counts.get(w["image_id"], 0) + 1
ids = [im["image_id"] for im in images]
pick = st.selectbox(
    "Photo", ids, key="mask_photo",
    format_func=lambda i: f"{i} — {counts.get(i, 0)} wound(s)" if counts.get(i) else f"{i} — not outlined yet")
image = ws.store.image(pick)
wounds = ws.store.wounds(pick)
rev_key = f"canvas_rev_{pick}"
state.setdefault(rev_key, 0)

draw_col, list_col = st.columns([2, 1], gap="medium")
with draw_col:
    c1, c2 = st.columns([3, 2])
    tool = TOOLS[c1.radio("Outline tool", list(TOOLS), horizontal=False, key="mask_tool")]
    targets = ["New wound"] + [f"Redraw wound {w['wound_index']}" for w in wounds]
    redraw = c2.selectbox("Draw", targets, key=f"mask_target_{pick}")
    photo = ws.load_image(pick)
    labels = ws.load_mask(pick)
    width = CANVAS_W  # small photos are shown enlarged, large ones reduced
    height = max(1, round(photo.height * width / photo.width))
    background = session.overlay(photo, labels).resize((width, height))
    result = st_canvas(
        fill_color="rgba(255, 215, 0, 0.25)", stroke_width=2, stroke_color="#ffd700",
        background_image=background, update_streamlit=True, width=width, height=height,
        drawing_mode=tool, key=f"canvas_{pick}_{state[rev_key]}")
    outlines = session.canvas_outlines(result.json_data)
    if outlines:
        scale = photo.width / width
        index = None if redraw == "New wound" else int(redraw.rsplit(" ", 1)[1])
        saved = []
        for outline in outlines:
            region = session.rasterise(outline, labels.shape, scale=scale)
            try:
                saved.append(session.add_wound(ws, pick, region, wound_index=index))
            except ValueError as err:
                st.error(str(err))
        state[rev_key] += 1  # a fresh, empty canvas over the updated overlay
        if saved:
            state["mask_flash"] = f"Saved wound {', '.join(map(str, saved))} of {pick}."
            st.rerun()
    if state.get("mask_flash"):
        st.success(state.pop("mask_flash"))
    st.caption(f"{image['width']}×{image['height']} px · patient {image.get('patient_id') or '—'} · "
               "outlines are stored as a label mask (0 = skin, n = wound n) and in the store at once.")


def save_text(image_id: str, index: int) -> None:
    base = f"{image_id}_{index}"
    old = next(w for w in ws.store.wounds(image_id) if w["wound_index"] == index)
    meta = {**old["metadata"], "site": state.get(f"site_{base}", ""), "size": state.get(f"size_{base}", "")}
    meta = {k: v for k, v in meta.items() if v not in (None, "")}
    session.update_wound_text(ws, image_id, index, state.get(f"desc_{base}", ""), meta)


def remove(image_id: str, index: int) -> None:
    session.delete_wound(ws, image_id, index)
    state["mask_flash"] = f"Deleted wound {index} of {image_id}."


with list_col:
    st.subheader(f"Wounds of {pick}")
    if not wounds:
        st.info("No wound outlined on this photo yet. Draw one on the left: it is saved as soon as it is closed.")
    for w in wounds:
        i, base = w["wound_index"], f"{pick}_{w['wound_index']}"
        meta = w["metadata"] or {}
        with st.container(border=True):
            st.markdown(f"**Wound {i}** · {w['area']:,} px · box {w['bbox']}")
            st.text_area("Description", value=w["description"], key=f"desc_{base}", on_change=save_text,
                         args=(pick, i), placeholder="granulation, fibrin, border, erythema, crusts…",
                         height=90)
            m1, m2 = st.columns(2)
            m1.text_input("Site", value=str(meta.get("site", "")), key=f"site_{base}", on_change=save_text,
                          args=(pick, i), placeholder="e.g. left shin")
            m2.text_input("Size", value=str(meta.get("size", "")), key=f"size_{base}", on_change=save_text,
                          args=(pick, i), placeholder="e.g. 3 × 2 cm")
            st.button(f"Delete wound {i}", icon=":material/delete:", key=f"del_{base}", on_click=remove,
                      args=(pick, i), help="Remove this wound's outline and description")
    done = sum(1 for w in wounds if w["description"].strip())
    if wounds:
        st.caption(f"{done} of {len(wounds)} wounds described. Text is saved when you leave a field.")
