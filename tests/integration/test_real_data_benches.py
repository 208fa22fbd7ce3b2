"""Smoke runs of ``benchmarks/real_retrieval.py`` and ``benchmarks/active_real.py`` (issue 53) with ``--quick`` on a
tiny SYNTHETIC phantom dataset folder (the phantom's ``body_region`` standing in for a wound type): every row and
key present, CIs ordered, claims only from paired tests."""
from __future__ import annotations

import json

import pytest

from benchmarks import active_real, real_retrieval
from benchmarks.results import REQUIRED


@pytest.fixture(scope="module")
def tiny_dataset(tiny_phantom):
    return tiny_phantom(7, 10, 6, 14, 120)


def check_cells(res: dict) -> None:
    assert set(REQUIRED) <= set(res) and res["synthetic"] is False and "--quick" in res["command"]
    for claim in res["claims"]:
        assert claim["holds"] == ("mean difference +" in claim["test"] and claim["p"] < 0.05)
    for table in res["tables"]:
        for row in table["rows"]:
            for c in row:
                if isinstance(c, dict) and c.get("mean") is not None and c.get("ci"):
                    assert c["ci"][0] <= c["mean"] <= c["ci"][1]


@pytest.mark.slow
def test_real_retrieval_quick_scores_frozen_and_fine_tuned_in_both_galleries(tiny_dataset, tmp_path):
    argv = ["--data", str(tiny_dataset), "--label", "body_region", "--quick", "--results", str(tmp_path), "--quiet"]
    assert real_retrieval.main(argv) == 0
    res = json.loads((tmp_path / "real_retrieval.json").read_text())
    check_cells(res)
    rows = res["tables"][0]["rows"]
    assert {r[0] for r in rows} == {real_retrieval.CHANCE, real_retrieval.FROZEN, real_retrieval.FINETUNE}
    assert {r[1] for r in rows} == set(real_retrieval.GALLERIES)


@pytest.mark.slow
def test_active_real_quick_replays_both_samplers_at_every_budget(tiny_dataset, tmp_path):
    assert active_real.main(["--data", str(tiny_dataset), "--quick", "--results", str(tmp_path), "--quiet"]) == 0
    res = json.loads((tmp_path / "active_real.json").read_text())
    check_cells(res)
    budgets = [r[0] for r in res["tables"][0]["rows"] if isinstance(r[0], float)]
    assert budgets == [100 * b for b in active_real.QUICK_BUDGETS]
