"""The Explore page's data (core.eval.explore): UMAP stored once per embedding, retrieval without an
n×n matrix, and the page drawing a stored UMAP."""
from __future__ import annotations

import json
import sys
import types
from typing import ClassVar

import numpy as np
import pytest

from annotations.infra.workspace import Workspace
from core.eval.distances import pairwise_euclidean
from core.eval import explore
from core.eval.explore import (
    UMAP_JIT_MODULES,
    DistanceRetrieval,
    MapInput,
    add_track_path,
    cache_umap_compilation,
    cluster_labels,
    compute_umap,
    map_input,
    quick_layout,
    retrieval,
    stored_umap,
    track_rows,
    umap_path,
)
from core.eval.fusion import minmax_normalise
from core.eval.retrieval import EmbeddingIndex, max_distance, neighbours
from core.runtime import save_embeddings


class RecordingUMAP:
    """Stand-in for ``umap.UMAP`` (no numba compile): records each fit, returns the first two columns."""

    fits: ClassVar[list[dict]] = []

    def __init__(self, **kwargs) -> None:
        self.kwargs = kwargs

    def fit_transform(self, data: np.ndarray) -> np.ndarray:
        RecordingUMAP.fits.append(self.kwargs)
        return np.asarray(data, dtype=np.float64)[:, :2] + 1.0


class FailingUMAP:
    def __init__(self, **kwargs) -> None:
        raise AssertionError("umap was called although the map's UMAP is stored")


@pytest.fixture
def fake_umap(monkeypatch):
    RecordingUMAP.fits = []
    monkeypatch.setitem(sys.modules, "umap", types.SimpleNamespace(UMAP=RecordingUMAP))
    monkeypatch.setattr(explore, "cache_umap_compilation", lambda: None)  # the fake has no numba functions
    return RecordingUMAP


def test_umap_compilation_is_kept_on_disk():
    """Every numba function of the umap-learn modules a map compiles gets a disk cache (numba's cache path set),
    as @njit(cache=True) gives; without it each process compiled them again (about 20 s)."""
    import importlib

    from numba.core.dispatcher import Dispatcher

    cache_umap_compilation()
    jitted = [v for name in UMAP_JIT_MODULES for v in vars(importlib.import_module(name)).values()
              if isinstance(v, Dispatcher)]
    assert len(jitted) > 50  # smooth_knn_dist, the layout's epochs, the distances, …
    assert all(f.stats.cache_path is not None for f in jitted)


def _run(ws: Workspace, emb: np.ndarray, wounds: bool = False) -> int:
    ids = [f"P{i:03d}" for i in range(len(emb))]
    run_id = ws.store.start_run("vision-test", {"modality": "vision"})
    extra = {"wound_keys": [(i, 1) for i in ids], "wound_emb": emb * 2} if wounds else {}
    save_embeddings(ws, run_id, ids, image_emb=emb, **extra)
    ws.store.finish_run(run_id)
    return run_id


def test_umap_stored_once_and_reused_without_umap(tmp_path, fake_umap, monkeypatch):
    ws = Workspace(tmp_path / "ws")
    run_id = _run(ws, np.random.default_rng(0).normal(size=(30, 5)), wounds=True)
    m = map_input(ws, [run_id], "wounds")
    assert m.points[0] == "P000 #1" and m.images[0] == "P000" and m.vectors.shape == (30, 5)
    assert stored_umap(ws, m, 15, 0.1) is None
    xy = compute_umap(ws, m, 15, 0.1)
    assert len(fake_umap.fits) == 1 and fake_umap.fits[0]["metric"] == "euclidean"
    assert umap_path(ws, m, 15, 0.1).parent == ws.run_dir(run_id)

    monkeypatch.setitem(sys.modules, "umap", types.SimpleNamespace(UMAP=FailingUMAP))
    again = map_input(ws, [run_id], "wounds")  # a later load: same embedding, same hash
    assert again.digest == m.digest
    np.testing.assert_array_equal(stored_umap(ws, again, 15, 0.1), xy)
    assert stored_umap(ws, again, 10, 0.1) is None  # another setting is another map
    assert stored_umap(ws, map_input(ws, [run_id], "photos"), 15, 0.1) is None  # and another level


def test_umap_invalidated_when_the_embedding_changes(tmp_path, fake_umap):
    ws = Workspace(tmp_path / "ws")
    rng = np.random.default_rng(1)
    run_id = _run(ws, rng.normal(size=(20, 4)))
    old = map_input(ws, [run_id])
    compute_umap(ws, old, 15, 0.1)
    save_embeddings(ws, run_id, old.points, image_emb=rng.normal(size=(20, 4)))  # the run's embedding rewritten
    new = map_input(ws, [run_id])
    assert new.digest != old.digest
    assert stored_umap(ws, new, 15, 0.1) is None  # the old UMAP is never shown for the new embedding
    compute_umap(ws, new, 15, 0.1)
    assert stored_umap(ws, new, 15, 0.1) is not None
    assert not umap_path(ws, old, 15, 0.1).exists()  # the stale file is removed
    assert len(list(ws.run_dir(run_id).glob("umap-*.npy"))) == 1


def test_stored_umap_of_another_size_is_ignored(tmp_path, fake_umap):
    ws = Workspace(tmp_path / "ws")
    m = map_input(ws, [_run(ws, np.random.default_rng(2).normal(size=(12, 3)))])
    np.save(umap_path(ws, m, 15, 0.1), np.zeros((11, 2)))
    assert stored_umap(ws, m, 15, 0.1) is None


def test_index_retrieval_equals_full_matrix():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(80, 6))
    ids = [f"img{i}" for i in range(80)]
    D = minmax_normalise(pairwise_euclidean(X))
    index = EmbeddingIndex(ids, X)
    assert index.scale == pytest.approx(pairwise_euclidean(X).max(), rel=0, abs=0)
    for query in ("img0", "img17", "img79"):
        for k in (1, 5, 79):
            got, want = index.neighbours(query, k), neighbours(ids, D, query, k)
            for key in ("similar", "dissimilar"):
                assert [i for i, _ in got[key]] == [i for i, _ in want[key]]
                np.testing.assert_allclose([d for _, d in got[key]], [d for _, d in want[key]], rtol=1e-12)
    with pytest.raises(KeyError, match="nope"):
        index.neighbours("nope")
    with pytest.raises(ValueError, match="k must be"):
        index.neighbours("img0", 0)


def test_max_distance_in_blocks_is_exact():
    X = np.random.default_rng(4).normal(size=(50, 3))
    assert max_distance(X, block_bytes=8 * 50 * 3) == pairwise_euclidean(X).max()  # 3 rows per block
    assert max_distance(np.zeros((0, 3))) == 0.0


def test_retrieval_uses_the_index_above_the_threshold(tmp_path):
    ws = Workspace(tmp_path / "ws")
    X = np.random.default_rng(5).normal(size=(40, 4))
    run_id = _run(ws, X)
    small, large = retrieval(ws, [run_id]), retrieval(ws, [run_id], large=30)
    assert isinstance(small, DistanceRetrieval) and isinstance(large, EmbeddingIndex)
    assert small.ids == large.ids
    for query in small.ids[:5]:
        assert [i for i, _ in small.neighbours(query, 4)["similar"]] == [i for i, _ in large.neighbours(query, 4)["similar"]]


def test_quick_layout_vectors_and_distances_agree():
    X = np.random.default_rng(6).normal(size=(25, 5))
    ids = [str(i) for i in range(25)]
    on_vectors = MapInput((1,), "photos", "uncertainty", ids, ids, X, None, "")
    on_distances = MapInput((1,), "photos", "uncertainty", ids, ids, None, pairwise_euclidean(X), "")
    a, b = quick_layout(on_vectors), quick_layout(on_distances)
    np.testing.assert_allclose(np.abs(a), np.abs(b), atol=1e-8)  # classical MDS = PCA, up to each axis's sign
    assert sorted(set(cluster_labels(on_vectors, 3))) == [0, 1, 2]
    np.testing.assert_array_equal(cluster_labels(on_vectors, 3), cluster_labels(on_distances, 3))


def test_explore_page_draws_the_stored_umap(demo_workspace, monkeypatch, tmp_path, fake_umap):
    from app import jobs
    from tests.integration.test_app_pages import add_test_embedding, app

    monkeypatch.setenv("TRIDERM_WORKSPACE", str(demo_workspace.root))
    monkeypatch.setenv("TRIDERM_RESULTS_DIR", str(tmp_path / "no-results"))
    started: list[str] = []
    monkeypatch.setattr(jobs, "in_background", lambda key, fn, *args: started.append(key))
    run_id = add_test_embedding(demo_workspace)

    def title(at) -> str:
        (chart,) = at.get("vega_lite_chart")
        spec = json.loads(chart.proto.spec)
        assert [layer["mark"]["type"] for layer in spec["layer"]] == ["point"]
        return spec["title"]["text"]

    at = app("explore", timeout=120)  # nothing stored: the instant MDS map, the UMAP started once
    assert title(at).startswith(f"Classical MDS (UMAP being computed) of run {run_id}")
    assert len(started) == 1 and started[0].endswith(".npy")

    compute_umap(demo_workspace, map_input(demo_workspace, [run_id]), 15, 0.1)  # the page's default setting
    monkeypatch.setitem(sys.modules, "umap", types.SimpleNamespace(UMAP=FailingUMAP))
    at = app("explore", timeout=120)
    assert title(at) == f"UMAP of run {run_id} (photos)"
    assert len(started) == 1  # nothing computed again
    assert "Most similar" in "\n".join(str(md.value) for md in at.markdown)


def test_map_groups_differ_by_symbol_as_well_as_colour():
    from core.eval.explore import SYMBOLS, scatter_spec

    groups = [f"patient {n}" for n in range(len(SYMBOLS) + 1)]
    spec = scatter_spec(np.zeros((len(groups), 2)), groups, groups, {g: "#123456" for g in groups}, "patient", "t")
    shape = spec["layer"][0]["encoding"]["shape"]["scale"]
    assert shape["domain"] == groups
    assert shape["range"][: len(SYMBOLS)] == list(SYMBOLS) and shape["range"][-1] == SYMBOLS[0]


def test_a_map_point_carries_its_row_label_and_group_and_a_click_selects_its_row():
    from core.eval.explore import PICK, scatter_spec

    xy = np.array([[0.0, 1.0], [2.0, 3.0]], dtype=np.float32)
    spec = scatter_spec(xy, ["<b>P1</b>", "P2"], ["a", "b"], {"b": "#222", "a": "#111"}, "patient", "map", "SYNTHETIC")
    assert spec["data"]["values"] == [{"x": 0.0, "y": 1.0, "row": 0, "label": "<b>P1</b>", "group": "a"},
                                      {"x": 2.0, "y": 3.0, "row": 1, "label": "P2", "group": "b"}]
    (pick,) = [p for p in spec["layer"][0]["params"] if p["name"] == PICK]
    assert pick["select"] == {"type": "point", "fields": ["row"], "on": "click"}
    assert spec["layer"][0]["encoding"]["color"]["scale"] == {"domain": ["b", "a"], "range": ["#222", "#111"]}
    assert spec["title"]["subtitle"] == "SYNTHETIC"
    json.dumps(spec)  # plain JSON: the page sends it as it is


def test_a_track_path_joins_its_visits_in_order_on_wound_and_photo_maps():
    visits = [("b", 1, "2024-01-01"), ("a", 2, "2024-02-01"), ("z", 1, "2024-03-01"), ("c", 1, "2024-04-01")]
    wounds = MapInput((1,), "wounds", "uncertainty", ["a #1", "a #2", "b #1", "c #1"], ["a", "a", "b", "c"],
                      None, None, "")
    photos = MapInput((1,), "photos", "uncertainty", ["a", "b", "c"], ["a", "b", "c"], None, None, "")
    assert track_rows(wounds, visits) == [2, 1, 3]  # "z" is not on the map
    assert track_rows(photos, visits) == [1, 0, 2]
    spec = {"layer": []}
    xy = np.array([[0.0, 0.0], [1.0, 0.0], [2.0, 1.0]])
    add_track_path(spec, xy, [1, 0, 2], "P1-T1", ["2024-01-01", "", "2024-04-01"])
    line, numbers = spec["layer"]
    assert line["mark"]["type"] == "line" and line["encoding"]["order"]["field"] == "visit"
    assert [(v["x"], v["y"], v["visit"], v["date"]) for v in line["data"]["values"]] == [
        (1.0, 0.0, 1, "2024-01-01"), (0.0, 0.0, 2, "no date"), (2.0, 1.0, 3, "2024-04-01")]
    assert numbers["mark"]["type"] == "text" and numbers["data"] == line["data"]


def test_run_choices_put_trained_models_first_then_newest():
    from core.eval.explore import run_choices

    runs = [{"id": i, "kind": k, "config": {"modality": "vision"}, "name": n, "metrics": {}}
            for i, k, n in ((1, "vision-baseline", None), (2, "text-soe", None), (3, "vision-baseline", "b"),
                            (4, "vision-triderm", None))]
    labels = run_choices(runs)
    assert list(labels) == [4, 2, 3, 1]
    assert labels[3] == "run 3 · vision-baseline · vision · b" and labels[2] == "run 2 · text-soe · vision"


def test_stale_note_only_when_outlines_changed_after_the_run():
    from core.eval.explore import stale_note

    run = {"id": 7, "created": "2026-01-02T10:00:00"}
    assert stale_note(run, None) is None and stale_note(run, "2026-01-01T09:00:00") is None
    note = stale_note(run, "2026-01-03T08:30:12.5")
    assert "last change 2026-01-03 08:30 UTC, run 7 from 2026-01-02 10:00 UTC" in note


def test_colour_options_and_values():
    from core.eval.explore import colour_options, colour_value

    images = {"a": {"patient_id": "P1", "metadata": {"site": "leg"}}, "b": {"patient_id": None, "metadata": None}}
    patients = {"P1": {"sex": "F"}}
    assert colour_options(images, patients) == ["patient", "cluster", "patient sex", "site"]
    assert [colour_value(images["a"], patients, c, 2) for c in ("patient", "cluster", "patient sex", "site")] == [
        "P1", "cluster 3", "F", "leg"]
    assert [colour_value(images["b"], patients, c) for c in ("patient", "patient sex", "site")] == ["unknown"] * 3


def test_attention_maps_average_a_photos_wounds_and_the_overlay_colours_only_the_map():
    from PIL import Image

    from core.eval.explore import attention_maps, map_overlay

    emb = {"image_ids": ["p1", "p2"], "wound_keys": [("p1", 1), ("p2", 1), ("p1", 2)], "grid": np.array([2, 2]),
           "token_wound": np.array([0, 0, 2, 1]), "token_pos": np.array([[0, 0], [1, 1], [0, 1], [1, 0]]),
           "token_weight": np.array([0.25, 0.75, 1.0, 1.0])}
    maps = attention_maps(emb)
    assert maps.shape == (2, 2, 2) and maps.dtype == np.float32
    # p1: wound 1 (0.25 at (0,0), 0.75 at (1,1)) and wound 2 (1.0 at (0,1)), averaged over its two wounds
    np.testing.assert_allclose(maps[0], [[0.125, 0.5], [0.0, 0.375]])
    np.testing.assert_allclose(maps[1], [[0.0, 0.0], [1.0, 0.0]])
    lut = np.zeros((256, 3), dtype=np.uint8)
    lut[:, 0] = 255  # every weight red
    out = np.asarray(map_overlay(maps[1], Image.new("RGB", (2, 2), (0, 0, 255)), 1.0, lut))
    assert tuple(out[1, 0]) == (255, 0, 0) and tuple(out[0, 1]) == (0, 0, 255)  # outside the map: the photo
    negative = np.asarray(map_overlay(-maps[1], Image.new("RGB", (2, 2), (0, 0, 255)), 1.0, lut))
    assert (negative == (0, 0, 255)).all()  # a token pulling the other way is not coloured


def test_concept_table_labels_and_rounds():
    from core.eval.explore import concept_table

    top = [{"concept": "fibrin", "fused": 0.12345, "global": 0.2, "local": 0.04691}, {"concept": "x", "fused": 1,
                                                                                       "global": 1, "local": 1}]
    assert concept_table(top, {"fibrin": "Fibrin (slough)"}) == [
        {"concept": "Fibrin (slough)", "fused": 0.123, "global": 0.2, "local": 0.047},
        {"concept": "x", "fused": 1, "global": 1, "local": 1}]


def test_run_choices_open_on_the_newest_trained_run_over_a_newer_frozen_baseline():
    """Issue 54: ``make demo`` records the fine-tuned run, then the frozen baseline it is compared with: Explore opens
    on the fine-tuned one (trained before untrained, vision before text, then newest first)."""
    from core.eval.explore import run_choices

    runs = [{"id": i, "kind": k, "config": {"modality": m}, "name": None, "metrics": {}}
            for i, k, m in ((1, "vision-triderm", "vision"), (2, "vision-finetune", "vision"),
                            (3, "vision-baseline", "vision"), (4, "text-baseline", "text"), (5, "text-soe", "text"))]
    assert list(run_choices(runs)) == [2, 1, 5, 3, 4]


def test_no_attention_reason_says_why_in_words_and_thumbnails_grow_with_fewer_points():
    from core.eval.explore import MAP_HEIGHT, no_attention_reason, thumbnail_size

    def run(kind: str, **config) -> dict:
        return {"kind": kind, "config": config}

    assert "frozen baseline" in no_attention_reason(run("vision-baseline"))
    assert "no attention head" in no_attention_reason(run("vision-finetune"))
    assert "pooling mean" in no_attention_reason(run("vision-triderm", pooling="mean"))
    assert thumbnail_size(53) >= 48 > 0.1 * MAP_HEIGHT > thumbnail_size(200) and thumbnail_size(4) == 0.2 * MAP_HEIGHT
