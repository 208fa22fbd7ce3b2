"""The workspace's verdict (core.eval.verdict): the trained run against the untrained one on their common
held-out triplets, paired over patients, in words. TEST-ONLY runs and judgments."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from core.eval.verdict import REAL_CURVE, REAL_PLATEAU, compare, curve_step, per_anchor, verdict, words

REPO = Path(__file__).resolve().parents[2]

PATIENTS = {f"p{p}-{n}": f"p{p}" for p in range(20) for n in range(3)}  # 20 patients, 3 photos each
PHOTOS = sorted(PATIENTS)


def triplets(per_anchor_n: int = 4) -> list[tuple[str, str, str]]:
    """``per_anchor_n`` (anchor, chosen, other) triplets per photo, the references from other patients."""
    rng = np.random.default_rng(0)
    out = []
    for a in PHOTOS:
        others = [p for p in PHOTOS if PATIENTS[p] != PATIENTS[a]]
        for _ in range(per_anchor_n):
            j, k = rng.choice(others, 2, replace=False)
            out.append((a, str(j), str(k)))
    return out


def tallies(keys, correct) -> dict:
    return {key: (int(c), 1) for key, c in zip(keys, correct)}


def test_a_large_difference_is_beyond_chance_and_says_so():
    keys = triplets()
    trained = tallies(keys, [1] * len(keys))
    untrained = tallies(keys, np.random.default_rng(2).integers(0, 2, len(keys)))  # about half right
    c = compare(trained, untrained, PATIENTS, n_boot=200)
    assert c["n"] == len(keys) and c["n_patients"] == 20
    assert c["trained"]["balanced"] == 1.0 and 0.4 < c["untrained"]["balanced"] < 0.6
    assert c["beyond_chance"] and c["p"] < 0.05 and c["difference_ci"][0] > 0 and c["needed"] is None
    said = words(c, "run #2, vision-finetune", "run #1, vision-baseline")
    assert "100.0 %" in said["line"] and f"{100 * c['untrained']['balanced']:.1f} %" in said["line"]
    assert "is beyond chance on these 240" in said["line"]
    assert said["next_step"].startswith("Use the trained embedding")


def test_a_small_difference_is_not_beyond_chance_and_the_next_step_estimates_more_judgments():
    keys = triplets()
    base = [n % 2 for n in range(len(keys))]
    trained = list(base)
    for p in range(20):  # one triplet of each patient's first photo flips: right for 11 patients, wrong for 9
        first = PHOTOS.index(f"p{p}-0") * 4
        n = next(n for n in range(first, first + 4) if base[n] == (0 if p < 11 else 1))
        trained[n] = 1 - base[n]
    c = compare(tallies(keys, trained), tallies(keys, base), PATIENTS, n_boot=200)
    assert 0 < c["difference"] < 0.05 and not c["beyond_chance"] and c["p"] > 0.05
    assert c["needed"] > c["n"]
    said = words(c, "run #2, vision-finetune", "run #1, vision-baseline")
    assert "is not beyond chance on these 240 triplets" in said["line"]
    assert f"Collect about {c['needed'] - c['n']} more judgments (an estimate" in said["next_step"]


def test_runs_on_different_triplet_sets_are_compared_on_the_common_ones():
    keys = triplets()
    held_out = keys[::3]  # the trained run's strict held-out triplets: a subset (as 331 of 490)
    trained = tallies(held_out, [1] * len(held_out))
    untrained = tallies(keys, [n % 3 != 0 for n in range(len(keys))])  # wrong on exactly the held-out ones
    c = compare(trained, untrained, PATIENTS, n_boot=200)
    assert c["n"] == len(held_out) and c["n_untrained_only"] == len(keys) - len(held_out) and c["n_trained_only"] == 0
    # the untrained figure is its agreement on the common triplets only (0 %), not on all of them (2/3)
    assert c["untrained"]["balanced"] == 0.0 and np.mean(list(per_anchor(untrained, keys).values())) > 0.6
    assert c["difference"] == 1.0 and c["beyond_chance"] and c["test"] == "Wilcoxon signed-rank test over 20 patients"


def test_verdict_of_a_workspace_pairs_the_newest_trained_run_with_the_untrained_one(demo_workspace):
    from core.runtime import save_embeddings

    ws = demo_workspace
    ids = [im["image_id"] for im in ws.store.images()]
    rng = np.random.default_rng(1)
    base = ws.store.start_run("vision-baseline", {"modality": "vision", "test_only": True}, name="TEST-ONLY")
    save_embeddings(ws, base, ids, image_emb=rng.normal(size=(len(ids), 4)))
    ws.store.finish_run(base)
    assert verdict(ws, [ws.store.run(base)])["line"] == ("No verdict yet: this workspace has no trained vision run "
                                                         "to compare.")
    expert = [t for t in ws.store.expert_triplets() if t["choice"] in ("j", "k")]
    strict = [[t["anchor"], *((t["ref_j"], t["ref_k"]) if t["choice"] == "j" else (t["ref_k"], t["ref_j"])), 1, 1]
              for t in expert[::2]]
    trained = ws.store.start_run("vision-finetune", {"modality": "vision", "supervise": "triplets",
                                                     "test_only": True}, name="TEST-ONLY")
    save_embeddings(ws, trained, ids, image_emb=rng.normal(size=(len(ids), 4)))
    ws.store.finish_run(trained, metrics={"cv": {"protocol": "strict", "per_triplet": strict}})
    found = verdict(ws, [ws.store.run(trained), ws.store.run(base)], n_boot=100)
    assert (found["trained_run"], found["untrained_run"]) == (trained, base)
    assert found["n"] == len({tuple(s[:3]) for s in strict}) < len(expert)
    assert found["trained"]["balanced"] == 1.0
    assert found["line"].startswith(f"The trained embedding (run #{trained}, vision-finetune) agrees with the expert")
    assert found["next_step"].endswith(curve_step(len(expert)))  # the demo's 490 judgments: past the plateau
    assert "past that point" in found["next_step"]


def test_the_learning_curve_the_next_step_quotes_is_the_stored_one():
    """:data:`~core.eval.verdict.REAL_CURVE` and its plateau are results/learning_curve.json's uniform means:
    regenerating that file makes this test name every figure that moved."""
    stored = json.loads((REPO / "results" / "learning_curve.json").read_text())
    rows = {row[0]: row[2]["mean"] for row in stored["tables"][0]["rows"]}
    means = {0 if str(b).startswith("0 ") else b: round(m, 1) for b, m in rows.items() if b != "all of the fold's pool"}
    assert {n: pct for n, pct in REAL_CURVE} == {n: means[n] for n, _ in REAL_CURVE}
    assert f"uniform {REAL_PLATEAU} triplets" in " ".join(stored["notes"])


def test_the_curve_says_how_many_more_judgments_below_its_plateau():
    assert curve_step(100).endswith(f"about {REAL_PLATEAU - 100} more judgments (from 100) would bring this workspace "
                                    "there.")
    assert "63.3 % untrained to 70.1 % at 100, 73.1 % at 250, 73.9 % at 500 training triplets" in curve_step(100)
    assert "past that point" in curve_step(REAL_PLATEAU)
