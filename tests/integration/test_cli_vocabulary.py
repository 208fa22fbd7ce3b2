"""One CLI vocabulary (core/cli.py) for every job and benchmark, read off their ``--help``.

Each entry point is run once as ``python -m <module> <old spellings…> --help``: argparse acts on
the options in order, so the deprecated spellings are parsed (and warn) before the help prints.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

from core import cli

REPO = Path(__file__).resolve().parents[2]

# module → (options its --help must offer, old spellings (argv) that must still parse with a warning)
ENTRY_POINTS: dict[str, tuple[set[str], list[str]]] = {
    "core.train_triderm": ({"--workspace", "--device", "--seed", "--batch-size", "--epochs", "--lr"}, []),
    "core.embed": ({"--workspace", "--device"}, []),
    "core.llm_triplets": ({"--workspace", "--device", "--seed", "--batch-size"}, []),
    "core.fit_soe": ({"--workspace", "--device", "--seed", "--epochs", "--lr"}, []),
    "core.text_embed": ({"--workspace", "--device"}, []),
    "core.evaluate": ({"--workspace", "--seed"}, []),  # numpy bootstrap only: no device
    "core.ablate": ({"--workspace", "--device", "--n-seeds"}, ["--seeds", "2"]),
    "core.train_slimp": ({"--workspace", "--device", "--seed", "--batch-size", "--epochs", "--lr", "--lambda",
                          "--crop-size"}, ["--batch-patients", "4"]),
    "core.train_concepts": ({"--workspace", "--device", "--seed", "--batch-size", "--epochs", "--lr", "--crop-size"},
                            ["--batch", "4", "--size", "64"]),
    "core.bench_contrastive": ({"--workspace", "--device", "--n-seeds", "--batch-size", "--epochs", "--lr",
                                "--lambda", "--crop-size"},
                               ["--seeds", "2", "--batch", "4", "--size", "64", "--lam", "0.3"]),
    "core.train_segmenter": ({"--workspace", "--device", "--seed", "--batch-size", "--epochs", "--lr"}, []),
    "core.extract_features": ({"--workspace", "--device", "--seed"}, []),
    "core.export_model": ({"--workspace"}, []),  # copies weights: no device, no seed
    "core.segment": ({"--workspace", "--device"}, []),  # a folder of photos → masks
    "core.ml_backend": ({"--workspace", "--device"}, []),  # the segmenter served to Label Studio
    "core.token_maps": ({"--workspace"}, []),  # a run's token maps for Explore: one pass of its tail, default device
    "core.phantoms": ({"--seed"}, []),  # writes a dataset folder (--out), numpy only; imports nothing of core
    "annotations": ({"--workspace"}, []),  # checked on its import subcommand; never imports core
    "benchmarks.active": ({"--workspace", "--device", "--seeds"}, []),
    "benchmarks.concepts": ({"--workspace", "--device", "--seed", "--epochs", "--crop-size"}, ["--size", "64"]),
    "benchmarks.flip": ({"--device", "--seed", "--batch-size"}, ["--batch", "4"]),  # random inputs: no workspace
    "benchmarks.orderings": ({"--device", "--seeds"}, []),  # builds its own phantoms: no workspace
    "benchmarks.real_vision": ({"--workspace", "--device", "--seeds"}, []),
    "benchmarks.real_vision_adapt": ({"--device", "--seeds"}, []),  # dataset folders, not a workspace
    "benchmarks.real_vision_directions": ({"--workspace", "--seeds"}, []),  # real_vision's folds and tuner, CPU
    "benchmarks.real_retrieval": ({"--workspace", "--seeds"}, []),  # real_vision's folds and tuner, on the CPU
    "benchmarks.active_real": ({"--workspace", "--seeds"}, []),  # a linear metric on cached frozen features
    "benchmarks.soe": ({"--workspace", "--device", "--seed"}, []),
    "benchmarks.train_triderm": ({"--workspace", "--device", "--seed", "--epochs"}, []),
    "benchmarks.vision_ablation": ({"--workspace", "--device", "--seeds", "--epochs"}, []),
    "benchmarks.readers": ({"--seed"}, []),
    "benchmarks.followup": ({"--seed"}, []),  # phantom visits and marker geometry: numpy/OpenCV, no device
    "benchmarks.scale": ({"--seed", "--device"}, []),  # builds its own phantom studies: no workspace
    "benchmarks.segmentation": ({"--device", "--seed", "--epochs"}, []),  # dataset folders, not a workspace
    "benchmarks.segmentation_diagnosis": ({"--seed", "--epochs"}, []),  # dataset folders; CPU, like the issue's
    "benchmarks.segmentation_default": ({"--seed", "--epochs"}, []),  # dataset folders, nested folds
    "benchmarks.app_latency": (set(), []),  # browser-driven on its own phantom workspace: no torch, no seeds  # a generated mask: no workspace, no torch
    "benchmarks.gpu": ({"--seed", "--epochs"}, []),  # --devices: the CUDA and CPU rows side by side
    "benchmarks.cli_startup": (set(), []),  # times the other commands' --help: no workspace, no device, no seeds
    "benchmarks.results": (set(), []),  # renders result files and reruns the commands above: none of it applies
}
# spellings of the old vocabulary that no --help may offer any more
RETIRED = ("--batch", "--batch-patients", "--lam", "--size", "--crop", "--batch_size", "--crop_size", "--n_seeds")


def test_every_job_and_benchmark_is_listed():
    jobs = {f"core.{p.stem}" for p in (REPO / "core").glob("*.py") if p.stem not in ("__init__", "runtime", "cli")}
    benches = {f"benchmarks.{p.stem}" for p in (REPO / "benchmarks").glob("*.py") if p.stem != "__init__"}
    assert jobs | benches <= set(ENTRY_POINTS), sorted(jobs | benches - set(ENTRY_POINTS))


def options(help_text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9_-]*)", help_text))


@pytest.mark.parametrize("module", sorted(ENTRY_POINTS))
def test_help_speaks_the_vocabulary(module):
    required, old = ENTRY_POINTS[module]
    sub = ["import"] if module == "annotations" else []
    out = subprocess.run([sys.executable, "-m", module, *sub, *old, "--help"], cwd=REPO, capture_output=True,
                         text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    offered = options(out.stdout)
    assert required <= offered, f"{module} lacks {sorted(required - offered)}"
    assert not offered & set(RETIRED), f"{module} still offers {sorted(offered & set(RETIRED))}"
    if "--device" in offered:
        assert "--device {auto,cpu,cuda}" in out.stdout
    if "--seeds" in offered:  # a list, never a count
        assert "--seeds SEED [SEED ...]" in out.stdout
    for flag in old[::2]:
        assert re.search(rf"FutureWarning: {flag} is deprecated .*; use --", out.stderr), (flag, out.stderr)


def test_deprecated_spelling_stores_into_the_new_option():
    parser = argparse.ArgumentParser()
    cli.deprecated(parser, "--batch", cli.add_batch_size(parser, 8))
    cli.deprecated(parser, "--lam", cli.add_lambda(parser, 0.5))
    cli.deprecated(parser, "--seeds", cli.add_n_seeds(parser, 3))
    assert vars(cli.parse_args(parser, [])) == {"batch_size": 8, "lam": 0.5, "n_seeds": 3}
    with pytest.warns(FutureWarning) as caught:
        args = cli.parse_args(parser, ["--batch", "4", "--lam", "0.2", "--seeds", "5"])
    assert [str(w.message).split()[0] + " → " + str(w.message).split()[-1] for w in caught] == [
        "--batch → --batch-size", "--lam → --lambda", "--seeds → --n-seeds"]
    assert (args.batch_size, args.lam, args.n_seeds) == (4, 0.2, 5)
    with pytest.raises(SystemExit):  # same type/validation as the new spelling
        cli.parse_args(parser, ["--seeds", "0"])
    assert "--batch" not in parser.format_help().replace("--batch-size", "")


def test_jobs_map_old_spellings_onto_new_dests(monkeypatch):
    from core import runtime
    from core.bench_contrastive import _parser as bench_parser
    from core.train_concepts import _parser as concepts_parser
    from core.train_slimp import build_parser as slimp_parser

    monkeypatch.setattr(runtime, "_chosen_device", None)  # restored after the test: --device is process-wide
    parsed = []
    for parser, argv in ((slimp_parser(), ["--batch-patients", "6"]), (concepts_parser(), ["--batch", "5", "--size", "64"]),
                         (bench_parser(), ["--seeds", "2", "--lam", "0.25"])):
        with pytest.warns(FutureWarning):
            parsed.append(cli.parse_args(parser, [*argv, "--device", "cpu"]))
    a, b, c = parsed
    assert (a.batch_size, b.batch_size, b.crop_size, c.n_seeds, c.lam) == (6, 5, 64, 2, 0.25)


def test_device_is_resolved_once_for_the_process(monkeypatch):
    import torch

    from core import runtime

    monkeypatch.setattr(runtime, "_chosen_device", None)
    parser = argparse.ArgumentParser()
    cli.add_device(parser)
    assert cli.parse_args(parser, ["--device", "cpu"]).device == "cpu"
    assert runtime.pick_device() == torch.device("cpu")
    auto = cli.parse_args(parser, []).device
    assert auto == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit):
            cli.parse_args(parser, ["--device", "cuda"])
    with pytest.raises(SystemExit):
        cli.parse_args(parser, ["--device", "tpu"])
