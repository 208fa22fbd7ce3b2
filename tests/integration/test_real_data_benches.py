"""Smoke runs of ``benchmarks/real_retrieval.py`` and ``benchmarks/active_real.py`` (both learners; issue 53) with
``--quick`` on a tiny SYNTHETIC phantom dataset folder (the phantom's ``body_region`` standing in for a wound type):
every row and key present, CIs ordered, claims only from paired tests."""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from benchmarks import active_real, real_retrieval
from benchmarks.results import REQUIRED


@pytest.fixture(scope="module")
def tiny_dataset(tiny_phantom):
    return tiny_phantom(7, 10, 6, 14, 120)


def quick_result(main: Callable[[list[str]], int], section: str, data: Path, results: Path, *extra: str) -> dict:
    """Run a benchmark's ``main`` with --quick into ``results`` and return its checked result record."""
    assert main(["--data", str(data), *extra, "--quick", "--results", str(results), "--quiet"]) == 0
    res = json.loads((results / f"{section}.json").read_text())
    check_cells(res)
    return res


def check_cells(res: dict) -> None:
    assert set(REQUIRED) <= set(res) and res["synthetic"] is False and "--quick" in res["command"]
    for claim in res["claims"]:
        positive = "mean difference +" in claim["test"] or claim["test"].startswith("one-sided")
        assert claim["holds"] == (positive and claim["p"] is not None and claim["p"] < 0.05)
    for table in res["tables"]:
        for row in table["rows"]:
            for c in row:
                if isinstance(c, dict) and c.get("mean") is not None and c.get("ci"):
                    assert c["ci"][0] <= c["mean"] <= c["ci"][1]


@pytest.mark.slow
def test_real_retrieval_quick_scores_frozen_and_fine_tuned_in_both_galleries(tiny_dataset, tmp_path):
    res = quick_result(real_retrieval.main, "real_retrieval", tiny_dataset, tmp_path, "--label", "body_region")
    rows = res["tables"][0]["rows"]
    assert {r[0] for r in rows} == {real_retrieval.CHANCE, real_retrieval.FROZEN, real_retrieval.FINETUNE,
                                    real_retrieval.INFERENCE_ROW}
    assert {r[1] for r in rows} == set(real_retrieval.GALLERIES)
    views, inference = (next(r for r in rows if r[0] == name and r[1] == "strict")
                        for name in (real_retrieval.FINETUNE, real_retrieval.INFERENCE_ROW))
    assert views[-1] > 0 and inference[-1] == 0  # another embedding of the same fits: no fit of its own


@pytest.mark.slow
def test_active_real_quick_replays_both_samplers_at_every_budget(tiny_dataset, tmp_path):
    res = quick_result(active_real.main, "active_real", tiny_dataset, tmp_path)
    budgets = [r[0] for r in res["tables"][0]["rows"] if isinstance(r[0], float)]
    assert budgets == [100 * b for b in active_real.QUICK_BUDGETS]


@pytest.mark.slow
def test_learning_curve_quick_scores_the_fine_tuned_default_at_counts_and_the_whole_pool(tiny_dataset, tmp_path):
    res = quick_result(active_real.main, "learning_curve", tiny_dataset, tmp_path, "--learner", "finetune")
    assert "Learning curve in judgments" in res["title"]
    rows = res["tables"][0]["rows"]
    counts, whole = active_real.LEARNERS["finetune"][1][:-1], rows[-2]
    assert [r[0] for r in rows[:-2]] == list(counts) and whole[0] == "all of the fold's pool"
    assert all(r[1] < whole[1] for r in rows[:-2]) and rows[-1][1] == 0  # the counts sit below the pool here
    assert whole[2] == whole[3] and whole[4] == whole[5]  # the whole pool: both samplers hold the same triplets
    assert any("frozen centred" in c["claim"] for c in res["claims"])
    assert any("Pool per fold" in n for n in res["notes"])
