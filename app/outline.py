"""The Wound masks page's logic: the photo on screen as one :class:`View` (the workspace, the photo, its wounds,
suggestions, clicks and pending save), the outline editor, the worklist, the wound list and their event functions,
each acting on the view it is given (pages/1_Wound_masks.py only starts the page and calls :func:`photo_area`)."""

from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import dataclass

import numpy as np
import streamlit as st

from annotations.accounts import session
from annotations.followup import readings
from annotations.infra.workspace import Workspace
from annotations.io.readers import typed_value
from annotations.store.revisions import StaleEdit
from annotations.store.rows import wound_key
from app import auth
from app.markup import escape_md
from components import outline_editor  # called through its module: the app tests stub the component

state = st.session_state


#: Keyboard shortcuts of the worklist's buttons (st.button(shortcut=…); ignored while typing in a field).
KEYS = {"previous": "p", "next": "n", "unoutlined": "u", "done": "d"}
#: Metadata fields every wound shows, with their labels; any other imported field gets its own too.
FIELDS = {"anatomical_site": "Anatomical site", "size_cm": "Size (cm)", "duration_weeks": "Duration (weeks)"}
HIDDEN_FIELDS = {"origin"}


def choose_photo(ids: list[str], to_read: set[str]) -> tuple[str, list]:
    """The photo on screen and the row above the editor (the photo, then — filled below — its suggestion and
    click-to-outline tools): the photo the address names on a fresh session (a reload stays on it), else the
    first; the address follows the choice."""
    if state.get("mask_photo") not in ids:
        wanted = st.query_params.get("photo")
        state["mask_photo"] = wanted if wanted in ids else ids[0]
    cols = st.columns([1.6, 1, 1, 1.5], vertical_alignment="bottom")
    pick = cols[0].selectbox("Photo", ids, key="mask_photo",
                             format_func=lambda i: f"{i} · second reading" if i in to_read else i)
    if st.query_params.get("photo") != pick:
        st.query_params["photo"] = pick
    return pick, cols


@st.cache_resource(show_spinner="Loading the segmentation model…", max_entries=2)
def segmenter(root: str, run_id: int | None, _ws):
    """The workspace's latest trained segmenter, else the default one (one per workspace and run, shared by the
    sessions)."""
    from core.segmentation import load_segmenter

    return load_segmenter(_ws)


@st.cache_data(show_spinner=False, max_entries=32)
def photo_uri(path: str, sha256: str) -> str:
    """The photo as the editor's data URI (cached per file content)."""
    from PIL import Image

    with Image.open(path) as im:
        return outline_editor.image_uri(im)


@st.cache_data(show_spinner=False, max_entries=64)
def wound_polygons(root: str, image_id: str, mask_digest: str, wounds_digest: str, _ws) -> dict[int, list]:
    """The editor's outlines of the photo's wounds (:func:`annotations.accounts.session.label_polygons` of its label map),
    cached per label-map file content and stored wounds (a save changes either, so it is traced again)."""
    return session.label_polygons(_ws.load_mask(image_id))


def outlines_of(ws: Workspace, image_id: str, wounds: list[dict]) -> tuple[dict[int, list], dict[int, dict], str]:
    """The photo's wound outlines for the editor (cached), each stored wound's geometry ({area, bbox}) and a
    digest of those geometries (the editor's version: it redraws when a save changes them)."""
    geometry = {w["wound_index"]: {"area": int(w["area"]), "bbox": [int(v) for v in w["bbox"]]} for w in wounds}
    digest = hashlib.sha1(json.dumps(sorted(geometry.items())).encode()).hexdigest()[:12]
    path = ws.mask_path(image_id)
    mask_digest = hashlib.sha1(path.read_bytes()).hexdigest() if path.exists() else ""
    return wound_polygons(str(ws.root), image_id, mask_digest, digest, ws), geometry, digest


def prefetch(ws: Workspace, image_ids: list[str | None]) -> None:
    """Prepare the photos Previous / Next go to (their picture and outlines, cached), so that moving on shows
    them without decoding and tracing them first (done after the page is drawn)."""
    for image_id in dict.fromkeys(i for i in image_ids if i is not None):
        row = ws.store.image(image_id)
        photo_uri(str(ws.image_path(image_id)), row["sha256"])
        outlines_of(ws, image_id, ws.store.wounds(image_id))


def latest_segmenter_run(ws: Workspace) -> int | None:
    """The id of the workspace's newest finished segmenter run, None when there is none."""
    from core.segmentation.model import latest_run

    run = latest_run(ws)
    return run["id"] if run else None


def hex_colour(index: int) -> str:
    """The outline palette's colour of wound ``index`` as ``#rrggbb``."""
    r, g, b = session.PALETTE[(index - 1) % len(session.PALETTE)]
    return f"#{r:02x}{g:02x}{b:02x}"


def bump(image_id: str) -> None:
    """Mark the photo's outlines as changed: the editor drops its unsaved edits and redraws."""
    state[f"mask_ver_{image_id}"] = state.get(f"mask_ver_{image_id}", 0) + 1


def second_reading(ws: Workspace, image_id: str) -> None:
    """A photo marked for second reading, read blind: only this annotator's own layer is shown and saved."""
    me = auth.actor()
    image = ws.store.image(image_id)
    layer = readings.load_layer(ws, image_id, me)
    st.info("**Second reading**: outline this photo on your own. Only your outlines are shown; the stored outline "
            "and other annotators' readings stay hidden, and your reading is stored apart from them. Suggestions "
            "and click-to-outline are off so that the readings stay independent.", icon=":material/visibility_off:")
    draw_col, list_col = st.columns([2, 1], gap="medium")
    with draw_col:
        shapes = [{"key": f"w{i}", "kind": "wound", "index": i, "label": str(i), "colour": hex_colour(i),
                   "polys": polys} for i, polys in session.label_polygons(layer).items()]
        version = f"reading:{state.get(f'reading_ver_{image_id}', 0)}:{int((layer > 0).sum())}"
        action = outline_editor.outline_editor(
            image=photo_uri(str(ws.image_path(image_id)), image["sha256"]),
            image_key=f"{ws.root}/{image_id}/{image['sha256']}", size=(image["width"], image["height"]),
            shapes=shapes, version=version, key="reading_editor")
        if action and action.get("nonce") != state.get("mask_nonce"):
            state["mask_nonce"] = action["nonce"]
            read_action(ws, image_id, me, layer.shape, action)
            st.rerun()
        if state.get("mask_error"):
            st.error(escape_md(state.pop("mask_error")))
        if state.get("mask_flash"):
            st.success(escape_md(state.pop("mask_flash")))
        st.caption(f"{image['width']}×{image['height']} px · minimum wound area {ws.min_wound_area} px · "
                   "overlapping wounds of one reading are refused, never clipped.")
    with list_col:
        st.subheader(f"Your reading of {escape_md(image_id)}")
        found = [int(i) for i in np.unique(layer) if i > 0]
        if not found:
            st.info("You have not outlined a wound on this photo yet.")
        for i in found:
            c1, c2 = st.columns([1, 1], vertical_alignment="center")
            c1.markdown(f"**Wound {i}** · {int((layer == i).sum()):,} px")
            c2.button(f"Delete wound {i}", icon=":material/delete:", key=f"rdel_{image_id}_{i}",
                      on_click=read_delete, args=(ws, image_id, me, i))


def read_action(ws: Workspace, image_id: str, me: str, shape: tuple[int, int], action: dict) -> None:
    """Store a drawn or edited outline in the reader's layer; anything else is refused with a message."""
    if action["type"] != "save":
        state["mask_error"] = "Suggestions and click-to-outline are off during a second reading: draw the outline."
        return
    try:
        region = session.rasterise_outlines([[tuple(p) for p in poly] for poly in action["polys"]], shape)
        index = readings.add_wound(ws, image_id, region, action.get("index"), reader=me, actor=me)
    except ValueError as err:
        state["mask_error"] = str(err)
        return
    state[f"reading_ver_{image_id}"] = state.get(f"reading_ver_{image_id}", 0) + 1
    state["mask_flash"] = f"Saved wound {index} of your reading of {image_id}."


def read_delete(ws: Workspace, image_id: str, me: str, index: int) -> None:
    """Delete wound ``index`` from ``me``'s own reading of the photo; the store's refusal becomes the page's message."""
    try:
        readings.delete_wound(ws, image_id, index, reader=me, actor=me)
    except ValueError as err:
        state["mask_error"] = str(err)
        return
    state[f"reading_ver_{image_id}"] = state.get(f"reading_ver_{image_id}", 0) + 1
    state["mask_flash"] = f"Deleted wound {index} of your reading of {image_id}."


@dataclass
class View:
    """The photo on screen as one run of the page drew it: what its widgets' event functions act on."""

    ws: Workspace  #: the workspace of this browser session
    ml_off: str | None  #: the install hint when torch is missing here (the model's controls are disabled)
    ids: list[str]  #: every photo, in the worklist's order
    pick: str  #: the photo on screen
    image: dict  #: its store row
    wounds: list[dict]  #: its stored wounds
    suggestions: dict[str, np.ndarray]  #: waiting proposals (the session's own dict: changes are kept)
    clicks: list[dict]  #: the click-to-outline clicks so far (the session's own list)
    pending: session.OutlinePlan | None  #: a save of this photo waiting for its overlap decision

    @property
    def ml_help(self) -> str | None:
        """Why the model's controls are disabled (their help), None when they are not."""
        if not self.ml_off:
            return None
        return f"Needs the machine-learning extra, which this server does not have: {self.ml_off}"

    @property
    def shape(self) -> tuple[int, int]:
        """(height, width) of the photo and its label map."""
        return self.image["height"], self.image["width"]


def view_of(ws: Workspace, ml_off: str | None, ids: list[str], pick: str) -> View:
    """The view of photo ``pick``: its row and wounds from the store, its suggestions, clicks and pending save."""
    pending: session.OutlinePlan | None = state.get("mask_pending")
    if pending is not None and pending.image_id != pick:
        pending = state["mask_pending"] = None
    return View(ws, ml_off, ids, pick, ws.store.image(pick), ws.store.wounds(pick),
                state.setdefault(f"mask_sugg_{pick}", {}), state.setdefault(f"mask_clicks_{pick}", []), pending)


def user_error(err: Exception) -> None:
    """Show ``err`` as the page's error message on the next run."""
    state["mask_error"] = str(err)


def write(view: View, plan: session.OutlinePlan, keeps: dict[int, bool], after=None,
          expected: dict | None = None) -> None:
    """Store a planned outline (overlaps decided in ``keeps``) provided each wound it changes still has the
    outline the editor drew (``expected``: index → {area, bbox}); a refusal or an error becomes the page's
    message, and the editor redraws the outlines as stored."""
    try:
        with contextlib.ExitStack() as guard:
            for j, outline in (expected or {}).items():
                guard.enter_context(view.ws.store.expecting("wounds", wound_key(plan.image_id, j), {"outline": outline}))
            index = session.apply_outline(view.ws, plan, keeps, actor=auth.actor())
    except StaleEdit as err:
        who = err.by or "someone else"
        theirs = (next(iter(err.conflicts.values()))[0] or {}).get("area")
        user_error(f"Not saved: {who} {'deleted' if err.gone else 'changed'} wound {err.key['wound_index']} "
                   f"since your editor drew it{'' if theirs is None else f' (now {theirs:,} px)'}. The stored "
                   "outlines are shown again: check them, then redraw.")
        state["mask_pending"] = None
        bump(plan.image_id)
        return
    except ValueError as err:
        user_error(err)
        return
    state["mask_pending"] = None
    for j in plan.overlaps:
        state.pop(f"mask_keep_{j}", None)
    if after is not None:
        after()
    bump(plan.image_id)
    state["mask_flash"] = f"Saved wound {index} of {plan.image_id} ({plan.origin})."


def submit(view: View, region: np.ndarray, wound_index: int | None, origin: str, after=None) -> None:
    """Check a region; save it, or hold it for the overlap decision."""
    try:
        plan = session.plan_outline(view.ws, view.pick, region, wound_index, origin)
    except ValueError as err:
        user_error(err)
        return
    drawn = state.get(f"mask_drawn_{view.pick}", {})  # the outlines the editor showed: what this one was drawn over
    expected = {j: drawn.get(j) for j in {wound_index, *plan.overlaps} if j is not None}
    if plan.overlaps:
        state["mask_pending"] = plan
        state["mask_pending_after"] = after
        state["mask_pending_expected"] = expected
    else:
        write(view, plan, {}, after, expected)


def handle(view: View, action: dict) -> None:
    """One action from the editor: save a drawn/edited outline, accept/reject a suggestion, a click."""
    kind, suggestions, clicks = action["type"], view.suggestions, view.clicks
    if kind == "save" or (kind == "accept" and action.get("edited")):
        try:
            region = session.rasterise_outlines([[tuple(p) for p in poly] for poly in action["polys"]], view.shape)
        except ValueError as err:
            user_error(err)
            return
    if kind == "save":
        index = action.get("index")
        old = next((w for w in view.wounds if w["wound_index"] == index), None)
        origin = "drawn" if old is None else session.edit_origin(session.wound_origin(old))
        submit(view, region, index, origin)
    elif kind == "accept":
        key = action["id"]
        if key not in suggestions:
            return
        if not action.get("edited"):
            region = suggestions[key]  # unchanged: the model's own pixels, not the simplified polygon
        submit(view, region, None, "edited" if action.get("edited") else "suggested",
               after=lambda: (suggestions.pop(key, None), clicks.clear() if key == "click" else None))
    elif kind == "reject":
        suggestions.pop(action["id"], None)
        if action["id"] == "click":
            clicks.clear()
        bump(view.pick)
    elif kind == "click":
        if view.ml_help:
            user_error(view.ml_help)
            return
        click_outline(view, int(action["x"]), int(action["y"]))


def click_outline(view: View, x: int, y: int) -> None:
    """First click: the wound under it; each later click: a region to remove from the proposal."""
    from core.segmentation import SamUnavailable
    from core.segmentation.interactive import BY_GRABCUT, outline_from_click_by

    clicks, suggestions = view.clicks, view.suggestions
    include = not clicks
    clicks.append({"x": x + 0.5, "y": y + 0.5, "include": include})
    first, *excluded = clicks
    try:
        model = clicker(view)
        mask, method = outline_from_click_by(view.ws, view.pick, int(first["x"]), int(first["y"]), segmenter=model,
                                             exclude=[(int(c["x"]), int(c["y"])) for c in excluded])
    except (ValueError, SamUnavailable) as err:
        clicks.pop()
        user_error(err)
        return
    if not mask.any():
        clicks.pop()
        user_error("No wound was found at that click. Try a click nearer the wound's centre, or draw it.")
        return
    suggestions["click"] = mask
    why = (" (no wound model is trained here)" if model is None else
           " (the wound model sees no wound under this click)") if method == BY_GRABCUT else ""
    state["mask_flash"] = (f"Outline proposed by {method}{why}, {int(mask.sum()):,} px: check its edge, then "
                           "accept or reject it; a further click removes a region from it.")
    bump(view.pick)


def clicker(view: View):
    """The model behind click-to-outline: Segment Anything when chosen, else the trained segmenter."""
    if state.get("mask_click_engine") == "Segment Anything":
        path = (state.get("mask_sam_path") or "").strip()
        return sam(path)
    return segmenter(str(view.ws.root), latest_segmenter_run(view.ws), view.ws)


@st.cache_resource(show_spinner="Loading Segment Anything…", max_entries=1)
def sam(path: str):
    """The Segment Anything click model from the checkpoint at ``path`` (loaded once per process)."""
    from core.segmentation import SamClicker

    return SamClicker(path)


def suggest(view: View) -> None:
    """Suggest outlines for the photo on screen with the newest segmenter run; errors become the page's message."""
    from core.segmentation import suggest_outlines_by

    suggestions = view.suggestions
    try:
        model = segmenter(str(view.ws.root), latest_segmenter_run(view.ws), view.ws)
        masks, skipped = suggest_outlines_by(view.ws, view.pick, segmenter=model)
    except ValueError as err:
        user_error(err)
        return
    suggestions.clear()
    suggestions.update({str(n): m for n, m in enumerate(masks, start=1)})
    by = ("the default wound model (no training on this workspace yet)" if model.source == "default"
          else f"this workspace's segmenter ({model.source})")
    known = (f" {skipped} wound(s) it found on or beside the existing outlines are not suggested again."
             if skipped else "")
    state["mask_flash"] = (f"{len(masks)} suggested outline(s) by {by}: select one to edit it, then accept or "
                           f"reject it.{known}" if masks else
                           f"{by[0].upper()}{by[1:]} found no new wound on this photo; draw or click to outline."
                           f"{known}")
    bump(view.pick)


def go(image_id: str | None) -> None:
    """Show photo ``image_id`` (a worklist button's callback)."""
    if image_id is not None:
        state["mask_photo"] = image_id


def mark_done(view: View, done: bool) -> None:
    """Mark the photo on screen done (or not) in the store, and say so."""
    image_id = view.pick
    try:
        view.ws.store.set_done(image_id, done, actor=auth.actor())
    except ValueError as err:
        user_error(err)
        return
    state["mask_flash"] = f"Marked {image_id} {'done' if done else 'not done'}."


def worklist(view: View) -> list[str | None]:
    """The worklist: a filter, previous / next in it and the next photo not outlined (with shortcuts), the
    photo's done mark, and where the photo stands in the list. Returns the photos Next, Previous and Next not
    outlined go to (None where disabled)."""
    ids, pick = view.ids, view.pick
    rows = view.ws.store.worklist(auth.actor())
    waiting = {i for i in ids if state.get(f"mask_sugg_{i}")}
    shown = st.selectbox("Worklist", session.WORKLIST_FILTERS, key="mask_filter",
                         help="Which photos Previous and Next go through (Mine: photos you outlined or marked done)")
    within = session.worklist_ids(rows, shown, waiting)
    before, after = session.step(ids, pick, within, forward=False), session.step(ids, pick, within)
    bare = session.step(ids, pick, [r["image_id"] for r in rows if not r["wounds"]], wrap=True)
    c1, c2 = st.columns(2, gap="small")
    c1.button("Previous", icon=":material/arrow_back:", key="mask_prev", shortcut=KEYS["previous"], on_click=go,
              args=(before,), disabled=before is None, width="stretch", help=f"The previous photo of “{shown}”")
    c2.button("Next", icon=":material/arrow_forward:", key="mask_next", shortcut=KEYS["next"], on_click=go,
              args=(after,), disabled=after is None, width="stretch", help=f"The next photo of “{shown}”")
    c1.button("Next not outlined", key="mask_next_bare", shortcut=KEYS["unoutlined"], on_click=go, args=(bare,),
              disabled=bare is None, width="stretch", help="The next photo with no wound outlined yet")
    row = next(r for r in rows if r["image_id"] == pick)
    if row["done_by"] is None:
        c2.button("Mark done", icon=":material/check:", key="mask_done", shortcut=KEYS["done"], on_click=mark_done,
                  args=(view, True), width="stretch", help="You have outlined every wound of this photo")
    else:
        c2.button("Not done", icon=":material/remove_done:", key="mask_undone", on_click=mark_done,
                  args=(view, False), width="stretch", help="Take back the done mark")
    place = f"photo {within.index(pick) + 1} of {len(within)}" if pick in within else f"{len(within)} photos"
    done = sum(r["done_by"] is not None for r in rows)
    mark = "" if row["done_by"] is None else f" · this one done by {escape_md(row['done_by'])}"
    st.caption(f"{shown}: {place} · {done} of {len(rows)} done{mark}")
    return [after, before, bare]


def messages(view: View) -> None:
    """The page's message, a deletion to confirm, the Undo of the last one, an overlap to decide."""
    pick = view.pick
    if state.get("mask_error"):
        st.error(escape_md(state.pop("mask_error")))
    if state.get("mask_flash"):
        st.success(escape_md(state.pop("mask_flash")))
    confirm = state.get("mask_confirm")
    if confirm is not None and confirm[0] == pick:
        index = confirm[1]
        st.warning(f"Delete wound {index}: its outline, description and metadata?", icon=":material/delete:")
        c1, c2 = st.columns(2, gap="small")
        c1.button(f"Yes, delete wound {index}", type="primary", key="mask_del_yes", on_click=remove,
                  args=(view, index), width="stretch")
        c2.button("Cancel", key="mask_del_no", on_click=state.pop, args=("mask_confirm", None), width="stretch")
    undo = state.get("mask_undo")
    if undo is not None and undo["image_id"] == pick:
        st.button(f"Undo delete of wound {undo['index']}", icon=":material/undo:", key="mask_undo_btn",
                  on_click=undo_delete, args=(view,), width="stretch",
                  help="Put the wound back as it was: its outline, description and metadata")
    if view.pending is not None:
        overlap_decision(view)


def overlap_decision(view: View) -> None:
    """The overlap decision of the view's pending save."""
    pending = view.pending
    with st.container(border=True):
        target = "The new outline" if pending.wound_index is None else f"Wound {pending.wound_index}"
        shared = ", ".join(f"wound {j} ({n:,} px)" for j, n in sorted(pending.overlaps.items()))
        st.warning(f"{target} overlaps {shared}: the shared pixels are hatched in red. "
                   "Nothing is clipped on its own — decide which wound keeps them.", icon=":material/layers:")
        keeps = {}
        for j in sorted(pending.overlaps):
            mine = f"{target} keeps them"
            choice = st.radio(f"Overlap with wound {j}", [mine, f"Wound {j} keeps them"], key=f"mask_keep_{j}",
                              horizontal=True, index=None)
            if choice is not None:
                keeps[j] = choice == mine
        c1, c2 = st.columns(2)
        if c1.button("Save with these choices", type="primary", disabled=len(keeps) < len(pending.overlaps)):
            write(view, pending, keeps, state.pop("mask_pending_after", None), state.pop("mask_pending_expected", {}))
            st.rerun()
        if c2.button("Cancel (keep editing)"):
            state["mask_pending"] = None
            st.rerun()


def editor(view: View, suggest_col, restart_col, engine_col):
    """The tools row (in the given columns) and the outline editor on the photo (the worklist and the messages
    beside it).

    Returns the column beside the editor, for the wound list, and the photos the worklist goes to next.
    """
    ws, pick, image, suggestions, clicks, pending = (view.ws, view.pick, view.image, view.suggestions, view.clicks,
                                                     view.pending)
    suggest_col.button("Suggest outlines", icon=":material/auto_fix_high:", on_click=suggest, args=(view,),
                       width="stretch", disabled=bool(view.ml_off),
                       help=view.ml_help or "The segmentation model proposes each wound it sees, apart from those "
                                            "already outlined; nothing is stored until you accept it")
    if clicks:
        restart_col.button("New click outline", width="stretch",
                           on_click=lambda: (clicks.clear(), suggestions.pop("click", None), bump(pick)),
                           help="Forget the clicks so far; your next click starts a new wound")
    engine = engine_col.radio(
        "Click to outline uses", ["Wound model", "Segment Anything"], horizontal=True, key="mask_click_engine",
        disabled=bool(view.ml_off),
        help=view.ml_help or "Segment Anything needs the `segment-anything` package and a checkpoint file you provide")
    draw_col, list_col = st.columns([3, 1], gap="small")
    with list_col:  # beside the photo, so that neither pushes the other below the fold at 1366×768
        neighbours = worklist(view)
        messages(view)
    with draw_col:
        if engine == "Segment Anything" and not view.ml_off:
            st.text_input("Segment Anything checkpoint (.pth)", key="mask_sam_path", placeholder="/path/to/sam_vit_b.pth")
        outlines, geometry, digest = outlines_of(ws, pick, view.wounds)
        shapes = [{"key": f"w{i}", "kind": "wound", "index": i, "label": str(i), "colour": hex_colour(i), "polys": polys}
                  for i, polys in outlines.items()]
        shapes += [{"key": f"c{k}", "kind": "candidate", "id": k, "label": "click" if k == "click" else f"S{k}",
                    "colour": "#00e5ff", "polys": session.mask_polygons(m)} for k, m in suggestions.items()]
        overlap = session.mask_polygons(session.overlap_mask(ws, pending)) if pending is not None else []
        version = f"{state.get(f'mask_ver_{pick}', 0)}:{digest}"
        action = outline_editor.outline_editor(
            image=photo_uri(str(ws.image_path(pick)), image["sha256"]), image_key=f"{ws.root}/{pick}/{image['sha256']}",
            size=(image["width"], image["height"]),
            shapes=shapes, version=version, overlap=overlap, clicks=clicks, click_off=view.ml_help, key="outline_editor")
        if action and action.get("nonce") != state.get("mask_nonce"):
            state["mask_nonce"] = action["nonce"]
            handle(view, action)
            st.rerun()
        state[f"mask_drawn_{pick}"] = geometry  # what the editor shows: it redraws whenever the version changes

        st.caption(f"{image['width']}×{image['height']} px · patient {escape_md(image.get('patient_id')) or '—'} · "
                   f"minimum wound area {ws.min_wound_area} px · outlines are stored as a label mask "
                   "(0 = skin, n = wound n). Mouse wheel zooms; W (in the editor) fits the wounds; drag the background "
                   "to pan.")
    return list_col, neighbours


# -- wounds: description and every metadata field ------------------------------------------------------
def field_names(meta: dict) -> list[str]:
    """The metadata fields to edit: the standard ones, then the wound's other non-hidden fields."""
    return list(FIELDS) + [k for k in meta if k not in FIELDS and k not in HIDDEN_FIELDS]


def loaded_copy(base: str, w: dict, names: list[str]) -> dict:
    """The wound's fields as this page loaded them into its widgets: a field's value is taken when its widget
    is created (a widget keeps what was typed into it across reruns; its loaded value stays with it)."""
    copy = state.setdefault(f"loaded_{base}", {})
    if f"desc_{base}" not in state:
        copy["description"] = w["description"]
    for name in names:
        if f"meta_{name}_{base}" not in state:
            copy[f"metadata.{name}"] = (w["metadata"] or {}).get(name)
    return copy


def typed_fields(base: str, names: list[str], loaded: dict) -> dict:
    """The wound's fields as typed into its widgets (metadata typed by the import's rules; empty is None)."""
    yours = {"description": str(state.get(f"desc_{base}", "")).strip()}
    for name in names:
        yours[f"metadata.{name}"] = typed_value(str(state.get(f"meta_{name}_{base}", "")),
                                                loaded.get(f"metadata.{name}"))
    return yours


def save_text(view: View, index: int, names: list[str]) -> None:
    """Store only the description and metadata fields changed since the page loaded them, provided nobody
    changed those since (:meth:`annotations.store.store.Store.edit`); a refusal is kept for the page to show."""
    image_id = view.pick
    base = f"{image_id}_{index}"
    loaded = state[f"loaded_{base}"]
    changes = {k: v for k, v in typed_fields(base, names, loaded).items() if v != loaded.get(k)}
    if not changes:
        return
    try:
        view.ws.store.edit("wounds", wound_key(image_id, index), loaded, changes, actor=auth.actor())
    except StaleEdit as err:
        state[f"stale_{base}"] = err
        return
    loaded.update(changes)
    state.pop(f"stale_{base}", None)


def widget_key(base: str, field: str) -> str:
    """The key of the widget editing ``field`` (``description`` or ``metadata.<name>``) of wound ``base``."""
    return f"desc_{base}" if field == "description" else f"meta_{field.removeprefix('metadata.')}_{base}"


def resolve(view: View, index: int, names: list[str], mine: bool) -> None:
    """After a refused save: take their values into the fields (``mine`` False), or save yours over theirs."""
    base = f"{view.pick}_{index}"
    err: StaleEdit = state.pop(f"stale_{base}")
    loaded = state[f"loaded_{base}"]
    for field, (theirs, _) in err.conflicts.items():
        loaded[field] = theirs
        if not mine:
            state[widget_key(base, field)] = "" if theirs is None else str(theirs)
    if mine:
        save_text(view, index, names)


def stale_notice(base: str, err: StaleEdit, args: tuple) -> None:
    """A refused save: who changed the wound, their value and yours per field (as plain text), and the two ways on."""
    who = f"{err.by} ({err.at[:16].replace('T', ' ')} UTC)" if err.by and err.at else "someone else"
    st.error(f"Not saved: {who} {'deleted' if err.gone else 'changed'} this since you opened it. Your text is "
             "still in the fields; nothing was overwritten.", icon=":material/sync_problem:")
    for field, (theirs, yours) in err.conflicts.items():
        name = field.removeprefix("metadata.")
        st.caption(escape_md(FIELDS.get(name, name.replace("_", " ").capitalize())))
        st.text(f"Theirs: {'' if theirs is None else theirs}")
        st.text(f"Yours: {'' if yours is None else yours}")
    c1, c2 = st.columns(2)
    c1.button("Use theirs", key=f"theirs_{base}", on_click=resolve, args=(*args, False),
              help="Put their values in the fields; nothing is saved")
    c2.button("Save mine", key=f"mine_{base}", on_click=resolve, args=(*args, True), disabled=err.gone,
              help="Save your values over theirs (recorded in the history)")


def forget_fields(image_id: str, index: int) -> None:
    """Drop the wound's field widgets and their loaded copy: they load the stored values again."""
    base = f"{image_id}_{index}"
    for key in [k for k in state if k in (f"desc_{base}", f"loaded_{base}")
                or (k.startswith("meta_") and k.endswith(f"_{base}"))]:
        del state[key]


def ask_delete(image_id: str, index: int) -> None:
    """Ask to confirm the deletion of wound ``index`` (beside the photo, with the page's messages)."""
    state["mask_confirm"] = (image_id, index)


def remove(view: View, index: int) -> None:
    """Delete wound ``index`` of the photo on screen (confirmed), provided it is still as this page loaded it (its fields
    and the outline the editor drew); redraw its outlines and offer the Undo, or say why nothing was deleted."""
    ws, image_id = view.ws, view.pick
    state.pop("mask_confirm", None)
    expected = {**state.get(f"loaded_{image_id}_{index}", {}),
                "outline": state.get(f"mask_drawn_{image_id}", {}).get(index)}
    try:
        with ws.store.expecting("wounds", wound_key(image_id, index), expected):
            revision = session.delete_wound(ws, image_id, index, actor=auth.actor())
    except StaleEdit as err:
        user_error(f"Not deleted: {err.by or 'someone else'} {'deleted' if err.gone else 'changed'} wound {index} "
                   f"since this page showed it ({', '.join(err.conflicts)}). Check it, then delete it again.")
        forget_fields(image_id, index)
        bump(image_id)
        return
    forget_fields(image_id, index)
    bump(image_id)
    state["mask_undo"] = {"revision": revision, "image_id": image_id, "index": index}
    state["mask_flash"] = f"Deleted wound {index} of {image_id} (its outline, description and metadata)."


def undo_delete(view: View) -> None:
    """Put back the wound deleted last (:func:`annotations.accounts.session.undo_delete`), or say why not."""
    undo = state.pop("mask_undo")
    try:
        session.undo_delete(view.ws, undo["revision"], actor=auth.actor())
    except ValueError as err:
        user_error(err)
        return
    forget_fields(undo["image_id"], undo["index"])
    bump(undo["image_id"])
    state["mask_flash"] = (f"Restored wound {undo['index']} of {undo['image_id']} with its outline, description "
                           "and metadata.")


def wound_list(view: View, list_col) -> None:
    """Each wound of the photo: its description and metadata fields (saved on leaving a field), delete."""
    pick, wounds, suggestions = view.pick, view.wounds, view.suggestions
    with list_col:
        st.subheader(f"Wounds of {escape_md(pick)}")
        if not wounds:
            st.info("No wound outlined on this photo yet. Draw one, click inside one, or ask for suggestions.")
        for w in wounds:
            i, base = w["wound_index"], f"{pick}_{w['wound_index']}"
            meta = w["metadata"] or {}
            names = field_names(meta)
            loaded_copy(base, w, names)
            with st.container(border=True):
                st.markdown(f"**Wound {i}** · {w['area']:,} px · box {w['bbox']}")
                if f"stale_{base}" in state:
                    stale_notice(base, state[f"stale_{base}"], (view, i, names))
                st.text_area("Description", value=w["description"], key=f"desc_{base}", on_change=save_text,
                             args=(view, i, names), placeholder="granulation, fibrin, border, erythema, crusts…",
                             height=90)
                cols = st.columns(2)
                for n, name in enumerate(names):
                    value = meta.get(name)
                    cols[n % 2].text_input(FIELDS.get(name, name.replace("_", " ").capitalize()),
                                           value="" if value is None else str(value), key=f"meta_{name}_{base}",
                                           on_change=save_text, args=(view, i, names))
                st.button(f"Delete wound {i}", icon=":material/delete:", key=f"del_{base}",
                          on_click=ask_delete, args=(pick, i),
                          help="Remove this wound's outline, description and metadata (asks first; can be undone)")
        done = sum(1 for w in wounds if w["description"].strip())
        if wounds:
            st.caption(f"{done} of {len(wounds)} wounds described. Text is saved when you leave a field.")
        if suggestions:
            st.caption(f"{len(suggestions)} suggestion(s) waiting (dashed, cyan): select one in the editor, "
                       "edit it if needed, then Accept or Reject.")


@st.fragment
def photo_area(ws: Workspace, to_read: set[str], ml_off: str | None) -> None:
    """Everything of the photo on screen: its choice, the worklist, the editor and the wound list. A Streamlit
    fragment: moving to another photo (or any other widget of it) reruns only this, not the page's header and
    sidebar; ``to_read`` are the photos marked for second reading, ``ml_off`` the install hint when torch is missing
    here."""
    ids = [im["image_id"] for im in ws.store.images()]
    pick, (pick_col, suggest_col, restart_col, engine_col) = choose_photo(ids, to_read)
    # annotators read marked photos blind; an admin sees the stored outline unless reading the photo too
    if pick in to_read and (not auth.allowed("manage") or pick_col.toggle(
            "My second reading of this photo", key="mask_reading",
            help="On: outline this photo blind, into your own layer. Off: the stored outline (admins only while "
                 "marked)")):
        second_reading(ws, pick)
        return
    view = view_of(ws, ml_off, ids, pick)
    list_col, neighbours = editor(view, suggest_col, restart_col, engine_col)
    wound_list(view, list_col)
    prefetch(ws, neighbours)
