"""The Explore page's logic: the map of a run's embeddings, retrieval, token maps and concepts, one function per
section (:func:`main` calls them in order; pages/5_Explore.py starts the page and calls it). The data come from
:mod:`core.eval.explore`, imported here: a server without it fails the import, and the page says so."""

from __future__ import annotations

import io
from collections import Counter
from pathlib import Path

import numpy as np
import streamlit as st

from annotations.followup import followup
from annotations.infra.workspace import Workspace
from annotations.store.runs import CONCEPTS, VISION_FINETUNE, VISION_TRIDERM
from app import auth, extras, images, jobs, markup
from core.eval.explore import (
    TOKEN_MAPS_ARTIFACT,
    UMAP_MIN_DIST,
    UMAP_NEIGHBOURS,
    PICK,
    MapInput,
    TokenMaps,
    add_track_path,
    cluster_labels,
    colour_options,
    colour_value,
    compute_umap,
    concept_table,
    embeddings_stamp,
    has_wound_embedding,
    map_input,
    map_overlay,
    no_attention_reason,
    quick_layout,
    retrieval,
    run_choices,
    scatter_spec,
    stale_note,
    stored_token_maps,
    stored_umap,
    thumbnail_layer,
    thumbnail_size,
    track_rows,
    umap_path,
)
from core.eval.report import embedding_runs
from core.runtime import load_embeddings


def category_colours(values: list[str], limit: int = 24) -> tuple[list[str], dict[str, str]]:
    """Map categories to ``limit`` distinct colours (Dark24): up to ``limit`` categories each
    get their own; beyond that the ``limit - 1`` most frequent keep theirs and the rest become
    ``other`` (grey). Returns the (possibly grouped) values and {category: colour}, legend order."""
    from plotly.colors import qualitative

    counts = Counter(values)
    if len(counts) > limit:
        keep = {v for v, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:limit - 1]}
        values = [v if v in keep else "other" for v in values]
    names = sorted(set(values) - {"other"})
    colours = {name: qualitative.Dark24[n] for n, name in enumerate(names)}
    if "other" in values:
        colours["other"] = "#9e9e9e"
    return values, colours



THUMBNAILS_MAX = 200  # photos drawn on the map itself; above, a photo shows on hover text / click only


@st.cache_resource(show_spinner="Loading the map…", max_entries=16)
def map_data(root: str, run_ids: tuple[int, ...], level: str, method: str, stamp: tuple):
    """The map's input for the runs (cached per workspace ``root`` and ``stamp``)."""
    ws = auth.workspace()
    return map_input(ws, run_ids, level, method)


@st.cache_resource(show_spinner="Preparing retrieval…", max_entries=8)
def photo_retrieval(root: str, run_ids: tuple[int, ...], method: str, stamp: tuple):
    """The photo retrieval index of the runs (cached per workspace ``root`` and ``stamp``)."""
    ws = auth.workspace()
    return retrieval(ws, run_ids, method)


@st.cache_resource(show_spinner=False, max_entries=16)
def instant_layout(root: str, run_ids: tuple[int, ...], level: str, method: str, stamp: tuple) -> np.ndarray:
    """A quick 2-D layout of the map data, drawn before the slower projection is ready."""
    return quick_layout(map_data(root, run_ids, level, method, stamp))


@st.cache_resource(show_spinner="Clustering…", max_entries=16)
def clusters(root: str, run_ids: tuple[int, ...], level: str, method: str, stamp: tuple, k: int) -> np.ndarray:
    """``k`` cluster labels of the map's points."""
    return cluster_labels(map_data(root, run_ids, level, method, stamp), k)


def choose_runs(ws: Workspace, columns: list) -> tuple[tuple[int, ...], str]:
    """The row of controls: one run, or two runs to fuse and the fusion method; (run ids, method)."""
    runs = embedding_runs(ws)
    if not runs:
        st.info("No finished embedding run yet. Train a vision model or fit a text embedding on the Train page; "
                "its image embedding appears here as a map.")
        st.stop()
    label = run_choices(runs)
    source = columns[0].radio("Map of", ["one run", "fused runs"],
                              help="fused: two runs' min-max normalised distances combined (core.eval.fusion)")
    if source == "one run":
        return (columns[1].selectbox("Run", list(label), format_func=label.get, key="explore_run"),), "uncertainty"
    picked = columns[1].multiselect("Runs to fuse (vision first)", list(label), format_func=label.get,
                                    default=list(label)[:2], max_selections=2, key="explore_fuse")
    method = columns[2].selectbox("Fusion", ["uncertainty", "similarity"])
    if len(picked) != 2:
        st.info("Pick two runs to fuse.")
        st.stop()
    return tuple(picked), method


def layout(ws: Workspace, m: MapInput, run_ids: tuple[int, ...], level: str, method: str, stamp: tuple
           ) -> tuple[np.ndarray, Path | None, int]:
    """The UMAP settings and the map's 2-d layout: the stored UMAP, else an instant MDS while the UMAP is
    computed in the background; (xy, the UMAP file awaited or None, the number of clusters)."""
    with st.expander("UMAP settings"):
        n_neighbors = st.slider("Neighbours", 2, 50, UMAP_NEIGHBOURS)
        min_dist = st.slider("Minimum distance", 0.0, 0.99, UMAP_MIN_DIST)
        k_clusters = st.slider("Clusters (colour by cluster)", 2, 12, 5)
    xy = stored_umap(ws, m, n_neighbors, min_dist)
    if xy is not None:
        return xy, None, k_clusters
    umap_file = umap_path(ws, m, n_neighbors, min_dist)  # computed once per embedding and setting
    jobs.in_background(str(umap_file), compute_umap, ws, m, n_neighbors, min_dist)
    return instant_layout(str(ws.root), run_ids, level, method, stamp), umap_file, k_clusters


@st.fragment(run_every=2.0)
def poll_umap(path: str) -> None:
    """Rerun the page once the background UMAP of this map is stored."""
    if Path(path).exists():
        st.rerun(scope="app")
    st.caption("The UMAP of this run is being computed once (later visits load it instantly); the map "
               "switches to it by itself.")


def add_thumbnails(ws: Workspace, spec: dict, xy: np.ndarray, image_ids: list[str]) -> None:
    """Draw each photo's thumbnail at its point ``xy`` of the map, sized to the number of points."""
    side = thumbnail_size(len(image_ids))
    spec["layer"].append(thumbnail_layer(xy, [images.data_uri(images.photo(ws, i, 160)) for i in image_ids], side))


def track_path(ws: Workspace, spec: dict, side_col, m: MapInput, xy: np.ndarray, stale: str | None) -> None:
    """The stale-run warning and the track picker beside the map; the picked track drawn on it."""
    with side_col:
        if stale:
            st.warning(markup.escape_md(stale), icon=":material/update:")
        track_ids = [t["track_id"] for t in followup.tracks(ws.store)]
        path_of = st.selectbox("Track path (a wound across visits)", track_ids, index=None, key="explore_track",
                               placeholder="no track" if track_ids else "no wound track yet (Follow-up page)",
                               disabled=not track_ids)
    if path_of:
        visits = followup.track_visits(ws.store, path_of)
        path = track_rows(m, visits)
        date_of = {image_id: day for image_id, _, day in visits}  # one wound of a track per photo
        add_track_path(spec, xy, path, path_of, [date_of[m.images[r]] for r in path])
        if len(path) < len(visits):
            side_col.caption(f"Track {markup.escape_md(path_of)}: {len(visits) - len(path)} of its {len(visits)} visits are not in this run.")


def clicked_photo(event, m: MapInput, ids) -> None:
    """A new click on the map moves the photo picker to the clicked photo."""
    clicked = None
    try:
        points = event.selection[PICK] if event else []
        if points:
            clicked = m.images[int(points[0]["row"])]
    except (AttributeError, KeyError, IndexError, TypeError, ValueError):
        clicked = None
    if clicked and clicked in ids and clicked != st.session_state.get("_explore_click"):
        st.session_state["explore_photo"] = clicked
    st.session_state["_explore_click"] = clicked


def draw_map(ws: Workspace, columns: list, run_ids: tuple[int, ...], method: str, run: dict, stamp: tuple,
             stale: str | None):
    """The map (points coloured by the chosen group, thumbnails, a track path) and the photo picker beside it;
    (the retrieval of the map's photos, the photo picked)."""
    level = "photos"
    if len(run_ids) == 1 and has_wound_embedding(ws, run_ids[0]):
        level = columns[2].radio("Points", ["photos", "wounds"], horizontal=True)
    try:
        m = map_data(str(ws.root), run_ids, level, method, stamp)
        photos = photo_retrieval(str(ws.root), run_ids, method, stamp)
    except (ValueError, KeyError) as err:  # e.g. fused runs that cover different photos
        st.error(f"Cannot build distances for these runs: {markup.escape_md(str(err))}")
        st.stop()
    image_rows = {im["image_id"]: im for im in ws.store.images()}
    patients = {p["patient_id"]: p["metadata"] or {} for p in ws.store.patients()}
    colour_by = columns[3].selectbox("Colour by", colour_options(image_rows, patients))
    show_thumbs = columns[4].toggle("Thumbnails on the map", value=False, disabled=len(m) > THUMBNAILS_MAX,
                                    help=f"Up to {THUMBNAILS_MAX} points; above, click a point to see its photo.")
    map_col, side_col = st.columns([3, 2], gap="large")  # the map first: the settings go below it
    xy, umap_file, k_clusters = layout(ws, m, run_ids, level, method, stamp)
    cluster_of = clusters(str(ws.root), run_ids, level, method, stamp, k_clusters) if colour_by == "cluster" else None
    grouped, colours = category_colours([colour_value(image_rows.get(i, {}), patients, colour_by,
                                                         None if cluster_of is None else int(cluster_of[n]))
                                            for n, i in enumerate(m.images)])
    projection = "UMAP" if umap_file is None else "Classical MDS (UMAP being computed)"
    title = f"{projection} of {' + '.join(f'run {r}' for r in run_ids)} ({level})"
    spec = scatter_spec(xy, m.points, grouped, colours, colour_by, title, "SYNTHETIC" if ws.is_synthetic else "")
    if show_thumbs:
        add_thumbnails(ws, spec, xy, m.images)
    track_path(ws, spec, side_col, m, xy, stale)
    with map_col:
        event = st.vega_lite_chart(spec, width="stretch", on_select="rerun", selection_mode=PICK, key="umap",
                                   alt=title)
        st.caption("Hover a point for its photo id; click a point to show it and its neighbours; the wheel zooms, a "
                   "drag pans, a double click resets. Each group has its own colour and symbol; click a legend entry "
                   "to bring its group forward (shift-click for more).")
        if umap_file is not None:
            poll_umap(str(umap_file))
    clicked_photo(event, m, photos.ids)
    with side_col:
        query = st.selectbox("Photo", list(photos.ids), key="explore_photo")
        st.image(images.photo(ws, query, 480), caption=f"{markup.escape_md(query)} · patient {markup.escape_md(image_rows.get(query, {}).get('patient_id')) or '—'}",
                 width="stretch")
        for w in ws.store.wounds(query):
            if w["description"]:
                st.caption(f"Wound {w['wound_index']}: {markup.escape_md(w['description'])}")
    return photos, query


def show_retrieval(ws: Workspace, photos, query: str, fused: bool) -> None:
    """The most similar and most dissimilar photos to ``query``, with their normalised distances."""
    k = st.slider("Photos per row", 3, 10, 5)
    result = photos.neighbours(query, k=min(k, len(photos.ids) - 1))
    st.subheader("Retrieval")
    st.caption("Distances are min-max normalised to [0, 1]" + (" after fusion" if fused else "")
               + "; TriDerm's figure shows similar photos below 0.35 and dissimilar ones above 0.8.")
    for title, key in (("Most similar", "similar"), ("Most dissimilar", "dissimilar")):
        st.markdown(f"**{title}**")
        cols = st.columns(len(result[key]))
        for col, (image_id, dist) in zip(cols, result[key]):
            col.image(images.letterboxed(ws, image_id, 320, 240), caption=f"{markup.escape_md(image_id)} · d = {dist:.2f}",
                      width="stretch")


@st.cache_data(show_spinner=False)
def viridis() -> np.ndarray:
    """256×3 uint8 lookup table of Viridis, a perceptually uniform colormap that reads on red wounds."""
    from plotly.colors import sample_colorscale, unlabel_rgb

    return np.array([unlabel_rgb(c) for c in sample_colorscale("Viridis", list(np.linspace(0, 1, 256)))],
                    dtype=np.uint8)


#: side of a token map's tile in the grid (px; the grid's columns make it at least 160 px at 1366×768)
TILE = 320
#: side of an enlarged token map (px)
ENLARGED = 1024
#: photos in the token-map grid: the query and its nearest neighbours
GRID_PHOTOS = 4


@st.cache_resource(show_spinner=False, max_entries=8)
def token_maps(root: str, run_id: int, stamp: tuple) -> TokenMaps | None:
    """The token maps stored for run ``run_id`` (None when it has none; cached per run state ``stamp``)."""
    ws = auth.workspace()
    run = ws.store.run(run_id)
    return None if run is None else stored_token_maps(ws, run)


@st.cache_data(show_spinner=False, max_entries=128)
def map_picture(root: str, run_id: int, image_id: str, stamp: tuple, opacity: float, side: int) -> bytes | None:
    """Photo ``image_id``'s token map in Viridis over the photo (dark blue low, yellow high) at ``opacity``, at
    most ``side`` px (JPEG: a tenth of a PNG's bytes; None when the run has no map of it)."""
    ws = auth.workspace()
    maps = token_maps(root, run_id, stamp)
    heat = None if maps is None else maps.of(image_id)
    if heat is None:
        return None
    photo = ws.load_image(image_id)
    photo.thumbnail((side, side))
    buf = io.BytesIO()
    map_overlay(heat, photo, opacity, viridis()).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


@st.dialog("Token map", width="large")
def enlarged(ws: Workspace, run_id: int, image_id: str, stamp: tuple, opacity: float, caption: str) -> None:
    """The full-size token map of one photo."""
    st.image(map_picture(str(ws.root), run_id, image_id, stamp, opacity, ENLARGED), caption=caption, width="stretch")


def maps_stamp(ws: Workspace, run: dict) -> tuple:
    """A cache key of the run's token maps: its stored maps file's (modification time ns, size)."""
    rel = (run.get("artifacts") or {}).get(TOKEN_MAPS_ARTIFACT)
    path = ws.root / rel if rel else None
    if path is None or not path.is_file():
        return ()
    stat = path.stat()
    return (stat.st_mtime_ns, stat.st_size)


def make_maps(ws: Workspace, run: dict) -> None:
    """The job that stores a run's token maps (an older run's), and the page's rerun once they are stored."""
    if maps_stamp(ws, ws.store.run(run["id"]) or run):
        st.rerun(scope="app")
    jobs.job_panel(ws, f"token-maps-{run['id']}", "token_maps", [str(run["id"])], "making the token maps",
                 blocked=extras.missing_extra("ml"))


def missing_maps(ws: Workspace, run: dict) -> None:
    """Why the run shows no token maps, and (a fine-tune or TriDerm-V run) how to make them."""
    if run["kind"] not in (VISION_FINETUNE, VISION_TRIDERM):
        st.info(no_attention_reason(run), icon=":material/visibility_off:")
        return
    st.info(f"Run {run['id']} was trained before runs stored their token maps, so there is none to show yet. Make "
            "them once with this command" + (" or the button below" if auth.allowed("jobs") else
                                            " (or an admin or researcher, with a button here)")
            + "; later runs store them when they are trained.", icon=":material/visibility_off:")
    st.code(f"python -m core.token_maps {run['id']} --workspace {ws.root}", language="bash")
    if auth.allowed("jobs"):
        st.fragment(make_maps, run_every=2.0 if jobs.any_job_running(ws) else None)(ws, run)


def show_attention(ws: Workspace, run: dict, photos, query: str) -> None:
    """The token maps of vision run ``run`` for ``query`` and its nearest photos, in a grid of tiles that enlarge
    on click, with an opacity slider; where the run has none, why (and how to make them)."""
    st.subheader("Token maps")
    stamp = (str(run.get("finished") or run["created"]), maps_stamp(ws, run))
    maps = token_maps(str(ws.root), run["id"], stamp)
    if maps is None:
        missing_maps(ws, run)
        return
    opacity = st.slider("Overlay opacity", 0.0, 1.0, 0.6, 0.05, key="explore_attention_opacity",
                        help="0: the photo alone; 1: the map's colours alone")
    st.caption(("Each feature-grid token's share of the photo's embedding (the fine-tuned tokens averaged over the "
                "wounds, centred on the study's mean): " if maps.kind == "contribution" else
                "Attention weight of each feature-grid token inside the wounds, from the run's attention pooling "
                "head: ") + "Viridis, dark blue low, yellow high; stored by the job that made the run. Click "
                "Enlarge for the full-size map.")
    shown = [query, *(i for i, _ in photos.neighbours(query, k=min(GRID_PHOTOS - 1, len(photos.ids) - 1))["similar"])]
    cols = st.columns(GRID_PHOTOS)
    for n, image_id in enumerate(shown):
        picture = map_picture(str(ws.root), run["id"], image_id, stamp, opacity, TILE)
        caption = f"{markup.escape_md(image_id)}" + (" (the photo)" if n == 0 else " · similar")
        with cols[n % GRID_PHOTOS]:
            if picture is None:
                st.caption(f"{caption}: no map (not in this run)")
                continue
            st.image(picture, caption=caption, width="stretch")
            if st.button("Enlarge", key=f"explore_enlarge_{image_id}", icon=":material/zoom_in:"):
                enlarged(ws, run["id"], image_id, stamp, opacity, caption)


@st.cache_data(show_spinner="Loading concept scores…", max_entries=8)
def concept_run_data(root: str, run_id: int, stamp: str) -> dict:
    """The concept scores, heatmaps and crop boxes saved by concepts run ``run_id``."""
    ws = auth.workspace()
    emb = load_embeddings(ws, run_id)
    return {k: emb.get(k) for k in ("wound_keys", "concept_names", "concept_global", "concept_local",
                                     "concept_fused", "concept_heatmaps", "crop_boxes")}


def concept_labels() -> dict[str, str]:
    """Concept name → label from the vocabulary (names alone, with a note, when it cannot be read)."""
    try:
        from core.concepts.vocabulary import GROUPS, load_vocab

        return {c.name: c.label for c in load_vocab(groups=GROUPS)}
    except Exception as err:  # a broken vocabulary file must not break the page
        st.caption(f"Concept vocabulary unavailable ({markup.escape_md(str(err))}); showing concept names.")
        return {}


def show_wound_concepts(ws: Workspace, cdata: dict, run_id: int, query: str, w: dict, row: int,
                        labels: dict[str, str]) -> None:
    """One wound's top-concepts table and the heatmap of a concept over its crop."""
    import pandas as pd  # here: the map, drawn first, needs no pandas

    from core.concepts.scores import heatmap_overlay, top_concepts

    names = [str(n) for n in cdata["concept_names"]]
    st.markdown(f"**{markup.escape_md(query)} · wound {int(w['wound_index'])}**")
    t_col, h_col = st.columns([3, 2], gap="large")
    top = top_concepts(cdata, row, k=5)
    t_col.dataframe(pd.DataFrame(concept_table(top, labels)), hide_index=True, width="stretch")
    if cdata["concept_heatmaps"] is not None and cdata["crop_boxes"] is not None:
        pick = h_col.selectbox("Heatmap of", names, index=names.index(top[0]["concept"]) if top else 0,
                               format_func=lambda n: labels.get(n, n),
                               key=f"explore_concept_{run_id}_{query}_{w['wound_index']}")
        overlay = heatmap_overlay(ws.load_image(query), cdata["concept_heatmaps"][row][names.index(pick)],
                                  cdata["crop_boxes"][row])
        overlay.thumbnail((360, 360))
        h_col.image(overlay, width="stretch",
                    caption=f"{markup.escape_md(query)} · wound {int(w['wound_index'])} · {markup.escape_md(labels.get(pick, pick))}"
                            + (" · SYNTHETIC" if ws.is_synthetic else ""))


def show_concepts(ws: Workspace, query: str) -> None:
    """Per wound of ``query``: its top concepts and a concept heatmap from a chosen concepts run."""
    st.subheader("Wound concepts")
    concept_runs = [r for r in ws.store.runs(kind=CONCEPTS)
                    if r["status"] == "done" and (r.get("artifacts") or {}).get("embeddings")]
    if not concept_runs:
        st.caption("No concepts run yet. Create one with `python -m core.train_concepts --objective make` "
                   "(zero-shot concept scores and heatmaps per wound).")
        return
    from core.concepts.scores import wound_row

    labels = concept_labels()
    c_label = {r["id"]: f"run {r['id']} · {r['config'].get('objective', '?')}"
               + (f" · {r['name']}" if r.get("name") else "") for r in concept_runs}
    run_id = st.selectbox("Concepts run", list(c_label), format_func=c_label.get, key="explore_concepts_run")
    c_run = ws.store.run(run_id)
    cdata = concept_run_data(str(ws.root), run_id, str(c_run.get("finished") or c_run["created"]))
    if cdata["concept_names"] is None or cdata["concept_fused"] is None or cdata["wound_keys"] is None:
        st.caption("This run stored no concept scores.")
        return
    st.caption("Zero-shot concept scores P(present) per wound (fused = mean of the global and the top-k "
               "patch scores) and each concept's patch heatmap over the wound crop the model saw "
               "(red = evidence for the concept, blue = against)"
               + (" — **synthetic data**." if ws.is_synthetic else "."))
    shown = 0
    for w in ws.store.wounds(query):
        row = wound_row(cdata, query, w["wound_index"])
        if row is not None:
            shown += 1
            show_wound_concepts(ws, cdata, run_id, query, w, row, labels)
    if not shown:
        st.caption("No wound of this photo is in the concepts run (only described wounds are scored).")


def main(ws: Workspace) -> None:
    """The Explore page: run controls, the map, retrieval, then (a vision run) attention, and concepts of the
    query photo."""
    columns = st.columns([2, 3, 2, 2, 2])  # one row of controls: the map stays above the fold
    run_ids, method = choose_runs(ws, columns)
    run = ws.store.run(run_ids[0])
    stamp = (str(run.get("finished") or run["created"]), embeddings_stamp(ws, run_ids))
    photos, query = draw_map(ws, columns, run_ids, method, run, stamp, stale_note(run, ws.store.last_outline_edit()))
    show_retrieval(ws, photos, query, fused=len(run_ids) > 1)
    if len(run_ids) == 1 and run["config"].get("modality") == "vision":
        show_attention(ws, run, photos, query)
    show_concepts(ws, query)
