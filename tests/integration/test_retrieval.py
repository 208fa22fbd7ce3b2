"""Retrieval: nearest / farthest images of a run or a fused pair of runs."""
from __future__ import annotations

import numpy as np
import pytest

from annotations.infra.workspace import Workspace
from core.eval.fusion import MissingImagesError, fuse, minmax_normalise
from core.eval.retrieval import neighbours, neighbours_in_runs, run_distances
from core.runtime import save_embeddings

IDS = ["a", "b", "c", "d", "e"]
# points on a line at 0, 1, 3, 7, 15
X = np.array([0.0, 1.0, 3.0, 7.0, 15.0])
D_LINE = np.abs(X[:, None] - X[None])


def test_neighbours_on_a_line():
    r = neighbours(IDS, D_LINE, "c", k=2)
    assert r["similar"] == [("b", 2.0), ("a", 3.0)]
    assert r["dissimilar"] == [("e", 12.0), ("d", 4.0)]
    r = neighbours(IDS, D_LINE, "a", k=10)  # k larger than the others: all of them, query excluded
    assert [i for i, _ in r["similar"]] == ["b", "c", "d", "e"]
    assert [i for i, _ in r["dissimilar"]] == ["e", "d", "c", "b"]


def test_neighbours_errors():
    with pytest.raises(KeyError, match="zz"):
        neighbours(IDS, D_LINE, "zz")
    with pytest.raises(ValueError, match="k must be"):
        neighbours(IDS, D_LINE, "a", k=0)
    with pytest.raises(ValueError, match="ids"):
        neighbours(IDS[:3], D_LINE, "a")


def _run_with(ws: Workspace, ids, modality: str, emb=None, distance=None) -> int:
    run_id = ws.store.start_run(f"{modality}-test", {"modality": modality})
    save_embeddings(ws, run_id, list(ids), image_emb=emb, distance=distance)
    ws.store.finish_run(run_id)
    return run_id


def test_neighbours_in_a_run_and_a_fused_pair(tmp_path):
    ws = Workspace(tmp_path / "ws")
    rng = np.random.default_rng(0)
    emb = rng.normal(size=(5, 3))
    vision = _run_with(ws, IDS, "vision", emb=emb)
    text = _run_with(ws, IDS[::-1], "text", distance=D_LINE[::-1, ::-1])
    D_emb = np.linalg.norm(emb[:, None] - emb[None], axis=-1)

    ids, D = run_distances(ws, text)
    r = neighbours_in_runs(ws, text, "c", k=2)
    assert r["similar"] == [("b", 2 / 15), ("a", 3 / 15)]
    assert D.max() == 1.0

    ids, D = run_distances(ws, [vision, text], method="similarity")
    assert ids == IDS
    np.testing.assert_allclose(D, fuse([(IDS, D_emb), (IDS, D_LINE)], method="similarity").D)
    r = neighbours_in_runs(ws, [vision, text], "a", k=1, method="uncertainty")
    expected = fuse([(IDS, D_emb), (IDS, D_LINE)]).D
    nearest = int(np.argsort(expected[0])[1])
    assert r["similar"] == [(IDS[nearest], pytest.approx(expected[0, nearest]))]
    np.testing.assert_allclose(run_distances(ws, vision)[1], minmax_normalise(D_emb))


def test_fused_runs_report_missing_images(tmp_path):
    ws = Workspace(tmp_path / "ws")
    v = _run_with(ws, IDS, "vision", distance=D_LINE)
    t = _run_with(ws, IDS[:4], "text", distance=D_LINE[:4, :4])
    with pytest.raises(MissingImagesError, match="e"):
        run_distances(ws, [v, t])
