"""Every converted benchmark runs its quick setting into a temporary results folder and writes a
result file that the renderer accepts; bad flag combinations exit 2 before any work."""
from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

import numpy as np
import pytest

from benchmarks.results import REQUIRED, render

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
# every benchmarks/*.py and the test that runs it with a quick / tiny setting
SMOKE = {
    "soe": "test_benchmarks_smoke.py::test_soe_quick",
    "active": "test_benchmarks_smoke.py::test_active_quick",
    "flip": "test_benchmarks_smoke.py::test_flip_quick",
    "vision_ablation": "test_benchmarks_smoke.py::test_vision_ablation_quick",
    "concepts": "test_benchmarks_smoke.py::test_concepts_quick",
    "train_triderm": "test_benchmarks_smoke.py::test_train_triderm_tiny",
    "orderings": "test_orderings.py::test_quick_run_writes_the_result_file",
    "real_vision": "test_real_vision_bench.py::test_quick_run_writes_every_row_and_a_complete_result",
    "real_vision_directions": "test_real_vision_bench.py::test_the_directions_bench_scores_each_direction_from_the_same_fits",
    "real_vision_adapt": "test_real_vision_bench.py::test_the_adaptation_bench_scores_both_rows_on_photos_it_never_"
                         "adapted_on",
    "real_retrieval": "test_real_data_benches.py::test_real_retrieval_quick_scores_frozen_and_fine_tuned_in_both_galleries",
    "active_real": "test_real_data_benches.py::test_active_real_quick_replays_both_samplers_at_every_budget",
    "readers": "test_benchmarks_smoke.py::test_readers_tiny",
    "scale": "test_benchmarks_smoke.py::test_scale_tiny",
    "segmentation": "test_benchmarks_smoke.py::test_segmentation_tiny",
    "segmentation_diagnosis": "test_segmentation_diagnosis.py::test_every_part_on_a_tiny_set",
    "segmentation_default": "test_benchmarks_smoke.py::test_segmentation_default_tiny",
    "app_latency": "test_benchmarks_smoke.py::test_app_latency_tiny",
    "followup": "test_followup.py::test_benchmark_quick",
    "gpu": "test_benchmarks_smoke.py::test_gpu_rows_quick_on_the_cpu",
    "cli_startup": "test_benchmarks_smoke.py::test_cli_startup_one_job",
    "results": "test_results.py (the renderer every quick run above feeds)",
}


def _run_quick(name: str, tmp_path, *extra: str) -> dict:
    main = importlib.import_module(f"benchmarks.{name}").main
    out = tmp_path / "results"
    assert main(["--quick", "--results", str(out), *extra]) == 0
    record = json.loads((out / f"{name}.json").read_text(encoding="utf-8"))
    assert set(REQUIRED) <= set(record) and record["section"] == name and record["synthetic"] is True
    assert record["title"].endswith("[quick]") and "--quick" in record["command"]
    assert record["tables"] and all(t["rows"] for t in record["tables"])
    assert f"## {record['title']}" in render(out)
    return record


def test_gpu_rows_quick_on_the_cpu(tmp_path):
    """The GPU benchmark's CPU side, one row (the GPU rows need CUDA: a machine without it says so, exit 2)."""
    record = _run_quick("gpu", tmp_path, "--devices", "cpu", "--rows", "soe")
    (row,) = record["tables"][0]["rows"]
    assert row[1] == "s per fit" and row[2].startswith("cpu (held-out ") and row[3] > 0 and row[4] is None
    if not __import__("torch").cuda.is_available():
        from benchmarks.gpu import main

        with pytest.raises(SystemExit) as stop:
            main(["--quick", "--results", str(tmp_path), "--rows", "soe"])
        assert stop.value.code == 2


def test_cli_startup_one_job(capsys):
    """One timed run of one job's --help (the benchmark prints; it writes no result file)."""
    from benchmarks.cli_startup import main

    assert main(["--runs", "1", "--only", "embed"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"python -m core\.embed --help\s+\d+\.\d+\s+\d+\.\d+\s+none", out), out


def test_soe_quick(tmp_path, demo_workspace):
    record = _run_quick("soe", tmp_path, "--workspace", str(demo_workspace.root))
    methods = [row[0] for row in record["tables"][0]["rows"]]
    assert methods[:2] == ["this SOE, default (δ = 0.1, full batch, 100 steps)",
                           "this SOE, paper protocol (δ = 0, batch 2048, 50 epochs)"]
    assert all(0 <= row[4] <= 100 for row in record["tables"][0]["rows"]) and record["seeds"] == [0]


def test_active_quick(tmp_path, demo_workspace):
    record = _run_quick("active", tmp_path, "--workspace", str(demo_workspace.root))
    rows = record["tables"][0]["rows"]
    assert [r[0] for r in rows] == [1, 5, 25, 100] and record["seeds"] == [0, 1]
    assert rows[-1][2] == rows[-1][3]  # at 100 % both samplers fit the same triplets with the same seed
    assert len(record["claims"]) == 3 and all(isinstance(c["holds"], bool) for c in record["claims"])


def test_active_planted_draws_questions_and_writes_its_section(tmp_path, monkeypatch):
    from benchmarks.active import PLANTED_BUDGETS, main
    from core.text import sampling

    monkeypatch.setattr(sampling, "ENUMERATE_MAX", 1000)  # 40 objects' 29,640 questions are drawn, not listed
    assert main(["--planted", "40", "--seeds", "0", "1", "--results", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "active_scale.json").read_text(encoding="utf-8"))
    rows = record["tables"][0]["rows"]
    assert [r[1] for r in rows] == [round(b * 500 * 40) for b in PLANTED_BUDGETS] and record["synthetic"] is True
    assert rows[-1][2]["mean"] > rows[0][2]["mean"] + 10  # more questions, closer to the planted order
    assert len(record["claims"]) == len(PLANTED_BUDGETS) - 1 and f"## {record['title']}" in render(tmp_path)
    with pytest.raises(SystemExit):
        main(["--planted", "40", "--quick"])


@pytest.mark.slow
def test_flip_quick(tmp_path):
    record = _run_quick("flip", tmp_path)
    rows = record["tables"][0]["rows"]
    assert [r[0] for r in rows] == [0, 0.5] and rows[0][3] == rows[0][5] == 1 and all(r[4] > 0 for r in rows)


@pytest.mark.slow
def test_vision_ablation_quick(tmp_path, demo_workspace):
    record = _run_quick("vision_ablation", tmp_path, "--workspace", str(demo_workspace.root))
    rows = record["tables"][0]["rows"]
    assert len(rows) == 1 + 6 + 1 and len(record["claims"]) == 3
    assert rows[-1][0] == "latent truth (the planted ceiling)" and 50 < rows[-1][3] <= 100


@pytest.mark.slow
def test_concepts_quick(tmp_path, demo_workspace):
    record = _run_quick("concepts", tmp_path, "--workspace", str(demo_workspace.root))
    assert record["tables"][0]["columns"] == ["concept", "untrained", "clip", "make", "conceptclip"]


def test_readers_tiny(capsys):
    from benchmarks.readers import main
    assert main(["--width", "400", "--height", "300", "--wounds", "12", "--repeats", "1"]) == 0
    stages = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert stages and all(s["wounds"] == 12 for s in stages if "wounds" in s)


@pytest.mark.slow
def test_scale_tiny(capsys, tmp_path):
    from benchmarks.scale import STAGES, main
    assert main(["--sizes", "20", "30", "--results", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "SOE" in out and "growth" in out.lower()
    record = json.loads((tmp_path / "scale.json").read_text(encoding="utf-8"))
    assert set(REQUIRED) <= set(record) and record["synthetic"] is True
    rows = record["tables"][0]["rows"]
    assert [r[0] for r in rows] == list(STAGES) and all(r[1] > 0 and r[2] > 0 for r in rows)
    assert f"## {record['title']}" in render(tmp_path)


@pytest.mark.slow
def test_segmentation_tiny(tmp_path, tiny_phantom):
    from benchmarks.segmentation import main
    data = tiny_phantom(0, 8, 4, 12, 10)
    argv = ["--fuseg", str(data), "--medetec", str(data), "--folds", "2", "--fold-seeds", "2", "--epochs", "1",
            "--source-epochs", "1", "--quiet", "--section", "segmentation_smoke", "--results", str(tmp_path)]
    assert main(argv) == 0
    record = json.loads((tmp_path / "segmentation_smoke.json").read_text(encoding="utf-8"))
    tables = {t["caption"].split(" (")[0]: t["rows"] for t in record["tables"]}
    rows = [row[0] for row in tables["In-source folds and cross-source transfer"]]
    assert any("Otsu" in r for r in rows) and len(rows) == 4
    assert not any("zero-shot" in r or "default" in r for r in rows)  # the shipped default: segmentation_default
    first, second, spread = tables["Training seeds of the fuseg-dev 2-fold networks"]
    assert (first[0], second[0]) == ("0, 1 (the rows above)", "2, 3") and spread[3] is None
    assert first[2] == tables["In-source folds and cross-source transfer"][0][2]  # the first set is the main row
    assert spread[2]["n"] == 2 and spread[2]["mean"] == pytest.approx((first[2]["mean"] + second[2]["mean"]) / 2)


@pytest.mark.slow
def test_segmentation_ablation_tiny(tmp_path, tiny_phantom):
    """``--part ablation``: each variant trained on the same folds and seeds; the recipe's row is the main
    section's networks (its first seed set, scored with the ablation's flips), and a claim per variant against it."""
    from benchmarks.segmentation import ABLATION, ABLATION_FLIPS, main
    data = tiny_phantom(0, 8, 4, 12, 10)
    common = ["--fuseg", str(data), "--medetec", str(data), "--folds", "2", "--fold-seeds", "2", "--epochs", "1",
              "--quiet", "--results", str(tmp_path)]
    assert main([*common, "--part", "ablation", "--section", "ablation_smoke"]) == 0
    assert main([*common, "--source-epochs", "1", "--section", "sources_smoke"]) == 0
    record = json.loads((tmp_path / "ablation_smoke.json").read_text(encoding="utf-8"))
    table, other_source = record["tables"]
    assert [r[0] for r in table["rows"]] == [r[0] for r in other_source["rows"]] == list(ABLATION)
    flips = next(t for t in json.loads((tmp_path / "sources_smoke.json").read_text(encoding="utf-8"))["tables"]
                 if t["caption"].startswith("Test-time flips"))
    four = next(r for r in flips["rows"] if r[0].startswith(f"{ABLATION_FLIPS} "))
    # the same networks: the recipe's first seed set is the main section's, scored with the ablation's flips
    assert table["rows"][0][5].split(", ")[0] == f"{four[2]['mean']:.3f}"
    steps = [v.step for v in ABLATION.values()][1:]
    assert [c["claim"].split(" adds Dice")[0] for c in record["claims"]] == steps * 2


def test_segmentation_ablation_claims_point_from_the_step():
    """Each claim is "the step adds Dice": the recipe over a variant that lacks a step the recipe has, and a
    variant over the recipe for a step the recipe lacks. The recipe scores higher than every variant here."""
    from argparse import Namespace

    from benchmarks.segmentation import ABLATION, ABLATION_TARGETS, ablation_report
    rng = np.random.default_rng(0)
    level = {name: 0.8 if name == next(iter(ABLATION)) else 0.6 for name in ABLATION}
    wound = {"dice": 0.5, "no_edit": False}

    def photos(name: str) -> list[dict]:
        return [{"group": f"g{g}", "dice": level[name] + rng.normal(0, 0.02), "iou": 0.5, "boundary_f": 0.5,
                 "wounds": [wound]} for g in range(12)]

    out = {"ablation": {t: {name: [photos(name), photos(name)] for name in ABLATION} for t in ABLATION_TARGETS}}
    _, claims, _ = ablation_report(Namespace(seed=0, folds=2, fold_seeds=2, epochs=1), out)
    in_recipe = [v.in_recipe for v in ABLATION.values()][1:]
    assert any(in_recipe) and not all(in_recipe)  # steps both ways: one the recipe has, one it lacks
    assert [c["holds"] for c in claims] == in_recipe * 2  # a step the recipe lacks lowers Dice: its claim fails


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.skipif(not Path("/usr/bin/chromium").exists(), reason="Debian chromium is not installed")
def test_app_latency_tiny(capsys):
    from benchmarks.app_latency import main
    assert main(["--presses", "5", "--photos", "8", "--runs", "1"]) == 0
    out = capsys.readouterr().out
    assert "UMAP stored (after the first computation)" in out and "median ms" in out


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.skipif(not Path("/usr/bin/chromium").exists(), reason="Debian chromium is not installed")
def test_app_latency_upload_tiny(capsys):
    from benchmarks.app_latency import main
    assert main(["--upload", "2", "--runs", "1"]) == 0
    out = capsys.readouterr().out
    assert "Upload of 2 phone photos" in out and "the data layer alone" in out


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.skipif(not Path("/usr/bin/chromium").exists(), reason="Debian chromium is not installed")
def test_app_latency_worklist_and_zoom_tiny(capsys):
    from benchmarks.app_latency import main
    assert main(["--worklist", "--zoom", "--presses", "5", "--photos", "8"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith(("| outline page: N", "| Triplets: W"))]
    cells = [line.split("|")[1:-1] for line in rows]  # case, median … max, median / target, presses, load average
    assert len(cells) == 2 and all(c[6].strip() == "5" and float(c[7]) > 0 for c in cells)  # five presses each


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.skipif(not Path("/usr/bin/chromium").exists(), reason="Debian chromium is not installed")
def test_app_latency_after_job_opens_explore_on_the_map_the_job_stored(capsys):
    from benchmarks.app_latency import main
    assert main(["--after-job=--mode frozen", "--photos", "8"]) == 0
    out = capsys.readouterr().out
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith(("| first visit", "| second visit"))]
    assert len(rows) == 2 and all(float(r[1]) > 0 for r in rows)
    # the page drew the UMAP the job stored (no instant MDS while one is computed) of the run it opens on: in frozen
    # mode the job's second run, the raw mean-pool baseline (the newest untrained run)
    assert all(r[4].strip() == "UMAP of run 2 (photos)" for r in rows), rows
    assert re.search(r"run 2 vision-baseline; [1-9]\d* UMAP file\(s\) stored by the job", out)


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.skipif(not Path("/usr/bin/chromium").exists(), reason="Debian chromium is not installed")
def test_app_latency_triplets_writes_its_result_file(tmp_path):
    from benchmarks.app_latency import main
    assert main(["--triplets", "--presses", "5", "--photos", "8", "--loads", "0", "--results", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "app_latency.json").read_text(encoding="utf-8"))
    (table,) = record["tables"]
    assert table["columns"][3:6] == ["next_triplet_median_ms", "next_triplet_p90_ms", "undo_median_ms"]
    (row,) = table["rows"]
    assert row[0] == "this checkout" and row[-1] == 5 and 0 < row[3] <= row[4]


@pytest.mark.parametrize(("name", "argv", "message"), [
    ("soe", ["--repeats", "0"], "--repeats"),
    ("active", ["--seeds", "0"], "two distinct --seeds"),
    ("active", ["--seeds", "1", "1"], "two distinct --seeds"),
    ("vision_ablation", ["--seeds", "3"], "two distinct --seeds"),
    ("vision_ablation", ["--epochs", "0"], "--epochs"),
    ("concepts", ["--epochs", "0"], "--epochs"),
    ("flip", ["--rates", "1.5"], "--rates"),
    ("flip", ["--steps", "0"], "--steps"),
    ("app_latency", ["--upload", "0"], "--upload must be 1 to"),
])
def test_bad_flags_exit_2_before_any_work(tmp_path, capsys, name, argv, message):
    main = importlib.import_module(f"benchmarks.{name}").main
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--results", str(tmp_path)])
    assert exc.value.code == 2 and message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_every_benchmark_has_a_smoke_run():
    """A new benchmark needs a quick run in the suite (listed in SMOKE, with an existing test)."""
    assert {p.stem for p in BENCHMARKS.glob("*.py") if p.stem != "__init__"} == set(SMOKE)
    for where in SMOKE.values():
        module, _, test = where.split(" ")[0].partition("::")
        source = (Path(__file__).parent / module).read_text(encoding="utf-8")
        assert not test or f"def {test}(" in source, where


def test_train_triderm_tiny(tiny_phantom, imported, capsys, tmp_path):
    """The cache-vs-no-cache timing benchmark on a tiny phantom workspace (1 epoch, 2 views; demo not timed)."""
    from benchmarks.train_triderm import main

    ws = imported(tiny_phantom(5, 5, 2, 8, 30))
    out_dir = tmp_path / "results"
    assert main(["--workspace", str(ws.root), "--epochs", "1", "--views", "2", "--no-demo",
                 "--results", str(out_dir)]) == 0
    out = capsys.readouterr().out
    assert "5 photos, 8 wounds" in out and "[SYNTHETIC phantom data]" in out
    assert re.search(r"training is \d+\.\d× faster than --no-cache", out)
    record = json.loads((out_dir / "train_triderm.json").read_text(encoding="utf-8"))
    assert set(REQUIRED) <= set(record) and record["synthetic"] is True and len(record["tables"][0]["rows"]) == 8
    assert re.search(r"fit / floor \d+\.\d\d \(target ≤ 3\)", out)  # issue 52's ratios, measured in the same run
    assert re.search(r"cache / bare forward \d+\.\d\d", out) and re.search(r"bare forward / pipeline \d+\.\d", out)
    assert not any(row[0].startswith("demo") for row in record["tables"][0]["rows"]) and "## Demo wall time" in render(out_dir)
    runs = ws.store.runs(kind="vision-triderm")
    assert sorted(r["config"]["no_cache"] for r in runs) == [False, True] and all(r["status"] == "done" for r in runs)


@pytest.mark.slow
def test_segmentation_default_tiny(tmp_path, tiny_phantom):
    """The nested recipe: each fold's threshold from its inner split, Medetec rows from every fold network, the
    clinic's fine-tune paired with the same networks before it, clicks and timing; ``all`` reuses what parts wrote."""
    from benchmarks.segmentation_default import main
    data = tiny_phantom(0, 10, 5, 14, 10)
    common = ["--fuseg", str(data), "--medetec", str(data), "--folds", "2", "--epochs", "1", "--quiet", "--clinic", "4",
              "--clinic-epochs", "1", "--learning-sizes", "2", "4", "--work", str(tmp_path / "work"),
              "--results", str(tmp_path)]
    assert main([*common, "--part", "features"]) == 0
    assert main([*common, "--part", "fold", "--fold", "0"]) == 0
    assert main([*common, "--section", "seg_default_smoke"]) == 0  # features and fold 0 reused, the rest computed
    record = json.loads((tmp_path / "seg_default_smoke.json").read_text(encoding="utf-8"))
    main_table, misses, per_fold, sizes, *more = record["tables"]
    assert [t["caption"].split(":")[0] for t in more] == ["A clinic's learning curve"]  # `all` ran it on Medetec
    assert [r[1] for r in misses["rows"]] == [main_table["rows"][i][1] for i in (0, 2, 5, 4)]
    assert all(0 <= r[2]["mean"] <= 1 and 0 <= r[3]["mean"] <= 1 for r in misses["rows"])
    assert [r[0] for r in misses["rows"]] == [main_table["rows"][i][0] for i in (0, 2, 5, 4)]
    assert misses["rows"][-1][0].startswith("Medetec, 4 photos' fine-tune")
    assert [r[:2] for r in sizes["rows"]] == [["512+640", "fuseg-dev held-out"], ["512", "fuseg-dev held-out"],
                                              ["512+640", "Medetec zero-shot"], ["512", "Medetec zero-shot"]]
    assert sum(c["claim"].startswith("test-time sizes 512+640 add Dice") for c in record["claims"]) == 2
    assert [r[1] for r in main_table["rows"][:2]] == [10, 10]  # every photo scored once, held out
    assert [r[0] for r in per_fold["rows"]] == [0, 1] and all(0.3 <= r[1] <= 0.7 for r in per_fold["rows"])
    assert "fold0-of2-lite0-s0.json" in record["notes"][-1] and "fold1" not in record["notes"][-1]
    assert any(n.startswith("Click-to-outline") for n in record["notes"]) and record["claims"]
    # the flips alone (no close-up): its own cache and fold files, compared with the recipe on the folds both have
    flips = [*common, "--augmented", "0"]
    assert main([*flips, "--part", "features"]) == 0 and main([*flips, "--part", "fold", "--fold", "0"]) == 0
    assert (tmp_path / "work" / "features-fuseg-lite0-flips.pt").is_file()
    assert (tmp_path / "work" / "features-fuseg-lite0.pt").is_file()  # the recipe's: the flips and a close-up
    assert main([*common, "--part", "report", "--no-click", "--section", "seg_aug_smoke"]) == 0
    compared = json.loads((tmp_path / "seg_aug_smoke.json").read_text(encoding="utf-8"))
    table = next(t for t in compared["tables"] if t["caption"].startswith("Augmented views per photo"))
    assert [r[0] for r in table["rows"]] == ["lite0", "lite0-flips"] * 2 and "folds (0)" in table["caption"]
    assert [r[1] for r in table["rows"]] == ["fuseg-dev held-out"] * 2 + ["Medetec zero-shot"] * 2
    assert [r[1] for r in compared["tables"][0]["rows"][:2]] == [10, 10]  # the recipe's own rows are unchanged
    fold0 = json.loads((tmp_path / "work" / "fold0-of2-lite0-s0.json").read_text(encoding="utf-8"))
    assert table["rows"][0][3]["mean"] == pytest.approx(np.mean([r["dice"] for r in fold0["fuseg"]["chosen"]]))
    assert [c["claim"].split(" (")[0] for c in compared["claims"] if "lite0-flips" in c["claim"]] == [
        "lite0 adds Dice over lite0-flips on held-out fuseg-dev photos", "lite0 adds Dice over lite0-flips on Medetec zero-shot"]
    # a clinic's fine-tune with a close-up per photo: its own Medetec cache and curve files, compared in the report
    assert main([*common, "--part", "curve", "--clinic-views", "1"]) == 0
    assert (tmp_path / "work" / "features-medetec-lite0-close1.pt").is_file()
    assert (tmp_path / "work" / "curve1-of2-lite0-clinic1-s0.json").is_file()
    assert main([*common, "--part", "report", "--no-click", "--section", "seg_clinic_smoke"]) == 0
    clinic = json.loads((tmp_path / "seg_clinic_smoke.json").read_text(encoding="utf-8"))
    table = next(t for t in clinic["tables"] if t["caption"].startswith("A clinic's 4 photos' fine-tune"))
    assert [r[0] for r in table["rows"]] == [0, 1] and table["rows"][0][2] == table["rows"][1][2]  # the same photos
    assert any(c["claim"].startswith("one close-up per clinic photo adds Dice") for c in clinic["claims"])
    # a clinic's fine-tune (the decoder's head) and its variants (every trained part, with a threshold or a rate from an
    # inner split of its photos), on Medetec and on fuseg-dev's held-out fold: the same draws, compared in the report
    # with the networks before fine-tuning
    every = ["--clinic-tune", "all"]
    assert main([*common, "--part", "curve", "--clinic-set", "fuseg"]) == 0
    for clinic_set in ("medetec", "fuseg"):
        assert main([*common, *every, "--part", "curve", "--clinic-set", clinic_set, "--clinic-threshold", "inner"]) == 0
        assert main([*common, *every, "--part", "curve", "--clinic-set", clinic_set, "--clinic-lr", "inner"]) == 0
    inner = json.loads((tmp_path / "work" / "curve0-of2-lite0-fuseg-inner-all-s0.json").read_text(encoding="utf-8"))
    assert 0.3 <= inner["threshold"]["inner"] <= 0.7 and inner["inner"]["n_held_out"] >= 1
    assert [r["photo"] for r in inner["fine_tuned"]] == [r["photo"] for r in inner["fine_tuned_inner"]]
    rate = json.loads((tmp_path / "work" / "curve1-of2-lite0-lrinner-all-s0.json").read_text(encoding="utf-8"))
    assert rate["lr"] in ("0.001", "0.0001") and set(rate["lr_choice"][1]["dice"]) == {"0.001", "0.0001"}
    head = json.loads((tmp_path / "work" / "curve1-of2-lite0-s0.json").read_text(encoding="utf-8"))
    assert head["tune"] == "head" and rate["tune"] == "all"
    assert [r["photo"] for r in head["fine_tuned"]] == [r["photo"] for r in rate["fine_tuned"]]  # the same draws
    assert main([*common, "--part", "report", "--no-click", "--section", "seg_variants_smoke"]) == 0
    variants = json.loads((tmp_path / "seg_variants_smoke.json").read_text(encoding="utf-8"))
    table = next(t for t in variants["tables"] if "and its variants" in t["caption"])
    assert [r[0] for r in table["rows"]] == ["Medetec, the rest"] * 5 + ["fuseg-dev, the rest of the fold"] * 5
    assert [r[1] for r in table["rows"][:5]] == [
        "before fine-tuning", "the decoder's head alone, lr 0.001, threshold kept: a workspace run's",
        "every trained part, lr 0.001, threshold kept: a workspace run's before stop 69",
        "every trained part, lr 0.001, threshold from an inner split",
        "every trained part, lr from an inner split, threshold kept"]
    assert table["rows"][4][2] and table["rows"][4][3] == table["rows"][0][3]  # the rates chosen; the same photos
    assert sum(c["claim"].startswith("a 4 photos' fine-tune (") for c in variants["claims"]) == 8
    assert any(n.startswith("The fine-tune variants' table read from") and "curve0-of2-lite0-fuseg-lrinner-all-s0.json" in n
               for n in variants["notes"])
    # a clinic's learning curve: nested draws, every size and the networks before them scored on the same photos
    with pytest.raises(SystemExit):
        main([*common, "--part", "learning", "--clinic-lr", "inner"])
    with pytest.raises(ValueError, match="nothing is left to score"):
        main([*common, "--part", "learning", "--learning-sizes", "2", "40"])
    assert main([*common, "--part", "learning", "--clinic-set", "fuseg"]) == 0
    learnt = json.loads((tmp_path / "work" / "learning0-of2-lite0-s0.json").read_text(encoding="utf-8"))
    assert list(learnt["tuned"]) == ["2", "4"] and learnt["tune"] == "head"
    photos = [r["photo"] for r in learnt["start"]]
    assert photos and all([r["photo"] for r in rows] == photos for rows in learnt["tuned"].values())
    small, large = learnt["clinic"]["2"], learnt["clinic"]["4"]
    assert len(small) >= 2 and set(small) < set(large) and not set(photos) & set(large)  # nested; scored outside
    assert main([*common, "--part", "report", "--no-click", "--section", "seg_learning_smoke"]) == 0
    learning = json.loads((tmp_path / "seg_learning_smoke.json").read_text(encoding="utf-8"))
    table = next(t for t in learning["tables"] if t["caption"].startswith("A clinic's learning curve"))
    assert [(r[0], r[1]) for r in table["rows"]] == [(where, n) for where in ("Medetec", "fuseg-dev, held-out fold")
                                                     for n in (0, 2, 4)]
    assert sum(c["claim"].startswith("a fine-tune on a clinic's first") for c in learning["claims"]) == 4
