"""Distance fusion on small hand-computed matrices."""
from __future__ import annotations

import numpy as np
import pytest

from core.eval.fusion import (
    MissingImagesError,
    align,
    fuse,
    minmax_normalise,
    row_variance,
    similarity_fusion,
    uncertainty_fusion,
    uncertainty_weights,
)
from core.eval.metrics import agreement

# Already normalised (min 0 on the diagonal, max 1).
DV = np.array([[0.0, 0.5, 1.0], [0.5, 0.0, 1.0], [1.0, 1.0, 0.0]])
DT = np.array([[0.0, 1.0, 0.5], [1.0, 0.0, 0.0], [0.5, 0.0, 0.0]])


def _random_distance(rng: np.random.Generator, n: int, dim: int = 4) -> np.ndarray:
    x = rng.normal(size=(n, dim))
    return np.linalg.norm(x[:, None] - x[None], axis=-1)


def test_minmax_normalise():
    D = np.array([[0.0, 2.0, 6.0], [2.0, 0.0, 4.0], [6.0, 4.0, 0.0]])
    np.testing.assert_allclose(minmax_normalise(D), D / 6.0)
    np.testing.assert_allclose(minmax_normalise(D + 3.0), D / 6.0)
    assert (minmax_normalise(np.full((3, 3), 2.0)) == 0).all()


def test_row_variance_excludes_self_distance():
    # rows' other-image distances: [.5, 1], [.5, 1], [1, 1]
    np.testing.assert_allclose(row_variance(DV), [0.0625, 0.0625, 0.0])
    np.testing.assert_allclose(row_variance(DT), [0.0625, 0.25, 0.0625])


def test_uncertainty_weights_hand_computed():
    w = uncertainty_weights([DV, DT], alpha=0.7)
    # w_i = .7 σV² / (.7 σV² + .3 σT²)
    expected_v = np.array([0.7, 0.7 * 0.0625 / (0.7 * 0.0625 + 0.3 * 0.25), 0.0])
    np.testing.assert_allclose(w[0], expected_v)
    np.testing.assert_allclose(w[0] + w[1], 1.0)
    assert expected_v[1] == pytest.approx(7 / 19)


def test_uncertainty_fusion_hand_computed_with_symmetric_pair_weights():
    D = uncertainty_fusion([DV, DT], alpha=0.7)
    w0, w1, w2 = 0.7, 7 / 19, 0.0
    w01, w02, w12 = (w0 + w1) / 2, (w0 + w2) / 2, (w1 + w2) / 2
    expected = np.array(
        [
            [0.0, w01 * 0.5 + (1 - w01) * 1.0, w02 * 1.0 + (1 - w02) * 0.5],
            [0.0, 0.0, w12 * 1.0 + (1 - w12) * 0.0],
            [0.0, 0.0, 0.0],
        ]
    )
    expected = expected + expected.T
    np.testing.assert_allclose(D, expected)
    assert D[1, 2] == pytest.approx(7 / 38)
    np.testing.assert_allclose(D, D.T)


def test_alpha_weights_modalities_when_confidences_are_equal():
    # DT2 = 1 − DV off the diagonal: same row variances, so w_i = α for every image.
    D1 = np.array([[0.0, 0.0, 1.0, 0.4], [0.0, 0.0, 0.3, 1.0], [1.0, 0.3, 0.0, 0.6], [0.4, 1.0, 0.6, 0.0]])
    D2 = np.where(np.eye(4, dtype=bool), 0.0, 1.0 - D1)
    np.testing.assert_allclose(row_variance(D1), row_variance(D2))
    for alpha in (0.7, 0.5, 0.2):
        np.testing.assert_allclose(uncertainty_weights([D1, D2], alpha)[0], alpha)
        np.testing.assert_allclose(uncertainty_fusion([D1, D2], alpha), alpha * D1 + (1 - alpha) * D2)


def test_similarity_fusion_hand_computed():
    A = np.array([[0.0, 0.5, 1.0], [0.5, 0.0, 0.2], [1.0, 0.2, 0.0]])
    B = np.array([[0.0, 1.0, 0.5], [1.0, 0.0, 0.4], [0.5, 0.4, 0.0]])
    D = similarity_fusion([A, B])
    # 1 − (1 − a)(1 − b): (0,1) → 1 − .5·0 = 1, (0,2) → 1 − 0·.5 = 1, (1,2) → 1 − .8·.6 = .52
    expected = np.array([[0.0, 1.0, 1.0], [1.0, 0.0, 0.52], [1.0, 0.52, 0.0]])
    np.testing.assert_allclose(D, expected)
    # inputs are normalised first: scaling an input changes nothing
    np.testing.assert_allclose(similarity_fusion([7 * A, B + 2]), expected)


def test_fusing_a_matrix_with_itself_returns_it_normalised():
    rng = np.random.default_rng(0)
    D = _random_distance(rng, 12) * 3.0
    np.testing.assert_allclose(uncertainty_fusion([D, D]), minmax_normalise(D))
    np.testing.assert_allclose(uncertainty_fusion([D, D, D], alpha=[1, 2, 3]), minmax_normalise(D))
    # similarity fusion of a matrix with itself is 1 − (1 − D)², a monotone map: same ranking
    Dn = minmax_normalise(D)
    np.testing.assert_allclose(similarity_fusion([D, D]), 1 - (1 - Dn) ** 2)
    t = np.array([rng.choice(12, 3, replace=False) for _ in range(200)])
    assert agreement(similarity_fusion([D, D]), t)["micro"] == agreement(D, t)["micro"]


def test_fusion_of_random_matrices_is_symmetric_and_between_inputs():
    rng = np.random.default_rng(1)
    A, B, C = (_random_distance(rng, 10) for _ in range(3))
    for D in (uncertainty_fusion([A, B]), uncertainty_fusion([A, B, C], alpha=[0.5, 0.3, 0.2])):
        np.testing.assert_allclose(D, D.T)
        np.testing.assert_allclose(np.diag(D), 0.0)
    stack = np.stack([minmax_normalise(A), minmax_normalise(B)])
    D = uncertainty_fusion([A, B])
    assert (stack.min(0) - 1e-12 <= D).all() and (stack.max(0) + 1e-12 >= D).all()


def test_align_reports_missing_images():
    ids_v = ["a", "b", "c", "d"]
    ids_t = ["d", "c", "b", "e"]
    Dv = np.arange(16, dtype=float).reshape(4, 4)
    Dv = Dv + Dv.T
    Dt = np.ones((4, 4)) - np.eye(4)
    with pytest.raises(MissingImagesError) as err:
        align([(ids_v, Dv), (ids_t, Dt)])
    assert err.value.missing == {0: ["e"], 1: ["a"]}
    assert "e" in str(err.value) and "a" in str(err.value)
    ids, (sv, st), missing = align([(ids_v, Dv), (ids_t, Dt)], allow_missing=True)
    assert ids == ["b", "c", "d"] and missing == {0: ["e"], 1: ["a"]}
    np.testing.assert_allclose(sv, Dv[1:, 1:])
    assert sv.shape == st.shape == (3, 3)


def test_fuse_reorders_by_id():
    rng = np.random.default_rng(2)
    D = _random_distance(rng, 6)
    ids = [f"i{n}" for n in range(6)]
    perm = rng.permutation(6)
    fused = fuse([(ids, D), ([ids[p] for p in perm], D[np.ix_(perm, perm)])], method="uncertainty")
    assert fused.ids == ids and fused.missing == {}
    np.testing.assert_allclose(fused.D, minmax_normalise(D))
    with pytest.raises(ValueError, match="unknown fusion method"):
        fuse([(ids, D), (ids, D)], method="max")


def test_bad_inputs():
    with pytest.raises(ValueError, match="at least 2"):
        uncertainty_fusion([DV])
    with pytest.raises(ValueError, match="differ in shape"):
        similarity_fusion([DV, np.zeros((4, 4))])
    with pytest.raises(ValueError, match="alpha"):
        uncertainty_fusion([DV, DT], alpha=1.5)
    with pytest.raises(ValueError, match="NaN"):
        similarity_fusion([DV, np.full((3, 3), np.nan)])


def _random_distances(n: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).normal(size=(n, 3))
    return np.sqrt(((x[:, None] - x[None]) ** 2).sum(-1))


def test_fuse_dispatches_the_method_and_reports_missing_images():
    ids = [f"p{n:02d}" for n in range(14)]
    Dv, Dt = _random_distances(14, 0), _random_distances(14, 1)
    fused = fuse([(ids, Dv), (ids, Dt)], method="similarity")
    assert np.allclose(fused.D, similarity_fusion([Dv, Dt])) and fused.missing == {}
    assert np.allclose(fuse([(ids, Dv), (ids, Dt)]).D, uncertainty_fusion([Dv, Dt]))
    assert np.allclose(fuse([(ids, Dv), (ids, Dt)], alpha=0.8).D, uncertainty_fusion([Dv, Dt], 0.8))
    # the text input lacks 11 photos: listed (10 shown, then …), or left out on request
    short = ids[:3]
    with pytest.raises(MissingImagesError, match=r"^images missing from some inputs \(input 1 lacks 11: "
                                                 + ", ".join(ids[3:13]) + r" …\)$") as err:
        fuse([(ids, Dv), (short, Dt[:3, :3])])
    assert err.value.missing == {1: ids[3:]}
    with pytest.raises(MissingImagesError, match=r"\(input 1 lacks 10: " + ", ".join(ids[4:]) + r"\)$"):
        fuse([(ids, Dv), (ids[:4], Dt[:4, :4])])
    partial = fuse([(ids, Dv), (ids[:4], Dt[:4, :4])], allow_missing=True)
    assert partial.ids == ids[:4] and partial.missing == {1: ids[4:]}
    assert np.allclose(partial.D, uncertainty_fusion([Dv[:4, :4], Dt[:4, :4]]))


@pytest.mark.parametrize(("inputs", "message"), [
    ("one", "^fusion needs at least 2 inputs, got 1$"),
    ("rect", r"^input 1 must be a square distance matrix, got shape \(3, 4\)$"),
    ("ids", "^input 1: 3 ids for a 4×4 matrix$"),
    ("dup", "^input 0: duplicate image ids$"),
    ("few", "^only 2 images are shared by all inputs; fusion needs at least 3$"),
])
def test_align_names_the_bad_input(inputs, message):
    ids, D = ["a", "b", "c", "d"], _random_distances(4, 2)
    bad = {"one": [(ids, D)], "rect": [(ids, D), (ids[:3], D[:3])], "ids": [(ids, D), (ids[:3], D)],
           "dup": [(["a", "a", "c", "d"], D), (ids, D)], "few": [(ids, D), (["a", "b"], D[:2, :2])]}[inputs]
    with pytest.raises(ValueError, match=message):
        fuse(bad, allow_missing=True)


def test_priors_bounds_and_normalisation():
    Ds = [_random_distances(6, s) for s in range(3)]
    assert np.allclose(uncertainty_weights(Ds, [2.0, 2.0, 4.0]), uncertainty_weights(Ds, [0.25, 0.25, 0.5]))
    for alpha in (0.0, 1.0):
        with pytest.raises(ValueError, match=r"^alpha must be in \(0, 1\), got"):
            uncertainty_weights(Ds[:2], alpha)
    with pytest.raises(ValueError, match=r"^a scalar alpha applies to 2 modalities; give 3 priors instead$"):
        uncertainty_weights(Ds, 0.5)
    for priors in ([1.0, 0.0, 1.0], [1.0, 1.0]):
        with pytest.raises(ValueError, match=r"^need 3 positive modality priors, got \["):
            uncertainty_weights(Ds, priors)
    with pytest.raises(ValueError, match=r"^distance matrix 1 must be a square distance matrix, got shape \(6,\)$"):
        similarity_fusion([Ds[0], Ds[1][0]])
