"""Same-label retrieval (:func:`core.eval.retrieval.same_label_retrieval`) on planted embeddings."""
from __future__ import annotations

import numpy as np
import pytest

from core.eval.distances import pairwise_euclidean
from core.eval.retrieval import fold_retrieval, photo_types, retrieval_summary, same_label_retrieval


def planted(n_per: int = 6, labels: str = "ABC", noise: float = 0.05, seed: int = 0) -> tuple[np.ndarray, list[str]]:
    """Tight clusters, one per label, far apart."""
    rng = np.random.default_rng(seed)
    lab = [c for c in labels for _ in range(n_per)]
    centres = {c: 10.0 * np.eye(len(labels))[i] for i, c in enumerate(labels)}
    return np.stack([centres[c] + noise * rng.normal(size=len(labels)) for c in lab]), lab


def test_planted_clusters_retrieve_their_own_label_perfectly() -> None:
    X, lab = planted()
    patients = [f"p{i}" for i in range(len(lab))]
    out = same_label_retrieval(pairwise_euclidean(X), lab, patients, range(len(lab)))
    assert all(r["p@1"] == 1.0 and r["p@5"] == 1.0 and r["ap"] == pytest.approx(1.0) for r in out.values())
    assert all(r["p@10"] == pytest.approx(5 / 10) for r in out.values())  # only 5 others share a label


def test_shuffled_embedding_is_near_chance() -> None:
    X, lab = planted(n_per=30)
    rng = np.random.default_rng(1)
    perm = rng.permutation(len(lab))
    out = same_label_retrieval(pairwise_euclidean(X[perm]), lab, [str(i) for i in range(len(lab))], range(len(lab)))
    assert np.mean([r["ap"] for r in out.values()]) < 0.5  # chance ≈ 1/3, planted = 1


def test_hand_computed_ranking() -> None:
    # query 0 (label a); by distance: row 1 (b), row 2 (a), row 3 (b), row 4 (a)
    D = np.array([[0, 1, 2, 3, 4], [1, 0, 1, 1, 1], [2, 1, 0, 1, 1], [3, 1, 1, 0, 1], [4, 1, 1, 1, 0]], float)
    out = same_label_retrieval(D, list("abab" + "a"), list("pqrst"), [0], ks=(1, 2, 4))[0]
    assert out == {"p@1": 0.0, "p@2": 0.5, "p@4": 0.5, "ap": pytest.approx((1 / 2 + 2 / 4) / 2)}


def test_own_patient_and_query_are_excluded() -> None:
    # row 1 is the query's own patient and nearest: leaving it in would make p@1 = 1
    D = np.array([[0, 0.1, 1, 2], [0.1, 0, 1, 2], [1, 1, 0, 1], [2, 2, 1, 0]], float)
    out = same_label_retrieval(D, list("aaba"), ["p", "p", "q", "r"], [0], ks=(1, 3))[0]
    assert out["p@1"] == 0.0 and out["p@3"] == pytest.approx(1 / 3)  # 2 candidates: the missing one is a miss
    assert out["ap"] == pytest.approx(1 / 2)


def test_gallery_restricts_candidates_and_no_match_gives_no_ap() -> None:
    X, lab = planted()
    D = pairwise_euclidean(X)
    gallery = [i for i, c in enumerate(lab) if c != "A"]
    out = same_label_retrieval(D, lab, [str(i) for i in range(len(lab))], [0], gallery=gallery)[0]
    assert out["p@1"] == 0.0 and out["ap"] is None


def test_bad_input_is_refused() -> None:
    D = np.zeros((3, 3))
    with pytest.raises(ValueError, match="shape"):
        same_label_retrieval(D, list("ab"), list("pq"), [0])
    with pytest.raises(ValueError, match="outside"):
        same_label_retrieval(D, list("abc"), list("pqr"), [3])
    with pytest.raises(ValueError, match="k must"):
        same_label_retrieval(D, list("abc"), list("pqr"), [0], ks=(0,))


def test_summary_resamples_patients_and_skips_missing_ap() -> None:
    per_query = {"x": {"p@1": 1.0, "ap": 1.0}, "y": {"p@1": 0.0, "ap": None}, "z": {"p@1": 0.5, "ap": 0.5}}
    s = retrieval_summary(per_query, {"x": "p", "y": "q", "z": "r"}, n_boot=200)
    assert s["p@1"]["mean"] == pytest.approx(0.5) and s["p@1"]["n"] == 3
    assert s["ap"]["mean"] == pytest.approx(0.75) and s["ap"]["n"] == 2
    lo, hi = s["p@1"]["ci"]
    assert 0.0 <= lo < 0.5 < hi <= 1.0
    one_patient = retrieval_summary(per_query, {"x": "p", "y": "p", "z": "p"}, n_boot=200)
    assert one_patient["p@1"]["ci"] == [pytest.approx(0.5), pytest.approx(0.5)]  # one cluster: no spread


def test_photo_types_takes_the_first_field_every_photo_carries() -> None:
    images = [{"image_id": "a", "metadata": {"wound_type": "venous", "diagnosis": "x"}},
              {"image_id": "b", "metadata": {"diagnosis": "y"}}, {"image_id": "c", "metadata": None}]
    assert photo_types(images, ["a", "b"]) == ("diagnosis", ["x", "y"])
    assert photo_types(images, ["a"]) == ("wound_type", ["venous"])
    assert photo_types(images, ["a", "c"]) is None


def planted_folds() -> tuple[list[str], list[str], dict[str, str], list[tuple[np.ndarray, np.ndarray]]]:
    X, lab = planted(n_per=4, labels="AB")
    ids = [f"im{i}" for i in range(len(lab))]
    patients = {i: "p0" if n < 2 else f"p{n}" for n, i in enumerate(ids)}  # im0 and im1: one patient
    rows = [np.array([0, 1, 4, 5]), np.array([2, 3, 6, 7])]
    good, shuffled = pairwise_euclidean(X), pairwise_euclidean(X[[0, 4, 2, 6, 1, 5, 3, 7]])
    return ids, lab, patients, [(rows[0], good), (rows[1], good), (rows[0], shuffled)]


def test_fold_retrieval_ranks_within_the_fold_and_averages_over_splits() -> None:
    ids, lab, patients, folds = planted_folds()
    out = fold_retrieval(ids, folds[:2], lab, patients)
    assert sorted(out) == ids
    # im0's candidates in its fold are im4, im5 (im1 is its own patient): both of the other label
    assert out["im0"]["p@1"] == 0.0 and out["im0"]["ap"] is None
    out3 = fold_retrieval(ids, folds, lab, patients)
    assert out3["im2"] == out["im2"]  # held out once only
    assert out3["im0"]["p@1"] == pytest.approx(np.mean([0.0, same_label_retrieval(
        folds[2][1], lab, [patients[i] for i in ids], [0], gallery=folds[2][0])[0]["p@1"]]))


def test_retrieval_figure_shows_a_stored_figure_only() -> None:
    from core.eval.report import retrieval_figure

    run = {"metrics": {"cv": {"retrieval": {"label": "wound_type", "ap": {"mean": 0.456, "ci": [0.4, 0.5], "n": 9}}}}}
    assert retrieval_figure(run) == " · same-wound type retrieval mAP 45.6 % [40.0, 50.0]"
    assert retrieval_figure({"metrics": {"cv": {"balanced": 0.6}}}) == "" == retrieval_figure({"metrics": {}})


def test_a_runs_cv_metrics_store_retrieval_when_the_photos_have_types() -> None:
    from core.eval.retrieval import cv_retrieval

    ids, lab, patients, folds = planted_folds()
    assert cv_retrieval(ids, folds[:2], None, patients) == {}
    r = cv_retrieval(ids, folds[:2], ("wound_type", lab), patients)["retrieval"]
    assert r["label"] == "wound_type" and r["gallery"] == "strict"
    # im0 and im1 find only the other label once their own patient is left out; every other photo its own
    assert r["p@1"]["mean"] == pytest.approx(6 / 8) and r["p@1"]["n"] == 8
    assert r["ap"]["mean"] == pytest.approx(1.0) and r["ap"]["n"] == 6
