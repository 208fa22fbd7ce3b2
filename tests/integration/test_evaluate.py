"""The agreement report (``python -m core.evaluate``) on a tiny hand-built workspace."""
from __future__ import annotations

import collections
import csv
import json
import logging
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pytest

from annotations.infra.workspace import Workspace
from core.eval.distances import pairwise_euclidean
from core.eval.fusion import fuse
from core.eval.metrics import evaluate
from core.eval.report import pick_input, run_report
from core.evaluate import main
from core.runtime import save_embeddings

N = 16


def _tiny_workspace(root, synthetic: bool = True, triplets: int = 300) -> tuple[Workspace, np.ndarray]:
    """16 images with a latent 2-d truth; an 'expert' answers triplets from it (10 % flipped)."""
    ws = Workspace(root)
    rng = np.random.default_rng(0)
    truth = rng.normal(size=(N, 2))
    ids = [f"img{n:02d}" for n in range(N)]
    for image_id in ids:
        ws.store.upsert_image(image_id, f"{image_id}.png", "0" * 64, 8, 8)
    D = pairwise_euclidean(truth)
    for _ in range(triplets):
        i, j, k = rng.choice(N, 3, replace=False)
        choice = "j" if D[i, j] < D[i, k] else "k"
        if rng.random() < 0.1:
            choice = {"j": "k", "k": "j"}[choice]
        if rng.random() < 0.05:
            choice = "skip"
        ws.store.add_triplet(ids[i], ids[j], ids[k], choice, "expert:doc")
    ws.store.set_meta("synthetic", synthetic)
    return ws, truth


def _add_run(ws: Workspace, kind: str, modality: str, emb: np.ndarray, ids: list[str]) -> int:
    run_id = ws.store.start_run(kind, {"modality": modality})
    save_embeddings(ws, run_id, ids, image_emb=emb)
    ws.store.finish_run(run_id)
    return run_id


def test_report_rows_fusions_files_and_reuse(tmp_path, caplog):
    ws, truth = _tiny_workspace(tmp_path / "ws")
    rng = np.random.default_rng(1)
    ids = [f"img{n:02d}" for n in range(N)]
    baseline = _add_run(ws, "vision-baseline", "vision", rng.normal(size=(N, 4)), ids)
    vision = _add_run(ws, "vision-triderm", "vision", truth + 0.4 * rng.normal(size=truth.shape), ids)
    text = _add_run(ws, "text-soe", "text", (truth + 0.6 * rng.normal(size=truth.shape))[:-1], ids[:-1])
    running = ws.store.start_run("vision-triderm", {"modality": "vision"})  # unfinished: not reported

    with caplog.at_level(logging.INFO, logger="core"):
        result = run_report(ws, n_boot=200)
    assert "missing from the text run" in caplog.text and ids[-1] in caplog.text
    assert "fusion of runs" in caplog.text  # the library logs; it prints nothing
    by_id = {r["run_id"]: r for r in result["rows"]}
    fusion_ids = result["fusion_runs"]
    assert set(by_id) == {baseline, vision, text, *fusion_ids.values()} and running not in by_id
    assert [r["modality"] for r in result["rows"]] == ["vision", "vision", "text", "fusion", "fusion"]

    expert = ws.store.expert_triplets()
    assert evaluate(ids, pairwise_euclidean(truth), expert)["micro"] > 0.8  # the expert is informative
    fused_unc = fuse([(ids, pairwise_euclidean(_emb(ws, vision))), (ids[:-1], pairwise_euclidean(_emb(ws, text)))],
                     method="uncertainty", allow_missing=True)
    expected = evaluate(fused_unc.ids, fused_unc.D, expert, ci=True, n_boot=200)
    row = by_id[fusion_ids["uncertainty"]]
    for m in ("balanced", "micro", "macro_f1", "kappa"):
        assert row[m] == pytest.approx(expected[m])
        assert row["ci"][m] == pytest.approx(expected["ci"][m])
        assert row["ci"][m][0] <= row[m] <= row["ci"][m][1]
    assert row["n_skipped"] == sum(t["choice"] == "skip" for t in expert)
    assert row["n_missing"] > 0  # triplets naming the image the text run lacks
    assert by_id[vision]["balanced"] > by_id[baseline]["balanced"]

    fusion_run = ws.store.run(fusion_ids["uncertainty"])
    assert fusion_run["kind"] == "fusion" and fusion_run["config"]["modality"] == "fusion"
    assert fusion_run["config"]["inputs"] == [vision, text] and fusion_run["config"]["alpha"] == 0.7
    assert fusion_run["metrics"]["missing"] == {"text": [ids[-1]]}

    paths = result["paths"]
    md = Path(paths["markdown"]).read_text(encoding="utf-8")
    assert "SYNTHETIC phantom data" in md and "## fusion" in md and f"#{vision} vision-triderm" in md
    assert f"- #{vision} vision-triderm: {by_id[vision]['per_anchor'][0]['anchor']} " in md
    rows = list(csv.DictReader(Path(paths["csv"]).read_text(encoding="utf-8").splitlines()))
    assert len(rows) == 5 and float(rows[0]["balanced_lo"]) <= float(rows[0]["balanced"])
    js = json.loads(Path(paths["json"]).read_text(encoding="utf-8"))
    assert js["synthetic"] is True and len(js["rows"]) == 5 and js["rows"][0]["per_anchor"]
    report = ws.store.run(result["run_id"])
    assert report["kind"] == "report" and report["status"] == "done"
    assert report["artifacts"]["csv"] == paths["csv"]

    again = run_report(ws, n_boot=200)  # identical fusions are reused, not duplicated
    assert again["fusion_runs"] == fusion_ids
    assert len(ws.store.runs(kind="fusion")) == 2

    named = run_report(ws, vision=baseline, n_boot=50)  # a named vision run gives new fusions
    assert ws.store.run(named["fusion_runs"]["similarity"])["config"]["inputs"] == [baseline, text]


def _emb(ws: Workspace, run_id: int) -> np.ndarray:
    from core.runtime import load_embeddings

    return load_embeddings(ws, run_id)["image_emb"]


def test_an_unnamed_vision_input_is_the_default_modes_newest_fine_tuned_run(tmp_path):
    """Without --vision the report takes the newest vision-finetune run (the default mode's), even when a
    TriDerm-V run or a baseline is newer; without fine-tuned runs the newest TriDerm-V, then any vision run."""
    ws, truth = _tiny_workspace(tmp_path / "ws")
    ids = [im["image_id"] for im in ws.store.images()]
    baseline = _add_run(ws, "vision-baseline", "vision", truth, ids)
    assert pick_input(ws, "vision", None)["id"] == baseline
    triderm = _add_run(ws, "vision-triderm", "vision", truth, ids)
    assert pick_input(ws, "vision", None)["id"] == triderm
    _add_run(ws, "vision-finetune", "vision", truth, ids)
    tuned = _add_run(ws, "vision-finetune", "vision", truth, ids)
    for kind in ("vision-triderm", "vision-baseline"):  # newer runs of other kinds
        _add_run(ws, kind, "vision", truth, ids)
    assert pick_input(ws, "vision", None)["id"] == tuned
    assert pick_input(ws, "vision", triderm)["id"] == triderm  # a named run is taken as named
    soe = _add_run(ws, "text-soe", "text", truth, ids)
    _add_run(ws, "text-baseline", "text", truth, ids)
    assert pick_input(ws, "text", None)["id"] == soe


def test_cli_prints_table_and_real_title(tmp_path, capsys):
    ws, truth = _tiny_workspace(tmp_path / "ws", synthetic=False)
    ids = [f"img{n:02d}" for n in range(N)]
    _add_run(ws, "vision-triderm", "vision", truth, ids)
    assert main(["--workspace", str(ws.root), "--n-boot", "50"]) == 0
    out, err = capsys.readouterr()
    assert "#1 vision-triderm" in out and "SYNTHETIC" not in out and "no fusion" in err
    assert (ws.runs_dir / "report" / "report.md").exists()


def test_a_supervised_run_shows_its_strict_figure_never_its_in_sample_one(tmp_path, capsys):
    ws, truth = _tiny_workspace(tmp_path / "ws", synthetic=False)
    ids = [f"img{n:02d}" for n in range(N)]
    strict = {"protocol": "strict", "balanced": 0.612, "ci": [0.55, 0.67], "n": 40, "n_anchors": 9, "n_patients": 9}

    def supervised(cv: dict | None) -> int:
        run_id = ws.store.start_run("vision-triderm", {"modality": "vision", "supervise": "triplets"})
        save_embeddings(ws, run_id, ids, image_emb=truth)  # agrees with its "training" triplets in-sample
        ws.store.finish_run(run_id, metrics={"cv": cv} if cv else {})
        return run_id

    with_cv, without = supervised(strict), supervised(None)
    ssl = _add_run(ws, "vision-triderm", "vision", truth, ids)
    assert main(["--workspace", str(ws.root), "--n-boot", "50"]) == 0
    out = capsys.readouterr().out
    rows = {r["run_id"]: r for r in json.loads((ws.runs_dir / "report" / "report.json").read_text())["rows"]}
    in_sample = evaluate(ids, pairwise_euclidean(truth), ws.store.expert_triplets())["balanced"]
    assert in_sample > 0.8
    assert rows[with_cv]["balanced"] == 0.612 and rows[with_cv]["ci"]["balanced"] == [0.55, 0.67]
    assert rows[with_cv]["protocol"].startswith("strict out of fold") and rows[with_cv]["n"] == 40
    assert rows[with_cv]["in_sample_balanced"] == pytest.approx(in_sample)
    assert rows[without]["protocol"].startswith("IN-SAMPLE") and rows[ssl]["protocol"].startswith("all triplets")
    assert "61.2 [55.0, 67.0]" in out and "IN-SAMPLE" in out
    from core.eval.report import run_figure

    assert run_figure(ws.store.run(with_cv)) == " · strict out of fold 61.2 % [55.0, 67.0]"
    assert "in-sample only" in run_figure(ws.store.run(without)) and run_figure(ws.store.run(ssl)) == ""


def test_cli_user_errors_exit_2_and_change_nothing(tmp_path, capsys):
    with pytest.raises(SystemExit) as err:
        main(["--workspace", str(tmp_path / "nowhere")])
    assert err.value.code == 2 and not (tmp_path / "nowhere").exists()
    ws, truth = _tiny_workspace(tmp_path / "ws", triplets=0)
    _add_run(ws, "vision-triderm", "vision", truth, [f"img{n:02d}" for n in range(N)])
    n_runs = len(ws.store.runs())
    with pytest.raises(SystemExit) as err:
        main(["--workspace", str(ws.root)])
    assert err.value.code == 2 and "no expert triplets" in capsys.readouterr().err
    with pytest.raises(SystemExit) as err:
        main(["--workspace", str(ws.root), "--vision", "99"])
    assert err.value.code == 2
    assert len(ws.store.runs()) == n_runs


# ---------------------------------------------------------------------------------- ablation
def _add_llm_source(ws: Workspace, truth: np.ndarray, model: str, flip: float, m: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    ids = [f"img{n:02d}" for n in range(N)]
    D = pairwise_euclidean(truth)
    for _ in range(m):
        i, j, k = rng.choice(N, 3, replace=False)
        choice = "j" if (D[i, j] < D[i, k]) != (rng.random() < flip) else "k"
        ws.store.add_triplet(ids[i], ids[j], ids[k], choice, f"llm:{model}")


@pytest.mark.slow
def test_text_ablation_rows_shared_cells_and_resume(tmp_path, capsys):
    from core.ablate import main as ablate_main
    from core.experiments.ablation import run_ablation

    ws, truth = _tiny_workspace(tmp_path / "ws")
    _add_llm_source(ws, truth, "good", flip=0.05, m=600, seed=1)
    _add_llm_source(ws, truth, "coin", flip=0.5, m=400, seed=2)
    out = run_ablation(ws, seeds=2, tables=("text",))
    rows = {s["label"]: s for s in out["summary"]}
    assert list(rows) == ["dim 2", "dim 3", "dim 4", "dim 5", "dim 6", "budget 0.1%", "budget 1%",
                          "budget 10%", "budget 100%", "oracle coin", "oracle good"]
    # default source = the one with most triplets; dim 4 = budget 100 % = oracle good: one cell
    assert rows["dim 4"]["balanced_mean"] == rows["budget 100%"]["balanced_mean"] == rows["oracle good"]["balanced_mean"]
    assert out["computed"] == (5 + 3 + 1) * 2 and out["reused"] == 0
    assert all(s["seeds"] == 2 and s["balanced_sd"] >= 0 for s in out["summary"])
    assert rows["oracle good"]["balanced_mean"] > rows["oracle coin"]["balanced_mean"] + 0.15
    assert rows["budget 100%"]["balanced_mean"] > rows["budget 0.1%"]["balanced_mean"] + 0.1
    assert rows["dim 2"]["paper"] == 62.6
    n_good, n_coin = (len(ws.store.triplets(source=f"llm:{m}")) for m in ("good", "coin"))
    assert rows["budget 1%"]["n_train_triplets"] == round(0.01 * n_good)
    assert rows["oracle coin"]["n_train_triplets"] == n_coin

    assert ablate_main(["--workspace", str(ws.root), "--tables", "text", "--n-seeds", "2"]) == 0
    printed = capsys.readouterr().out
    assert "cells computed 0, reused 18" in printed and "Table 2a" in printed and "SYNTHETIC" in printed
    assert (ws.runs_dir / "ablation" / "ablation.md").exists()
    assert ws.store.runs(kind="ablation")[0]["metrics"]["cells_reused"] == 18

    _add_llm_source(ws, truth, "good", flip=0.05, m=50, seed=3)  # new data invalidates that source's cells
    again = run_ablation(ws, seeds=2, tables=("text",))
    assert again["computed"] == (5 + 3 + 1) * 2 - 2 and again["reused"] == 2  # only 'oracle coin' reused


def test_vision_ablation_calls_the_trainer_per_cell_and_seed(tmp_path, monkeypatch):
    import sys
    import types

    from core.experiments import ablation
    from core.experiments.ablation import run_ablation
    from core.vision.triderm_config import DEFAULT

    ws, truth = _tiny_workspace(tmp_path / "ws")
    ids = [f"img{n:02d}" for n in range(N)]
    calls = []
    scores: dict[tuple, dict[int, float]] = collections.defaultdict(dict)  # config -> seed -> balanced

    def fake_train(ws_, progress, seed, pooling, loss, epochs, batch_size, lr, **resolved):
        assert progress is False and set(resolved) == set(asdict(DEFAULT)) - {"seed", "pooling", "loss", "epochs",
                                                                         "batch_size", "lr"}
        calls.append((pooling, loss, batch_size, lr, seed, epochs))
        quality = ({"mean": 0.9, "attention": 0.3}[pooling] + {"vicreg": 0.0, "contrastive": 0.45, "triplet": 0.2}[loss]
                   + 0.1 * (batch_size != 32))  # a different noise level for each of the 6 configurations
        emb = truth + quality * np.random.default_rng(seed).normal(size=truth.shape)
        scores[(pooling, loss, batch_size, lr)][seed] = evaluate(ids, pairwise_euclidean(emb),
                                                                 ws_.store.expert_triplets())["balanced"]
        return _add_run(ws_, "vision-triderm", "vision", emb, ids)

    monkeypatch.setitem(sys.modules, "core.vision.triderm", types.SimpleNamespace(train=fake_train))
    monkeypatch.setattr(ablation, "backbone_identity", lambda name: {"name": name, "weights": "w"})
    out = run_ablation(ws, seeds=3, quick=True, tables=("vision",))
    configs = [("mean", "vicreg", 32, 1e-2), ("attention", "vicreg", 32, 1e-2), ("attention", "contrastive", 32, 1e-2),
               ("attention", "triplet", 32, 1e-2), ("attention", "contrastive", 128, 1e-3),
               ("attention", "triplet", 8, 1e-2)]
    assert sorted(calls) == sorted((*c, s, 10) for c in configs for s in range(3))
    # attention pooling and the VICReg loss row share their cells: 6 configurations × 3 seeds
    rows = {s["label"]: s for s in out["summary"]}
    assert list(rows) == ["pooling mean", "pooling attention", "loss vicreg", "loss contrastive", "loss triplet",
                          "loss contrastive, batch 128, lr 1e-3", "loss triplet, batch 8"]
    # every row reports the agreement of its own configuration's runs, one value per seed
    for label, config in zip(rows, [configs[0], configs[1], *configs[1:]]):
        assert rows[label]["balanced_values"] == pytest.approx([scores[config][s] for s in range(3)]), label
        assert rows[label]["balanced_mean"] == pytest.approx(np.mean([scores[config][s] for s in range(3)])), label
    assert len({tuple(v.values()) for v in scores.values()}) == 6  # so that a row showing another cell fails
    assert rows["loss triplet, batch 8"]["paper"] == 70.1 and rows["loss triplet"]["paper"] is None
    assert run_ablation(ws, seeds=3, quick=True, tables=("vision",))["computed"] == 0 and len(calls) == 18

    # the report keeps ablation-trained runs out of Table 1 and of the fusion inputs
    main_run = _add_run(ws, "vision-triderm", "vision", truth, ids)
    _add_run(ws, "vision-triderm", "vision", truth, ids)
    ws.store.update_run(ws.store.runs()[0]["id"], metrics={"ablation_cell": "x"})
    assert [r["run_id"] for r in run_report(ws, n_boot=20)["rows"]] == [main_run]
    assert len(run_report(ws, n_boot=20, include_ablation=True)["rows"]) == 20


def test_text_cell_same_seed_gives_identical_metrics(tmp_path):
    from core.eval.protocol import oriented_triplets
    from core.experiments.ablation import soe_cell, text_rows

    ws, truth = _tiny_workspace(tmp_path / "ws")
    _add_llm_source(ws, truth, "good", flip=0.1, m=300, seed=1)
    ids = [r["image_id"] for r in ws.store.images()]
    llm = oriented_triplets(ws.store.triplets(source="llm:good"), {im: n for n, im in enumerate(ids)})
    expert = ws.store.expert_triplets()
    cfg = text_rows(["llm:good"], "llm:good")[6].config  # budget 1 %: the seed also draws the subset
    assert cfg["budget"] == 0.01 and cfg["soe"]["margin"] == 0.1
    full = {**cfg, "budget": 0.5}
    shuffled = llm[np.random.default_rng(5).permutation(len(llm))]  # the store's order varies between runs
    runs = [soe_cell(ids, t, expert, c, seed) for t, c, seed in ((llm, full, 0), (shuffled, full, 0), (llm, full, 1))]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]
    assert soe_cell(ids, llm, expert, cfg, 0) == soe_cell(ids, shuffled, expert, cfg, 0)


def test_cell_key_follows_defaults_data_code_and_backbone(monkeypatch):
    from core.experiments import ablation
    from core.text.soe import SOE
    from core.vision import triderm_config

    def keys(context=None, data="d", code="c"):
        rows = ablation.text_rows(["llm:a"], "llm:a") + ablation.vision_rows(None)
        return [ablation.cell_key(r.config, 0, data, code, context) for r in rows]

    base = keys()
    assert len(base) == 10 + 7 and len(set(base)) == 8 + 6  # dim 4 = budget 100 % = oracle a; attention = vicreg
    assert keys(data="other") != base and keys(code="other") != base
    assert keys(context={"backbone": {"weights": "x"}}) != base
    defaults = list(SOE.__init__.__defaults__)
    defaults[1] = 0.2  # the SOE margin default
    monkeypatch.setattr(SOE.__init__, "__defaults__", tuple(defaults))
    changed = keys()
    assert all(c != b for c, b in zip(changed[:10], base[:10])) and changed[10:] == base[10:]
    # a default no row overrides
    monkeypatch.setattr(triderm_config, "DEFAULT", replace(triderm_config.DEFAULT, weight_decay=1e-4))
    assert all(c != b for c, b in zip(keys()[10:], base[10:]))
    assert ablation.text_code_hash() == ablation.text_code_hash() != ablation.vision_code_hash()


def test_ablate_writes_its_result_file_with_paired_claims(tmp_path, capsys):
    from benchmarks.results import REQUIRED, render
    from core.ablate import main as ablate_main

    ws, truth = _tiny_workspace(tmp_path / "ws")
    out = tmp_path / "results"
    argv = ["--workspace", str(ws.root), "--tables", "text", "--n-seeds", "2", "--results", str(out)]
    with pytest.raises(SystemExit) as exc:  # no llm:<model> source: nothing to measure, so no result file
        ablate_main(argv)
    assert exc.value.code == 2 and "no llm:<model> triplets" in capsys.readouterr().err and not out.exists()

    _add_llm_source(ws, truth, "good", flip=0.05, m=400, seed=1)
    assert ablate_main(argv) == 0
    record = json.loads((out / "ablation.json").read_text(encoding="utf-8"))
    assert set(REQUIRED) <= set(record) and record["seeds"] == [0, 1] and record["synthetic"] is True
    rows = {r[0]: r for r in record["tables"][0]["rows"]}
    assert len(rows) == 10 and rows["dim 4"][1] == rows["budget 100%"][1] and rows["dim 2"][3] == 62.6
    assert "latent truth (the planted ceiling)" not in rows  # no phantom truth/ in this workspace
    assert rows["dim 4"][1]["ci"][0] <= rows["dim 4"][1]["mean"] <= rows["dim 4"][1]["ci"][1]
    claims = {c["claim"]: c for c in record["claims"]}
    assert len(claims) == 4 + 3 and all(c["holds"] == (c["p"] < 0.05) for c in claims.values())
    assert claims["budget 100% beats budget 0.1% (balanced agreement)"]["holds"] is True
    assert "## Ablations (TriDerm Table 2)" in render(out)


@pytest.mark.parametrize(("argv", "message"), [
    (["--tables", "vision", "--source", "llm:x"], "--source picks the oracle"),
    (["--tables", "text", "--vision-epochs", "3"], "shorten Table 2b"),
    (["--tables", "text", "--quick"], "shorten Table 2b"),
])
def test_ablate_flags_that_would_do_nothing_exit_2(tmp_path, capsys, argv, message):
    from core.ablate import main as ablate_main

    with pytest.raises(SystemExit) as exc:
        ablate_main(["--workspace", str(tmp_path / "none"), *argv])
    assert exc.value.code == 2 and message in capsys.readouterr().err
