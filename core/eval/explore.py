"""The Explore page's data, sized for 10,000 points: each map's input, its 2-d layout and retrieval.

- **Map input** (:func:`map_input`): one run's photo or wound embedding (Euclidean vectors), or
  an n×n distance matrix (a run that stored one, or two runs fused), with a content hash.
- **UMAP once per embedding**: :func:`compute_umap` computes a map's UMAP and stores it beside the
  first run's embeddings (``runs/<id>/umap-<level>-<method>-<runs>-<neighbours>-<min dist>-<hash>.npy``,
  atomic write; that map's files of older embeddings are removed); umap-learn's numba functions are compiled
  once per machine, not once per process (:func:`cache_umap_compilation`). :func:`stored_umap` reads it
  back and never imports umap or numba; a changed embedding has another hash, so its old UMAP is
  never shown. :func:`quick_layout` is the instant classical-MDS layout shown until it is stored.
- **Retrieval** (:func:`retrieval`): above :data:`LARGE` photos of a run with an embedding, an
  :class:`~core.eval.retrieval.EmbeddingIndex` (no n×n matrix); else the distance matrix.
- **The page's tables and text** (:func:`run_choices`, :func:`stale_note`, :func:`colour_value`,
  :func:`stored_token_maps`, :func:`map_overlay`, :func:`concept_table`): plain functions the page draws.
"""
from __future__ import annotations

import functools
import hashlib
import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from annotations.store import runs
from annotations.infra.fileio import atomic_write
from annotations.infra.workspace import Workspace
from core.eval.distances import image_distances
from core.eval.fusion import minmax_normalise
from core.eval.retrieval import EmbeddingIndex, neighbours, run_distances
from core.runtime import load_embeddings

__all__ = ["LARGE", "DistanceRetrieval", "MapInput", "TokenMaps", "attention_maps", "cluster_labels", "colour_options",
           "colour_value", "compute_umap", "concept_table", "embeddings_stamp", "has_wound_embedding", "map_input",
           "map_overlay", "quick_layout", "retrieval", "run_choices", "scatter_spec", "stale_note",
           "store_default_umaps", "stored_token_maps", "stored_umap", "umap_path"]

LARGE = 2000  # points above which no n×n matrix is built for a run with an embedding
UMAP_NEIGHBOURS, UMAP_MIN_DIST = 15, 0.1  # the page's default UMAP setting, stored by the job that made a run
SMALL_MAP = 200  # points up to which markers are large and outlined


@dataclass(frozen=True)
class MapInput:
    """What one map is drawn from: ``vectors`` (n×d, Euclidean) or ``distances`` (n×n)."""

    run_ids: tuple[int, ...]
    level: str  # "photos" or "wounds"
    method: str  # fusion method ("uncertainty" for one run)
    points: list[str]  # label of each point ("P0001", or "P0001 #2" for a wound)
    images: list[str]  # photo of each point
    vectors: np.ndarray | None
    distances: np.ndarray | None
    digest: str  # sha256 of the points and their vectors / distances

    def __len__(self) -> int:
        return len(self.points)


def _embeddings_file(ws: Workspace, run_id: int) -> Path:
    run = ws.store.run(run_id)
    if run is None or not (run.get("artifacts") or {}).get("embeddings"):
        raise KeyError(f"run {run_id} has no embeddings in {ws.root}")
    return ws.root / run["artifacts"]["embeddings"]


def embeddings_stamp(ws: Workspace, run_ids: Sequence[int]) -> tuple[tuple[int, int], ...]:
    """(modification time ns, size) of each run's ``embeddings.npz``: a cache key that changes when
    a run's embedding is rewritten."""
    return tuple((st.st_mtime_ns, st.st_size) for st in (_embeddings_file(ws, r).stat() for r in run_ids))


def has_wound_embedding(ws: Workspace, run_id: int) -> bool:
    """Whether the run stored wound embeddings (reads the archive's directory only)."""
    with np.load(_embeddings_file(ws, run_id), allow_pickle=False) as data:
        return "wound_emb" in data.files


#: the token arrays a run's attention maps are drawn from, beside its wound keys (:func:`attention_maps`)
TOKEN_ARRAYS = ("token_wound", "token_pos", "token_weight", "grid")


def has_attention(ws: Workspace, run_id: int) -> bool:
    """Whether the run stored wounds and their tokens' attention weights (reads the archive's directory only)."""
    with np.load(_embeddings_file(ws, run_id), allow_pickle=False) as data:
        return all(k in data.files for k in ("wound_image_ids", *TOKEN_ARRAYS))


def _digest(points: Sequence[str], array: np.ndarray) -> str:
    h = hashlib.sha256("\n".join(points).encode())
    h.update(str(array.shape).encode())
    h.update(np.ascontiguousarray(array, dtype=np.float64).tobytes())
    return h.hexdigest()


def map_input(ws: Workspace, run_ids: Sequence[int], level: str = "photos", method: str = "uncertainty") -> MapInput:
    """The input of the map of one run (``level`` photos or wounds) or of two runs fused with ``method``."""
    run_ids = tuple(int(r) for r in run_ids)
    if level not in ("photos", "wounds"):
        raise ValueError(f"level must be photos or wounds, got {level!r}")
    vectors = distances = None
    if len(run_ids) > 1:
        if level != "wounds":
            points, distances = run_distances(ws, run_ids, method=method)
            images = list(points)
        else:
            raise ValueError("fused runs are mapped by photo only")
    else:
        method = "uncertainty"
        emb = load_embeddings(ws, run_ids[0])
        if level == "wounds":
            if emb["wound_keys"] is None:
                raise KeyError(f"run {run_ids[0]} stored no wound embeddings")
            points = [f"{i} #{w}" for i, w in emb["wound_keys"]]
            images = [i for i, _ in emb["wound_keys"]]
            vectors = np.asarray(emb["wound_emb"], dtype=np.float64)
        elif emb["distance"] is None:
            points, images = list(emb["image_ids"]), list(emb["image_ids"])
            vectors = np.asarray(emb["image_emb"], dtype=np.float64)
        else:
            points, distances = image_distances(emb)
            points, images, distances = list(points), list(points), minmax_normalise(distances)
    matrix = vectors if vectors is not None else distances
    assert matrix is not None  # each branch above sets the vectors or the distances
    digest = _digest(points, matrix)
    return MapInput(run_ids, level, method, points, images, vectors, distances, digest)


def umap_path(ws: Workspace, m: MapInput, n_neighbors: int, min_dist: float) -> Path:
    """Where the UMAP of map ``m`` with these settings is stored: beside the first run's embeddings."""
    return ws.run_dir(m.run_ids[0]) / f"{_umap_prefix(m, n_neighbors, min_dist)}{m.digest[:16]}.npy"


def _umap_prefix(m: MapInput, n_neighbors: int, min_dist: float) -> str:
    return f"umap-{m.level}-{m.method}-{'-'.join(map(str, m.run_ids))}-{int(n_neighbors)}-{min_dist:.2f}-"


def stored_umap(ws: Workspace, m: MapInput, n_neighbors: int, min_dist: float) -> np.ndarray | None:
    """The stored n×2 UMAP of map ``m`` (this embedding, these settings), or None when not computed."""
    path = umap_path(ws, m, n_neighbors, min_dist)
    if not path.exists():
        return None
    xy = np.load(path, allow_pickle=False)
    return xy if xy.shape == (len(m), 2) else None


#: the modules of umap-learn whose numba functions a 2-d UMAP compiles
UMAP_JIT_MODULES = ("umap.umap_", "umap.layouts", "umap.utils", "umap.spectral", "umap.distances", "umap.sparse")


@functools.cache
def cache_umap_compilation() -> None:
    """Have numba keep umap-learn's compiled functions on disk, as ``@njit(cache=True)`` would: umap-learn
    does not ask for it, so every process compiled them again (about 20 s on 2 cores, for a map of 53
    photos that then takes 0.1 s). numba's own ``Dispatcher.enable_caching``, before the first call; the
    cache sits in the package's ``__pycache__`` (or numba's user cache) and is keyed on the source file, so
    an upgraded umap-learn compiles afresh. Once per process."""
    from numba.core.dispatcher import Dispatcher

    for name in UMAP_JIT_MODULES:
        for value in vars(importlib.import_module(name)).values():
            if isinstance(value, Dispatcher):
                value.enable_caching()


def compute_umap(ws: Workspace, m: MapInput, n_neighbors: int, min_dist: float, seed: int = 0) -> np.ndarray:
    """Compute the 2-d UMAP of map ``m`` (vectors: Euclidean; else the precomputed distances), store
    it at :func:`umap_path` and remove this map's UMAPs of other embeddings. The machine's first UMAP
    compiles numba (about 20 s; :func:`cache_umap_compilation` keeps it for the next processes)."""
    n = len(m)
    if n < 4:
        xy = np.c_[np.arange(n, dtype=float), np.zeros(n)]
    else:
        import umap

        cache_umap_compilation()
        data = m.vectors if m.vectors is not None else np.asarray(m.distances, dtype=np.float64)
        reducer = umap.UMAP(n_neighbors=max(2, min(int(n_neighbors), n - 1)), min_dist=min_dist,
                            metric="euclidean" if m.vectors is not None else "precomputed",
                            init="random", random_state=seed, n_components=2, n_jobs=1)
        xy = reducer.fit_transform(data)
    xy = np.asarray(xy, dtype=np.float32)
    path = umap_path(ws, m, n_neighbors, min_dist)
    with atomic_write(path, "wb", suffix=".npy") as fh:
        np.save(fh, xy)
    for old in path.parent.glob(f"{_umap_prefix(m, n_neighbors, min_dist)}*.npy"):
        if old != path:
            old.unlink(missing_ok=True)
    return xy


def store_default_umaps(ws: Workspace, run_id: int) -> list[Path]:
    """Compute and store the UMAP of run ``run_id``'s photo map (and wound map, when it stored wound embeddings) at
    the page's default setting, as the job that made the run does: the page then opens on it, computing nothing.
    Returns the files."""
    levels = ["photos", *(["wounds"] if has_wound_embedding(ws, run_id) else [])]
    out = []
    for level in levels:
        m = map_input(ws, [run_id], level)
        compute_umap(ws, m, UMAP_NEIGHBOURS, UMAP_MIN_DIST)
        out.append(umap_path(ws, m, UMAP_NEIGHBOURS, UMAP_MIN_DIST))
    return out


def quick_layout(m: MapInput) -> np.ndarray:
    """Instant 2-d classical (Torgerson) MDS of map ``m``: for vectors the same as their top-2 PCA
    (a d×d eigenproblem); for a distance matrix the top-2 eigenvectors of its double-centred square."""
    n = len(m)
    if n < 3:
        return np.c_[np.arange(n, dtype=float), np.zeros(n)]
    if m.vectors is not None:
        X = m.vectors - m.vectors.mean(axis=0)
        values, vectors = np.linalg.eigh(X.T @ X)
        top = np.argsort(values)[::-1][:2]
        xy = X @ vectors[:, top]
    else:
        D2 = np.asarray(m.distances, dtype=np.float64) ** 2
        B = -0.5 * (D2 - D2.mean(axis=0) - D2.mean(axis=1)[:, None] + D2.mean())
        if n > LARGE:
            from scipy.sparse.linalg import eigsh

            values, vectors = eigsh(B, k=2, which="LA")
        else:
            values, vectors = np.linalg.eigh(B)
        top = np.argsort(values)[::-1][:2]
        xy = vectors[:, top] * np.sqrt(np.maximum(values[top], 0.0))
    return np.c_[xy, np.zeros((n, 2 - xy.shape[1]))] if xy.shape[1] < 2 else xy


def cluster_labels(m: MapInput, k: int) -> np.ndarray:
    """``k`` clusters of the points: average-linkage agglomerative clustering (on the distances, or
    Euclidean on the vectors), k-means on the vectors above :data:`LARGE` points."""
    from sklearn.cluster import AgglomerativeClustering, KMeans

    k = max(1, min(int(k), len(m)))
    if m.vectors is not None and len(m) > LARGE:
        return KMeans(n_clusters=k, n_init=3, random_state=0).fit_predict(m.vectors)
    if m.vectors is not None:
        return AgglomerativeClustering(n_clusters=k, linkage="average").fit_predict(m.vectors)
    return AgglomerativeClustering(n_clusters=k, metric="precomputed", linkage="average").fit_predict(m.distances)


@dataclass(frozen=True)
class DistanceRetrieval:
    """:func:`~core.eval.retrieval.neighbours` over an n×n distance matrix, with the same interface
    as :class:`~core.eval.retrieval.EmbeddingIndex`."""

    ids: list[str]
    D: np.ndarray

    def neighbours(self, image_id: str, k: int = 5) -> dict[str, list[tuple[str, float]]]:
        """The ``k`` nearest photos of ``image_id`` in this space, with their distances."""
        return neighbours(self.ids, self.D, image_id, k=k)


def retrieval(ws: Workspace, run_ids: Sequence[int], method: str = "uncertainty",
              large: int = LARGE) -> EmbeddingIndex | DistanceRetrieval:
    """Photo retrieval under min-max normalised distances of one run or two fused runs: an
    :class:`~core.eval.retrieval.EmbeddingIndex` for one run with an image embedding of more than
    ``large`` photos, else the distance matrix."""
    if len(run_ids) == 1:
        emb = load_embeddings(ws, int(run_ids[0]))
        if emb["distance"] is None and len(emb["image_ids"]) > large:
            return EmbeddingIndex(emb["image_ids"], emb["image_emb"])
    ids, D = run_distances(ws, [int(r) for r in run_ids], method=method)
    return DistanceRetrieval(list(ids), D)


#: Marker shapes of the map's groups, in turn (Vega-Lite's filled shapes, then a star and a hexagon as SVG paths).
SYMBOLS = ("circle", "square", "diamond", "triangle-up", "cross", "triangle-down", "triangle-right", "triangle-left",
           "M0,-1L0.24,-0.31L0.95,-0.31L0.38,0.12L0.59,0.81L0,0.38L-0.59,0.81L-0.38,0.12L-0.95,-0.31L-0.24,-0.31Z",
           "M0,-1L0.87,-0.5L0.87,0.5L0,1L-0.87,0.5L-0.87,-0.5Z")
MAP_HEIGHT = 450  # the map's height (px)
LEGEND_ROWS = 16  # legend entries that fit the map's height in one column; more go in two
#: the selection parameter of a click on a point: its value names the clicked point's ``row`` in ``xy``
PICK = "pick"
#: the position encoding of the layers drawn over the points (they share the points' scales)
POSITION = {"x": {"field": "x", "type": "quantitative"}, "y": {"field": "y", "type": "quantitative"}}


def scatter_spec(xy: np.ndarray, labels: Sequence[str], groups: Sequence[str], colours: dict[str, str],
                 colour_by: str, title: str, subtitle: str = "") -> dict:
    """The map as a Vega-Lite spec: one point per row of ``xy`` (its ``label`` on hover, its ``row`` the value of
    a click, the :data:`PICK` selection), coloured by its group in ``colours``' order and shaped by it too
    (:data:`SYMBOLS` in turn, so that groups of similar colours stay apart); a click on a legend entry fades the
    other groups, the wheel zooms and a drag pans. Text from data is drawn as text (Vega-Lite reads no HTML);
    ``subtitle`` (e.g. "SYNTHETIC") is drawn in red under the title. Layers added later
    (:func:`add_track_path`, :func:`thumbnail_layer`) go on top of the points."""
    small = len(xy) <= SMALL_MAP
    domain = list(colours)
    points = [{"x": float(x), "y": float(y), "row": n, "label": str(label), "group": str(group)}
              for n, ((x, y), label, group) in enumerate(zip(xy, labels, groups))]
    axis = {"field": "x", "type": "quantitative", "axis": None,
            "scale": {"zero": False, "nice": False, "padding": 16}}  # padding: a point at the edge is drawn whole
    return {
        "title": {"text": title, "subtitle": subtitle, "subtitleColor": "#b00", "anchor": "start"},
        "height": MAP_HEIGHT,
        "data": {"values": points},
        "layer": [{
            "mark": {"type": "point", "filled": True, "size": 110 if small else 30, "opacity": 1,
                     "stroke": "white", "strokeWidth": 1 if small else 0, "cursor": "pointer"},
            "params": [{"name": PICK, "select": {"type": "point", "fields": ["row"], "on": "click"}},
                       {"name": "legend", "select": {"type": "point", "fields": ["group"]}, "bind": "legend"},
                       {"name": "zoom", "select": "interval", "bind": "scales"}],
            "encoding": {
                "x": axis, "y": {**axis, "field": "y"},
                "color": {"field": "group", "type": "nominal", "title": colour_by,
                          "legend": {"columns": 1 if len(domain) <= LEGEND_ROWS else 2},
                          "scale": {"domain": domain, "range": [colours[g] for g in domain]}},
                "shape": {"field": "group", "type": "nominal", "title": colour_by,
                          "scale": {"domain": domain, "range": [SYMBOLS[n % len(SYMBOLS)] for n in range(len(domain))]}},
                "opacity": {"condition": {"param": "legend", "value": 1}, "value": 0.1},
                "tooltip": [{"field": "label", "title": "point"}, {"field": "group", "title": colour_by}]}}],
        "config": {"view": {"stroke": None}, "legend": {"symbolLimit": 0, "symbolStrokeWidth": 0, "symbolSize": 120}}}


def track_rows(m: MapInput, visits: Sequence[tuple[str, int, str]]) -> list[int]:
    """The map's rows of a wound track's visits, in visit order: each wound's point on a wound map, its
    photo's point on a photo map; visits not on the map are left out (one row per photo at most)."""
    index = {label: n for n, label in enumerate(m.points)}
    rows: list[int] = []
    for image_id, wound_index, _ in visits:
        row = index.get(f"{image_id} #{wound_index}" if m.level == "wounds" else image_id)
        if row is not None and row not in rows:
            rows.append(row)
    return rows


def add_track_path(spec: dict, xy: np.ndarray, rows: Sequence[int], name: str, dates: Sequence[str]) -> None:
    """Draw a track's path on the map ``spec``: its points joined in visit order, each ringed and numbered, its
    visit and date on hover."""
    steps = [{"x": float(xy[r, 0]), "y": float(xy[r, 1]), "visit": n + 1, "date": d or "no date", "track": name}
             for n, (r, d) in enumerate(zip(rows, dates))]
    position = {**POSITION, "order": {"field": "visit", "type": "ordinal"}}
    tooltip = [{"field": "track"}, {"field": "visit"}, {"field": "date"}]
    spec["layer"] += [
        {"data": {"values": steps}, "mark": {"type": "line", "color": "#111", "strokeWidth": 2,
                                             "point": {"filled": False, "size": 200, "color": "#111"}},
         "encoding": {**position, "tooltip": tooltip}},
        {"data": {"values": steps}, "mark": {"type": "text", "dy": -14, "fontWeight": "bold", "color": "#111"},
         "encoding": {**position, "text": {"field": "visit", "type": "quantitative"}}}]


def thumbnail_layer(xy: np.ndarray, sources: Sequence[str], side: int) -> dict:
    """A layer drawing each photo's thumbnail (``sources``: image URLs or data URIs) ``side`` px wide at its
    point of ``xy``."""
    return {"data": {"values": [{"x": float(x), "y": float(y), "src": src} for (x, y), src in zip(xy, sources)]},
            "mark": {"type": "image", "width": side, "height": side},
            "encoding": {**POSITION, "url": {"field": "src", "type": "nominal"}}}


# ------------------------------------------------------------------ the page's tables and text (no Streamlit)
def run_choices(runs: Sequence[dict]) -> dict[int, str]:
    """Run id → its label for the run picker, with its stored strict agreement and, beside it, its stored same-type
    retrieval figure when it has one: trained runs before untrained baselines
    (:data:`~core.eval.verdict.UNTRAINED_KINDS`), vision before other modalities, then newest first — the
    page opens on the first, the newest trained vision run."""
    from core.eval.report import retrieval_figure, run_figure
    from core.eval.verdict import UNTRAINED_KINDS

    ordered = sorted(runs, key=lambda r: (r["kind"] in UNTRAINED_KINDS, r["config"].get("modality") != "vision",
                                          -r["id"]))
    return {r["id"]: f"run {r['id']} · {r['kind']} · {r['config'].get('modality')}"
            + (f" · {r['name']}" if r.get("name") else "") + run_figure(r) + retrieval_figure(r) for r in ordered}


def stale_note(run: dict, last_outline_edit: str | None) -> str | None:
    """The warning for a run made before the wounds' outlines last changed (``None`` when it is current)."""
    if not last_outline_edit or last_outline_edit <= str(run["created"]):
        return None
    return (f"This run is out of date: wounds were added, edited or deleted after it was made (last change "
            f"{last_outline_edit[:16].replace('T', ' ')} UTC, run {run['id']} from "
            f"{str(run['created'])[:16].replace('T', ' ')} UTC). Its map and attention show the wounds as they "
            "were; train a new run on the Train page.")


def colour_options(images: dict[str, dict], patients: dict[str, dict]) -> list[str]:
    """What the map can be coloured by: patient, cluster, each photo metadata field, each patient field."""
    return ["patient", "cluster"] + sorted({k for im in images.values() for k in (im["metadata"] or {})}
                                           | {f"patient {k}" for meta in patients.values() for k in meta})


def colour_value(image: dict, patients: dict[str, dict], colour_by: str, cluster: int | None = None) -> str:
    """A photo's group under ``colour_by`` (one of :func:`colour_options`); ``cluster`` its 0-based cluster."""
    if colour_by == "patient":
        return str(image.get("patient_id") or "unknown")
    if colour_by == "cluster":
        if cluster is None:
            raise ValueError("colour_by='cluster' needs the photo's cluster")
        return f"cluster {cluster + 1}"
    if colour_by.startswith("patient "):
        pid = image.get("patient_id")
        return str((patients.get(pid, {}) if pid is not None else {}).get(colour_by[8:], "unknown"))
    return str((image.get("metadata") or {}).get(colour_by, "unknown"))


#: a run's token maps (:mod:`core.vision.token_maps` writes them), in its folder; the run's artifacts name it
TOKEN_MAPS_ARTIFACT = "token_maps"


@dataclass(frozen=True)
class TokenMaps:
    """A run's token map per photo: ``maps[n]`` (H×W, summing to 1; all zero without a wound token) is where
    photo ``image_ids[n]``'s embedding comes from; ``kind`` ``contribution`` (fine-tune) or ``attention``."""

    image_ids: list[str]
    maps: np.ndarray
    kind: str

    def of(self, image_id: str) -> np.ndarray | None:
        """Photo ``image_id``'s map, or None when the run has none for it."""
        try:
            return self.maps[self.image_ids.index(image_id)]
        except ValueError:
            return None


def attention_maps(emb: dict) -> np.ndarray:
    """N×H×W maps of a run's stored token attention (``emb``: its :func:`~core.runtime.load_embeddings`, with
    :data:`TOKEN_ARRAYS`): per photo of ``image_ids`` the mean over its wounds of their tokens' weights, summing
    to 1 (all zero for a photo without a token)."""
    gh, gw = (int(v) for v in emb["grid"])
    row_of = {i: n for n, i in enumerate(emb["image_ids"])}
    maps = np.zeros((len(row_of), gh, gw), dtype=np.float64)
    wound_image = np.array([row_of.get(i, -1) for i, _ in emb["wound_keys"]], dtype=int)
    photo = wound_image[np.asarray(emb["token_wound"], dtype=int)]
    keep = photo >= 0
    pos = np.asarray(emb["token_pos"], dtype=int)[keep]
    np.add.at(maps, (photo[keep], pos[:, 0], pos[:, 1]), np.asarray(emb["token_weight"], dtype=np.float64)[keep])
    total = maps.sum(axis=(1, 2), keepdims=True)
    return np.divide(maps, total, out=np.zeros_like(maps), where=total > 0).astype(np.float32)


def stored_token_maps(ws: Workspace, run: dict) -> TokenMaps | None:
    """The token maps the job that made ``run`` stored (:data:`TOKEN_MAPS_ARTIFACT`), else those its embeddings'
    token attention gives (numpy only, no model), else None: nothing is computed with a model here."""
    rel = (run.get("artifacts") or {}).get(TOKEN_MAPS_ARTIFACT)
    if rel and (ws.root / rel).is_file():
        with np.load(ws.root / rel, allow_pickle=False) as data:
            return TokenMaps([str(i) for i in data["image_ids"]], data["maps"], str(data["kind"]))
    if not has_attention(ws, run["id"]):
        return None
    emb = load_embeddings(ws, run["id"])
    return TokenMaps(list(emb["image_ids"]), attention_maps(emb), "attention")


def map_overlay(heat: np.ndarray, photo: Image.Image, opacity: float, lut: np.ndarray) -> Image.Image:
    """A token map ``heat`` (H×W) over ``photo``: its positive part (normalised to its maximum) coloured by ``lut``
    (256×3 uint8) at ``opacity`` where it exceeds 2 % of the maximum, the photo unchanged elsewhere."""
    heat = np.clip(np.asarray(heat, dtype=np.float32), 0, None)
    if heat.max() > 0:
        heat = heat / heat.max()
    big = np.asarray(Image.fromarray((heat * 255).astype(np.uint8)).resize(photo.size, Image.Resampling.BILINEAR),
                     dtype=np.float32) / 255.0
    base = np.asarray(photo.convert("RGB"), dtype=np.float32)
    colour = lut[(big * 255).astype(np.uint8)].astype(np.float32)
    cover = opacity * (big > 0.02)[..., None]  # the photo stays visible outside the map
    return Image.fromarray((base * (1 - cover) + colour * cover).clip(0, 255).astype(np.uint8))


def no_attention_reason(run: dict) -> str:
    """Why vision run ``run`` has no token maps to show, in words (from its kind and pooling); a fine-tune or
    TriDerm-V run without them predates their storing (the page says how to make them)."""
    kind, cfg = run["kind"], run["config"]
    if kind == runs.VISION_BASELINE:
        return ("This run is the frozen baseline: it learns no attention, every token of a wound counts the same "
                "(mean pooling), so there is no map of where its embedding comes from to show; a trained run (Train page) "
                "stores one.")
    if kind == runs.VISION_FINETUNE:
        return (f"This fine-tune run has no attention head: its map is each token's share of the photo's embedding, "
                f"which the training job stores; this run predates that (make it: python -m core.token_maps {run.get('id', 'RUN')}).")
    if cfg.get("pooling") == "mean":
        return "This run pools each wound's tokens by their mean (pooling mean): it learns no attention to show."
    if kind == runs.VISION_MODEL:
        return "This run embeds the photos with a shared model, which keeps no attention weights to show."
    return "This run stored no attention weights, so there is no attention map to show."


def thumbnail_size(n_points: int) -> int:
    """A map thumbnail's side in px: larger when there are few points (about a ninth of the map's height, 50 px,
    for 50 points), at most a fifth of it; it keeps its size as the map zooms."""
    return round(MAP_HEIGHT * min(0.2, 0.8 / max(n_points, 1) ** 0.5))


def concept_table(top: Sequence[dict], labels: dict[str, str]) -> list[dict]:
    """Rows of a wound's top-concepts table: the concept's label and its fused, global and local scores."""
    return [{"concept": labels.get(t["concept"], t["concept"]), "fused": round(t["fused"], 3),
             "global": round(t["global"], 3), "local": round(t["local"], 3)} for t in top]
