"""The evaluation protocol (:mod:`core.eval.protocol`): patient folds, strict and anchor-unseen scoring, the
patient of a photo, oriented triplets, the patient bootstrap and the paired tests."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from core.eval.protocol import (
    PROTOCOLS,
    cross_validate,
    fold_rows,
    oriented_triplets,
    paired_claim,
    patient_bootstrap_ci,
    patient_folds,
    patient_of,
    patient_paired_test,
    protocol_summary,
    repeated_folds,
    score_folds,
    split_triplets,
    strict_tallies,
)

#: 8 patients with 1–3 photos each, and one photo without a patient
IMAGES = ([{"image_id": f"p{p}-{k}", "patient_id": f"P{p}"} for p in range(8) for k in range(1 + p % 3)]
          + [{"image_id": "lone", "patient_id": None}])
IDS = [im["image_id"] for im in IMAGES]


def test_patient_of_falls_back_to_the_photo_itself():
    patients = patient_of(IMAGES + [{"image_id": "blank", "patient_id": ""}, {"image_id": "nokey"}])
    assert patients["p4-0"] == patients["p4-1"] == "P4"
    assert patients["lone"] == "photo:lone" and patients["blank"] == "photo:blank"
    assert patients["nokey"] == "photo:nokey"
    assert len(set(patients.values())) == 8 + 3  # photos without a patient never share one


@pytest.mark.parametrize(("k", "seed"), [(2, 0), (3, 1), (5, 7)])
def test_folds_are_patient_disjoint_and_cover_every_photo_once(k, seed):
    patients = patient_of(IMAGES)
    folds = patient_folds(IDS, patients, k, seed)
    assert len(folds) == k and all(folds)
    assert sorted(i for f in folds for i in f) == sorted(IDS)  # every photo, exactly once
    owners = [{patients[i] for i in f} for f in folds]
    assert all(not (a & b) for a, b in itertools.combinations(owners, 2))  # no patient in two folds
    sizes = [len(f) for f in folds]
    assert max(sizes) - min(sizes) <= 3  # dealt to the smallest fold: at most one largest patient apart


def test_fold_rows_and_repeats_are_row_indices_of_the_same_folds():
    patients = patient_of(IMAGES)
    rows = fold_rows(IDS, patients, 3, seed=2)
    assert [[IDS[r] for r in f] for f in rows] == patient_folds(IDS, patients, 3, seed=2)
    splits = repeated_folds(IDS, patients, 2, 4, seed=0)
    assert len(splits) == 4 and all(sorted(np.concatenate(s).tolist()) == list(range(len(IDS))) for s in splits)
    assert len({tuple(s[0].tolist()) for s in splits}) > 1  # the repeats are different random splits


def test_too_many_folds_or_no_repeat_is_refused():
    patients = patient_of(IMAGES)
    with pytest.raises(ValueError, match="larger than the number of patients"):
        patient_folds(IDS, patients, 10)
    with pytest.raises(ValueError, match="at least 2 folds"):
        patient_folds(IDS, patients, 1)
    with pytest.raises(ValueError, match="at least 1 repeat"):
        repeated_folds(IDS, patients, 2, 0)


#: a 6-photo study: photos 0–2 are the test fold
TRIPLETS = np.array([
    [0, 1, 2],  # all three in the fold: strict
    [1, 2, 0],  # strict
    [0, 3, 4],  # anchor in, both references out: anchor unseen
    [0, 1, 3],  # one reference in the fold: neither
    [3, 4, 5],  # no photo of the fold: training
    [3, 0, 5],  # anchor out, a reference in: neither
])
FOLD = np.array([0, 1, 2])


def test_strict_counts_only_triplets_whose_three_photos_are_in_the_fold():
    train, strict, anchor = split_triplets(TRIPLETS, FOLD)
    assert train.tolist() == [False, False, False, False, True, False]
    assert strict.tolist() == [True, True, False, False, False, False]
    assert anchor.tolist() == [False, False, True, False, False, False]
    assert not (strict & anchor).any()  # anchor unseen is its own row, never the strict one


def test_scores_per_protocol_with_the_folds_distances():
    D = np.full((6, 6), 5.0)
    D[0, 1], D[1, 2], D[1, 0] = 1.0, 2.0, 9.0  # [0, 1, 2] and [1, 2, 0] right: the chosen photo strictly closer
    D[0, 3], D[0, 4] = 7.0, 3.0  # [0, 3, 4] wrong: the chosen 3 is farther
    records = score_folds(TRIPLETS, [(FOLD, D)])
    assert set(records) == set(PROTOCOLS)
    assert records["strict"].tolist() == [[0, 1], [1, 1]]
    assert records["anchor_unseen"].tolist() == [[0, 0]]
    ties = score_folds(TRIPLETS, [(FOLD, np.zeros((6, 6)))])
    assert ties["strict"][:, 1].tolist() == [0, 0]  # a tie is never agreement
    tallies = strict_tallies(TRIPLETS, [(FOLD, D), (FOLD, np.zeros((6, 6)))])
    assert tallies.tolist() == [[0, 1, 2, 1, 2], [1, 2, 0, 1, 2]]  # [i, j, k, correct, scored]


def test_cross_validate_trains_each_fold_without_its_photos():
    seen: list[tuple[np.ndarray, np.ndarray]] = []

    def fit_fold(train: np.ndarray, rows: np.ndarray) -> np.ndarray:
        seen.append((train, rows))
        return np.zeros((6, 6))

    folds = cross_validate([[FOLD, np.array([3, 4, 5])]], TRIPLETS, fit_fold)
    assert [f[0].tolist() for f in folds] == [[0, 1, 2], [3, 4, 5]]
    for train, rows in seen:
        assert len(train) and not np.isin(train, rows).any()
    assert seen[0][0].tolist() == [[3, 4, 5]] and seen[1][0].tolist() == [[0, 1, 2], [1, 2, 0]]


def test_oriented_triplets_put_the_chosen_reference_second_and_drop_skips_and_strangers():
    index = {"a": 0, "b": 1, "c": 2}
    rows = [{"anchor": "a", "ref_j": "b", "ref_k": "c", "choice": "j"},
            {"anchor": "a", "ref_j": "b", "ref_k": "c", "choice": "k"},
            {"anchor": "b", "ref_j": "a", "ref_k": "c", "choice": "skip"},
            {"anchor": "a", "ref_j": "b", "ref_k": "zzz", "choice": "j"},
            {"anchor": "c", "ref_j": "a", "ref_k": "b", "choice": "k"}]
    out = oriented_triplets(rows, index)
    assert out.dtype == np.int64 and out.tolist() == [[0, 1, 2], [0, 2, 1], [2, 1, 0]]
    assert oriented_triplets([], index).shape == (0, 3)


def test_protocol_summary_pools_an_anchor_and_resamples_patients():
    ids = ["a", "b", "c", "d"]
    records = np.array([[0, 1], [0, 0], [1, 1], [2, 0], [3, 1]])
    patients = {"a": "P", "b": "P", "c": "Q", "d": "R"}
    s = protocol_summary(records, ids, patients, n_boot=400)
    assert s["per_anchor"] == {"a": 0.5, "b": 1.0, "c": 0.0, "d": 1.0}
    assert s["balanced"] == pytest.approx(0.625) and (s["n"], s["n_anchors"], s["n_patients"]) == (5, 4, 3)
    assert 0.0 <= s["ci"][0] < s["balanced"] < s["ci"][1] <= 1.0
    one = protocol_summary(records, ids, dict.fromkeys(ids, "P"), n_boot=200)
    assert one["ci"] == [pytest.approx(0.625)] * 2  # one patient: nothing to resample
    assert protocol_summary(np.zeros((0, 2), np.int64), ids, patients)["balanced"] is None


def test_patient_bootstrap_is_wider_than_one_patient_per_photo_would_say():
    per_anchor = {f"x{n}": float(n % 2) for n in range(40)}
    by_patient = {a: f"P{int(a[1:]) % 2}" for a in per_anchor}  # two patients, each all right or all wrong
    lone = {a: a for a in per_anchor}
    wide, narrow = patient_bootstrap_ci(per_anchor, by_patient), patient_bootstrap_ci(per_anchor, lone)
    assert wide[1] - wide[0] > narrow[1] - narrow[0]
    assert all(np.isnan(patient_bootstrap_ci({}, {})))


def test_paired_test_compares_patients_not_photos():
    patients = {f"x{n}": f"P{n // 2}" for n in range(12)}
    a = [{"anchor": f"x{n}", "accuracy": 0.8 + 0.01 * (n % 3)} for n in range(12)]
    b = [{"anchor": f"x{n}", "accuracy": 0.5} for n in range(12)]
    t = patient_paired_test(a, b, patients)
    assert t["n_patients"] == 6 and t["mean_diff"] > 0.29 and t["t_p"] < 0.01
    same = patient_paired_test(a, a, patients)
    assert same["mean_diff"] == 0 and same["wilcoxon_p"] == 1.0


def test_paired_claim_holds_only_when_the_one_sided_test_says_so():
    assert paired_claim("a > b", [61.0, 62.0, 63.5, 64.0], [60.0, 60.5, 61.0, 62.5])["holds"] is True
    assert paired_claim("b > a", [60.0, 60.5, 61.0], [61.0, 62.0, 63.5])["holds"] is False
    assert paired_claim("a > b", [61.0, 62.0], [60.0, 61.0])["p"] is None
    with pytest.raises(ValueError, match="2 matched pairs"):
        paired_claim("a > b", [1.0], [0.0])
