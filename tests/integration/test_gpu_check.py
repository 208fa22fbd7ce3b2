"""`make gpu-check`: on a machine without CUDA it says so and exits 0; it covers every CLI."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_make_gpu_check_without_cuda_says_so_and_exits_0() -> None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no CUDA even where a GPU exists
    proc = subprocess.run(["make", "-s", "-o", "install", "gpu-check", f"PY={sys.executable}"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "gpu-check: no CUDA device on this machine" in proc.stdout and "PASS" not in proc.stdout


def test_gpu_check_covers_every_cli() -> None:
    steps = _script().steps("/tmp/ws")
    labels = [label for label, _ in steps]
    commands = [" ".join(argv[3:] if argv[1] == "-c" else argv[1:]) for _, argv in steps]
    for module in ("train_triderm", "embed", "fit_soe", "text_embed", "train_slimp", "evaluate", "bench_contrastive",
                   "extract_features", "llm_triplets", "train_segmenter", "segment", "ablate"):
        assert any(c.startswith(f"core.{module} ") for c in commands), module
    assert any("torch.distributed.run --nproc_per_node 1 -m core.train_slimp" in c for c in commands)
    assert [c.split("--objective ")[1].split()[0] for c in commands if "core.train_concepts" in c] == [
        "clip", "make", "conceptclip"]
    assert any("core.bench_contrastive" in c and "--quick" in c for c in commands)
    assert all("--workspace /tmp/ws" in c or "--images /tmp/ws/images" in c for c in commands)
    assert labels[0] == "train_triderm"


def test_every_job_that_takes_a_device_is_checked() -> None:
    """Each ``python -m core.<job>`` with a ``--device`` option has a gpu-check step."""
    checked = {argv[argv.index("-m") + 1] if "-m" in argv else argv[3] for _, argv in _script().steps("/tmp/ws")}
    jobs = {f"core.{p.stem}" for p in (REPO / "core").glob("*.py") if "add_device(" in p.read_text() and p.stem != "cli"}
    assert jobs and jobs - SERVERS <= checked, sorted(jobs - SERVERS - checked)


#: Jobs that serve until stopped, which the check's run-to-completion steps cannot hold: the Label Studio ML
#: backend (its --device path is the segmenter's, which the ``segment`` step checks; a CUDA run of the server
#: itself is pending a GPU session).
SERVERS = {"core.ml_backend"}


def test_only_the_numpy_jobs_pass_without_cuda_memory() -> None:
    """``core.evaluate`` takes no ``--device`` (numpy only): the GPU run flagged it FAIL for using no CUDA memory."""
    module = _script()
    no_device = {label for label, argv in module.steps("/tmp/ws") if "--device" not in argv}
    assert no_device == set(module.NUMPY_ONLY) == {"evaluate"}


def test_child_jobs_import_this_checkout_first(monkeypatch) -> None:
    """scripts/gpu_check.py and benchmarks/gpu.py start their jobs with benchmarks.results.repo_env."""
    from benchmarks.results import repo_env

    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    assert repo_env()["PYTHONPATH"].split(os.pathsep) == [str(REPO), "/elsewhere"]
    monkeypatch.delenv("PYTHONPATH")
    assert repo_env()["PYTHONPATH"] == str(REPO) and _script().repo_env is repo_env
