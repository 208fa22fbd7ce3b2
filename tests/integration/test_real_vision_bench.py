"""Smoke run of ``benchmarks/real_vision.py --quick`` on a tiny phantom dataset folder (with and
without triplets): every row present, the result file complete, claims only from paired tests."""
from __future__ import annotations

import json
import shutil

import pytest

from benchmarks.real_vision import FROZEN, LINEAR, NESTED, SCALES_ROW, VIEWS_ROW, configurations_tried, main


@pytest.fixture(scope="module")
def tiny_dataset(tiny_phantom):
    return tiny_phantom(7, 10, 6, 14, 120)


@pytest.mark.slow
def test_quick_run_writes_every_row_and_a_complete_result(tiny_dataset, tmp_path, capsys):
    assert main(["--data", str(tiny_dataset), "--quick", "--results", str(tmp_path), "--quiet"]) == 0
    res = json.loads((tmp_path / "real_vision.json").read_text())
    assert {"section", "title", "command", "seeds", "machine", "commit", "date", "seconds", "synthetic", "tables",
            "claims", "notes"} <= set(res)
    names = [row[0] for row in res["tables"][0]["rows"]]
    assert names[:3] == ["frozen, old tokens (stage 5), mean pooling", "frozen, new tokens (full, OS 16), mean pooling",
                         FROZEN]
    assert LINEAR in names and NESTED in names and any("--supervise triplets" in n for n in names)
    assert {VIEWS_ROW, SCALES_ROW} <= set(names)  # issue 30 §4: test-time views and multi-scale inputs
    assert res["tables"][0]["columns"][1:3] == ["strict %", "anchor unseen %"]
    for row in res["tables"][0]["rows"]:
        for c in row[1:3]:  # one pooled estimate with its patient-bootstrap CI, no sd over seeds
            assert c["sd"] is None and 0 <= c["ci"][0] <= c["mean"] <= c["ci"][1] <= 100
    cross = res["tables"][1]
    assert [r[1] for r in cross["rows"][:2]] == ["half A → half B", "half B → half A"] and "Cross-half" in cross["caption"]
    for claim in res["claims"]:
        assert claim["holds"] == ("mean difference +" in claim["test"] and claim["p"] < 0.05)
    nested = next(n for n in res["notes"] if n.startswith("nested selection scored"))
    assert "linear, head, finetune fused" in nested  # issue 30 §5: fine-tuning is a candidate of the nested search
    assert "{} self-supervised recipe configurations and {} supervised-mode".format(*configurations_tried()) in res["notes"][0]
    assert "--quick" in res["command"] and "strict" in capsys.readouterr().out


@pytest.mark.slow
def test_without_triplets_only_costs_are_measured(tiny_dataset, tmp_path):
    ds = tmp_path / "ds"
    shutil.copytree(tiny_dataset, ds)
    (ds / "triplets.csv").unlink()
    assert main(["--data", str(ds), "--quick", "--results", str(tmp_path), "--section", "bare", "--quiet"]) == 0
    res = json.loads((tmp_path / "bare.json").read_text())
    assert all(row[1] is None for row in res["tables"][0]["rows"]) and res["claims"] == []
    assert any("has no triplets" in n for n in res["notes"])


def test_search_log_counts_its_configurations(tmp_path, monkeypatch):
    assert all(n > 0 for n in configurations_tried())  # the real log parses
    log = tmp_path / "search.md"
    log.write_text("# log\n\n| # | layer |\n|---|---|\n| 1 | full |\n| 2 | stage5 |\n\nChosen: #1.\n\n"
                   "## Supervised mode\n\n- first, 70.2\n  continued on a second line\n- second\n- third\n")
    monkeypatch.setattr("benchmarks.real_vision.SEARCH_LOG", log)
    assert configurations_tried() == (2, 3)


@pytest.mark.slow
def test_the_adaptation_bench_scores_both_rows_on_photos_it_never_adapted_on(tiny_dataset, tiny_phantom, tmp_path):
    """``benchmarks.real_vision_adapt --quick``: the adapted and frozen rows, strict and anchor-unseen, and the
    paired claim; the unlabelled folder's photos (another phantom) are counted in the note."""
    from benchmarks.real_vision_adapt import ADAPTED
    from benchmarks.real_vision_adapt import main as adapt_main

    other = tiny_phantom(8, 6, 3, 8, 10)
    assert adapt_main(["--data", str(tiny_dataset), "--unlabelled", str(other), "--quick", "--results",
                       str(tmp_path), "--quiet"]) == 0
    res = json.loads((tmp_path / "real_vision_adapt.json").read_text())
    assert [row[0] for row in res["tables"][0]["rows"]] == [FROZEN, ADAPTED]
    assert all(0 <= row[1]["mean"] <= 100 and row[3] > 0 for row in res["tables"][0]["rows"])
    assert [c["claim"] for c in res["claims"]] == [
        "adapting the last stage without labels beats the frozen centred embedding (strict)"]
    assert f"6 unlabelled photos ({other.name} 6)" in res["notes"][0] and "--quick" in res["command"]


def test_the_adaptation_bench_refuses_a_folder_without_images(tiny_dataset, tmp_path, capsys):
    from benchmarks.real_vision_adapt import main as adapt_main

    with pytest.raises(SystemExit):
        adapt_main(["--data", str(tiny_dataset), "--unlabelled", str(tmp_path), "--quick", "--results", str(tmp_path)])
    assert f"{tmp_path}: no images/ folder" in capsys.readouterr().err


@pytest.mark.slow
def test_the_directions_bench_scores_each_direction_from_the_same_fits(tiny_dataset, tmp_path):
    """``benchmarks.real_vision_directions --quick``: frozen centred, one fine-tune's inference view and the three
    directions (the first, test-time views, is now the default), strict and anchor-unseen over the same triplets,
    the claims paired against the inference view and the default."""
    from benchmarks import real_vision_directions as d

    assert d.main(["--data", str(tiny_dataset), "--quick", "--results", str(tmp_path), "--quiet"]) == 0
    res = json.loads((tmp_path / "real_vision_directions.json").read_text())
    rows = res["tables"][0]["rows"]
    assert [r[0] for r in rows] == [FROZEN, d.INFERENCE_ROW, d.VIEWS_ROW, d.ENSEMBLE_ROW, d.BOTH_ROW]
    assert len({r[3] for r in rows}) == 1 and rows[0][3] > 0  # every row scored on the same strict triplets
    assert all(0 <= r[1]["mean"] <= 100 for r in rows)
    assert [c["claim"] for c in res["claims"]][:4] == [
        "test-time views beat the fine-tune's inference view alone (strict)",
        f"an ensemble of {d.MEMBERS} seeds beats one fine-tune, inference view (strict)",
        "the ensemble with test-time views beats one fine-tune, inference view (strict)",
        f"an ensemble of {d.MEMBERS} seeds adds to the default's test-time views (strict; a comparison of the "
        "pre-registered rows, not itself registered)"]
    assert all(c["holds"] == (c["p"] < 0.05 and "difference +" in c["test"]) for c in res["claims"])
