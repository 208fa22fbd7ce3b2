"""benchmarks/orderings.py: the result-file contract, the paired tests, and a --quick smoke run."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks.orderings import CLAIMS, FROZEN, FULL, MODALITIES, VISION, cell, main, paired, summarise
from core.phantoms import CEILINGS

KEYS = {"section", "title", "command", "seeds", "machine", "commit", "date", "seconds", "synthetic", "tables",
        "claims", "notes"}


def _fake_seed(seed: int, rng: np.random.Generator, lift: float) -> dict[str, Any]:
    rows = {}
    for n, label in enumerate([*VISION, *FROZEN, *MODALITIES]):
        b = 0.6 + 0.01 * n + lift * (label in ("attention / VICReg", MODALITIES[1])) + 0.005 * rng.standard_normal()
        rows[label] = {"balanced": b, "micro": b, "macro_f1": b, "kappa": 2 * b - 1}
    rows[MODALITIES[1]] = rows["attention / VICReg"]
    return {"seed": seed, "rows": rows, "text_triplets": 100, "expert_triplets": 50,
            "ceilings": {k: {"balanced": 0.7 + 0.03 * i, "expected": 0.7 + 0.03 * i} for i, k in enumerate(CEILINGS)}}


def _check_contract(result: dict[str, Any]) -> None:
    assert set(result) == KEYS and result["section"] == "orderings" and result["synthetic"] is True
    assert {"cpus", "platform", "python", "torch", "cuda"} <= set(result["machine"])
    for table in result["tables"]:
        assert set(table) == {"caption", "columns", "rows"}
        for row in table["rows"]:
            assert len(row) == len(table["columns"])
            for c in row:
                assert c is None or isinstance(c, (str, int, float)) or set(c) == {"mean", "sd", "ci"}
    for claim in result["claims"]:
        assert set(claim) == {"claim", "test", "p", "holds"} and isinstance(claim["holds"], bool)
        if claim["holds"]:
            assert claim["p"] < 0.05
    json.dumps(result, allow_nan=False)


def test_claims_follow_the_paired_test() -> None:
    rng = np.random.default_rng(0)
    seeds = [_fake_seed(s, rng, lift=0.05) for s in range(5)]
    result = summarise(seeds, dict(FULL), 1.0, "python -m benchmarks.orderings", "abc123")
    _check_contract(result)
    by = {c["claim"]: c for c in result["claims"]}
    assert by[CLAIMS[0][0]]["holds"] and by[CLAIMS[0][0]]["p"] < 0.01  # attention lifted by 5 pt
    assert by[CLAIMS[1][0]]["holds"]
    assert not by[CLAIMS[2][0]]["holds"]  # triplet sits *below* contrastive here
    assert not by["VICReg > triplet > contrastive (TriDerm-V)"]["holds"]
    assert not any("QUICK" in n for n in result["notes"]) and result["commit"] == "abc123"
    flat = summarise([_fake_seed(s, rng, lift=0.0) for s in range(5)], dict(FULL), 1.0, "x", "abc123")
    assert not {c["claim"]: c for c in flat["claims"]}[CLAIMS[0][0]]["holds"]


def test_cell_and_paired() -> None:
    c = cell([0.5, 0.6, 0.7])
    assert c["mean"] == pytest.approx(60.0) and c["sd"] == pytest.approx(10.0)
    assert c["ci"][0] < 60 < c["ci"][1]
    assert paired([0.7, 0.8, 0.75], [0.6, 0.7, 0.7]) < 0.05
    assert paired([0.6, 0.7, 0.7], [0.7, 0.8, 0.75]) > 0.9


@pytest.mark.slow
def test_quick_run_writes_the_result_file(tmp_path: Path, capsys) -> None:
    out = tmp_path / "orderings.json"
    assert main(["--quick", "--results", str(tmp_path)]) == 0
    result = json.loads(out.read_text())
    _check_contract(result)
    assert result["seeds"] == [0, 1] and result["command"].endswith("--quick")
    assert any("QUICK" in n for n in result["notes"])
    assert "Paired tests" in capsys.readouterr().out
