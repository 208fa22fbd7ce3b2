"""The verdict's next step (core.eval.verdict) in each case: no judgments, judgments but no trained run, a
trained run no better than the untrained one, a gain not yet beyond chance. TEST-ONLY tallies and judgments."""
from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pytest

from core.eval.verdict import GAIN, compare, triplets_for_gain, verdict, words

PATIENTS = {f"p{p}-{n}": f"p{p}" for p in range(20) for n in range(3)}  # 20 patients, 3 photos each
PHOTOS = sorted(PATIENTS)
LABELS = ("run #2, vision-finetune", "run #1, vision-baseline")


def keys() -> list[tuple[str, str, str]]:
    """Four (anchor, chosen, other) triplets per photo, the references from other patients."""
    rng = np.random.default_rng(0)
    out = []
    for a in PHOTOS:
        others = [p for p in PHOTOS if PATIENTS[p] != PATIENTS[a]]
        out += [(a, *map(str, rng.choice(others, 2, replace=False))) for _ in range(4)]
    return out


def tallies(ks, correct) -> dict:
    return {k: (int(c), 1) for k, c in zip(ks, correct)}


def fake_ws(choices: list[str]) -> SimpleNamespace:
    """A workspace whose store holds expert judgments with these choices (verdict reads nothing else
    before it finds a run missing)."""
    rows = [{"anchor": "a", "ref_j": "b", "ref_k": "c", "choice": c} for c in choices]
    return SimpleNamespace(store=SimpleNamespace(expert_triplets=lambda: rows))


def run(kind: str) -> dict:
    return {"id": 1, "kind": kind, "config": {"modality": "vision"}}


def test_only_an_untrained_run_with_judgments_says_to_train_counting_them():
    said = verdict(fake_ws(["j", "k"] * 256 + ["skip"]), [run("vision-baseline")])
    assert said["line"] == "No verdict yet: this workspace has no trained vision run to compare."
    assert said["next_step"].startswith("The workspace holds 512 answered expert judgments: start training")
    assert "Collect" not in said["next_step"]


def test_no_judgments_says_to_collect_them():
    assert verdict(fake_ws([]), [run("vision-baseline")])["next_step"].startswith("Collect expert judgments")
    skipped = verdict(fake_ws(["skip"] * 3), [run("vision-baseline")])["next_step"]
    assert skipped.startswith("Collect expert judgments on the Triplets page (3 so far, all skipped)")


def test_a_trained_run_without_the_untrained_reference_says_to_record_it():
    said = verdict(fake_ws(["j"] * 7), [run("vision-finetune")])
    assert "no untrained (frozen) vision run" in said["line"]
    assert said["next_step"].startswith("The workspace holds 7 answered expert judgments and a trained run: record")


def worse_compare() -> dict:
    """The trained run wrong on one more triplet than the untrained one for 11 patients, right for 9:
    a small negative difference, not beyond chance."""
    ks = keys()
    base = [n % 2 for n in range(len(ks))]
    trained = list(base)
    for p in range(20):
        first = PHOTOS.index(f"p{p}-0") * 4
        n = next(n for n in range(first, first + 4) if base[n] == (1 if p < 11 else 0))
        trained[n] = 1 - base[n]
    return compare(tallies(ks, trained), tallies(ks, base), PATIENTS, n_boot=200)


def test_a_worse_trained_run_is_said_plainly_and_the_step_names_a_positive_gain():
    c = worse_compare()
    assert c["difference"] < 0 and not c["beyond_chance"]
    said = words(c, *LABELS)
    assert "the trained embedding is not better than the untrained one on these 240 triplets" in said["line"]
    assert "is not beyond chance" not in said["line"]
    step = said["next_step"]
    assert "Check the outlines" in step and "Collect about" not in step
    needed = triplets_for_gain(c["n"], c["n_patients"], c["patient_sd"])
    assert needed is not None and needed > 0
    if needed > c["n"]:
        assert f"a gain of +{100 * GAIN:.0f} pp beyond chance, about {needed} held-out triplets" in step
        assert f"({needed - c['n']} more judgments" in step
    else:  # today's triplets would already show such a gain
        assert f"These 240 triplets would already show a gain of +{100 * GAIN:.0f} pp beyond chance" in step
    assert not re.search(r"−|-\d", step)  # never a negative effect as a goal


def test_a_positive_gain_not_beyond_chance_keeps_its_estimate():
    ks = keys()
    base = [n % 2 for n in range(len(ks))]
    trained = list(base)
    for p in range(20):  # right on one more triplet for 11 patients, wrong for 9: a small gain
        first = PHOTOS.index(f"p{p}-0") * 4
        n = next(n for n in range(first, first + 4) if base[n] == (0 if p < 11 else 1))
        trained[n] = 1 - base[n]
    c = compare(tallies(ks, trained), tallies(ks, base), PATIENTS, n_boot=200)
    said = words(c, *LABELS)
    assert c["difference"] > 0 and "is not beyond chance on these 240 triplets" in said["line"]
    assert said["next_step"].startswith(f"Collect about {c['needed'] - c['n']} more judgments")


@pytest.mark.parametrize("sd, gain", [(0.0, 0.05), (0.1, 0.0), (0.1, -0.02), (float("nan"), 0.05)])
def test_no_estimate_without_a_spread_or_a_positive_gain(sd, gain):
    assert triplets_for_gain(240, 20, sd, gain) is None


def test_the_estimate_grows_with_the_spread_and_shrinks_with_the_gain():
    small, large = triplets_for_gain(240, 20, 0.05), triplets_for_gain(240, 20, 0.2)
    assert small < large and triplets_for_gain(240, 20, 0.2, 0.1) < large
    # a spread of 0.05 and a gain of 0.05: t = sqrt(P) ≥ t_crit(P − 1) first at P = 7 patients (2.65 ≥ 2.45);
    # 20 patients are more than enough (today's 240), 3 patients with 30 triplets need 7 · 10
    assert small == 240 and triplets_for_gain(30, 3, 0.05) == 70
