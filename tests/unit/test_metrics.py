"""Agreement metrics: hand-computed cases, scikit-learn equivalence, bootstrap CIs."""
from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import cohen_kappa_score, f1_score

from core.eval.metrics import agreement, agreement_from_choices, evaluate


def _random_problem(rng: np.random.Generator, n: int, m: int, noise: float):
    """Distances from a random 3-d embedding; choices from a noisy copy of it."""
    x = rng.normal(size=(n, 3))
    D = np.linalg.norm(x[:, None] - x[None], axis=-1)
    x_judge = x + noise * rng.normal(size=x.shape)
    Dj = np.linalg.norm(x_judge[:, None] - x_judge[None], axis=-1)
    t = np.array([rng.choice(n, 3, replace=False) for _ in range(m)])
    choices = np.where(Dj[t[:, 0], t[:, 1]] < Dj[t[:, 0], t[:, 2]], "j", "k")
    return D, t, choices


def test_hand_computed_example():
    # 0 is close to 1 and far from 2 and 3; 2 and 3 are close.
    D = np.array(
        [
            [0.0, 1.0, 5.0, 6.0],
            [1.0, 0.0, 4.0, 4.0],
            [5.0, 4.0, 0.0, 1.0],
            [6.0, 4.0, 1.0, 0.0],
        ]
    )
    anchors = [0, 0, 2, 2, 2]
    refs_j = [1, 1, 3, 0, 0]
    refs_k = [2, 3, 0, 3, 1]
    choices = ["j", "k", "j", "j", "j"]  # right, wrong, right, wrong, wrong
    r = agreement_from_choices(D, anchors, refs_j, refs_k, choices)
    assert r["n"] == 5 and r["n_anchors"] == 2
    assert r["micro"] == pytest.approx(2 / 5)
    assert r["balanced"] == pytest.approx((1 / 2 + 1 / 3) / 2)
    # true: j k j j j ; pred: j j j k k
    y_true = ["j", "k", "j", "j", "j"]
    y_pred = ["j", "j", "j", "k", "k"]
    assert r["macro_f1"] == pytest.approx(f1_score(y_true, y_pred, average="macro"))
    assert r["kappa"] == pytest.approx(cohen_kappa_score(y_true, y_pred))


def test_ties_count_as_wrong():
    D = np.array([[0.0, 2.0, 2.0], [2.0, 0.0, 1.0], [2.0, 1.0, 0.0]])
    r = agreement_from_choices(D, [0, 0], [1, 2], [2, 1], ["j", "k"])
    assert r["micro"] == 0.0 and r["balanced"] == 0.0


@pytest.mark.parametrize("seed", range(5))
def test_matches_sklearn_on_random_data(seed: int):
    rng = np.random.default_rng(seed)
    D, t, choices = _random_problem(rng, n=25, m=300, noise=1.0)
    r = agreement_from_choices(D, t[:, 0], t[:, 1], t[:, 2], choices)
    pred = np.where(D[t[:, 0], t[:, 1]] < D[t[:, 0], t[:, 2]], "j", "k")
    assert r["micro"] == pytest.approx(np.mean(pred == choices))
    assert r["macro_f1"] == pytest.approx(f1_score(choices, pred, average="macro"))
    assert r["kappa"] == pytest.approx(cohen_kappa_score(choices, pred))
    per_anchor = [np.mean((pred == choices)[t[:, 0] == a]) for a in np.unique(t[:, 0])]
    assert r["balanced"] == pytest.approx(np.mean(per_anchor))
    assert 0.5 < r["micro"] < 1.0  # a noisy judge: informative, not perfect


def test_oriented_wrapper_agrees_on_accuracy():
    rng = np.random.default_rng(1)
    D, t, choices = _random_problem(rng, n=20, m=200, noise=0.5)
    raw = agreement_from_choices(D, t[:, 0], t[:, 1], t[:, 2], choices)
    oriented = np.where((choices == "j")[:, None], t, t[:, [0, 2, 1]])
    r = agreement(D, oriented)
    assert r["micro"] == pytest.approx(raw["micro"])
    assert r["balanced"] == pytest.approx(raw["balanced"])
    assert r["n"] == raw["n"] and r["n_anchors"] == raw["n_anchors"]
    # canonical position order: the smaller index is position j
    first = np.minimum(oriented[:, 1], oriented[:, 2])
    y_true = np.where(oriented[:, 1] == first, "j", "k")
    closer = np.where(D[oriented[:, 0], oriented[:, 1]] < D[oriented[:, 0], oriented[:, 2]], oriented[:, 1], oriented[:, 2])
    y_pred = np.where(closer == first, "j", "k")
    assert r["macro_f1"] == pytest.approx(f1_score(y_true, y_pred, average="macro"))
    assert r["kappa"] == pytest.approx(cohen_kappa_score(y_true, y_pred))


def test_perfect_and_inverted_embeddings():
    rng = np.random.default_rng(2)
    D, t, _ = _random_problem(rng, n=15, m=100, noise=0.0)
    oriented = np.where((D[t[:, 0], t[:, 1]] < D[t[:, 0], t[:, 2]])[:, None], t, t[:, [0, 2, 1]])
    assert agreement(D, oriented)["balanced"] == 1.0
    assert agreement(D, oriented)["kappa"] == pytest.approx(1.0)
    assert agreement(-D, oriented)["micro"] == 0.0


def test_bad_inputs_raise_clear_errors():
    D = np.zeros((3, 3))
    with pytest.raises(ValueError, match="square"):
        agreement(np.zeros((3, 4)), [[0, 1, 2]])
    with pytest.raises(ValueError, match="outside"):
        agreement(D, [[0, 1, 5]])
    with pytest.raises(ValueError, match="skip"):
        agreement_from_choices(D, [0], [1], [2], ["skip"])


def _rows(ids, t, choices):
    return [
        {"id": n, "anchor": ids[a], "ref_j": ids[j], "ref_k": ids[k], "choice": c}
        for n, ((a, j, k), c) in enumerate(zip(t, choices))
    ]


def test_evaluate_maps_ids_and_counts_dropped_rows():
    rng = np.random.default_rng(3)
    D, t, choices = _random_problem(rng, n=12, m=80, noise=0.5)
    ids = [f"img{n:02d}" for n in range(12)]
    rows = _rows(ids, t, choices)
    rows += [{"anchor": "img00", "ref_j": "img01", "ref_k": "img02", "choice": "skip"}] * 3
    rows += [{"anchor": "ghost", "ref_j": "img01", "ref_k": "img02", "choice": "j"}] * 2
    r = evaluate(ids, D, rows)
    assert r["n_skipped"] == 3 and r["n_missing"] == 2 and r["n"] == 80
    assert r["micro"] == pytest.approx(agreement_from_choices(D, t[:, 0], t[:, 1], t[:, 2], choices)["micro"])
    assert "ci" not in r


def test_evaluate_rejects_unknown_choice():
    with pytest.raises(ValueError, match="triplet 7"):
        evaluate(["a", "b", "c"], np.zeros((3, 3)), [{"id": 7, "anchor": "a", "ref_j": "b", "ref_k": "c", "choice": "x"}])


def test_bootstrap_ci_contains_estimate_and_narrows_with_more_triplets():
    rng = np.random.default_rng(4)
    n = 60
    D, t, choices = _random_problem(rng, n=n, m=4000, noise=0.8)
    ids = [f"p{i}" for i in range(n)]
    widths = []
    for m in (100, 800, 4000):
        r = evaluate(ids, D, _rows(ids, t[:m], choices[:m]), ci=True, n_boot=500, seed=0)
        for metric in ("balanced", "micro", "macro_f1", "kappa"):
            lo, hi = r["ci"][metric]
            assert lo <= r[metric] <= hi, (metric, m, lo, r[metric], hi)
        widths.append({metric: np.diff(r["ci"][metric])[0] for metric in r["ci"]})
    for metric in widths[0]:
        assert widths[0][metric] > widths[1][metric] > widths[2][metric], (metric, widths)


def test_per_anchor_breakdown_sorted_worst_first():
    rng = np.random.default_rng(5)
    D, t, choices = _random_problem(rng, n=10, m=150, noise=1.0)
    ids = [f"x{i}" for i in range(10)]
    r = evaluate(ids, D, _rows(ids, t, choices), ci=True, n_boot=100)
    acc = [p["accuracy"] for p in r["per_anchor"]]
    assert acc == sorted(acc)
    assert sum(p["n"] for p in r["per_anchor"]) == 150
    worst = r["per_anchor"][0]
    mask = t[:, 0] == ids.index(worst["anchor"])
    pred = np.where(D[t[mask, 0], t[mask, 1]] < D[t[mask, 0], t[mask, 2]], "j", "k")
    assert worst["accuracy"] == pytest.approx(np.mean(pred == choices[mask]))


@pytest.mark.parametrize(("args", "message"), [
    (([0], [1], [2, 1], ["j"]), r"^anchors, refs_j, refs_k and choices differ in length: 1, 1, 2, 1$"),
    (([3], [1], [2], ["j"]), r"^anchors holds an index outside \[0, 3\) for a 3×3 distance matrix$"),
    (([0], [-1], [2], ["j"]), r"^refs_j holds an index outside \[0, 3\)"),
    (([0], [1], [3], ["j"]), r"^refs_k holds an index outside \[0, 3\)"),
    (([0, 0], [1, 1], [2, 2], ["j", "skip"]),
     r"^choice at position 1 is 'skip'; expected 'j' or 'k' \(drop skips first\)$"),
])
def test_agreement_from_choices_names_the_bad_input(args, message):
    D = np.array([[0.0, 1.0, 2.0], [1.0, 0.0, 1.5], [2.0, 1.5, 0.0]])
    with pytest.raises(ValueError, match=message):
        agreement_from_choices(D, *args)
    with pytest.raises(ValueError, match=r"^D must be a square n×n distance matrix, got shape \(3, 2\)$"):
        agreement_from_choices(D[:, :2], [0], [1], [2], ["j"])


def test_integer_distances_and_nested_index_lists_are_accepted():
    D = np.array([[0, 1, 2], [1, 0, 1], [2, 1, 0]])  # ints: compared as floats
    r = agreement_from_choices(D, [[0], [2]], [[1], [1]], [[2], [0]], [["j"], ["j"]])
    assert r["micro"] == 1.0 and r["n"] == 2
