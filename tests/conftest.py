"""Shared fixtures: the phantom demo dataset, imported workspaces, the real Medetec photos."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from annotations.infra.workspace import Workspace
from annotations.io.dataset import import_dataset

MEDETEC = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "medetec"


@pytest.fixture(autouse=True)
def _real_main_module():
    """Streamlit's AppTest installs the script as ``sys.modules["__main__"]`` and leaves it there: a later
    multiprocessing ``spawn`` child would then run app.py instead of pytest's main (app.py outside a
    Streamlit run fails, the pool respawns its workers forever). Put the real one back after each test."""
    main = sys.modules["__main__"]
    yield
    sys.modules["__main__"] = main


@pytest.fixture(scope="session")
def demo_dataset(tmp_path_factory) -> Path:
    """The default phantom demo (53 photos, 120 wounds, 513 triplets), built once per session."""
    from core.phantoms import build

    out = tmp_path_factory.mktemp("phantoms") / "demo"
    build(out, seed=0)
    return out


@pytest.fixture(scope="session")
def _demo_workspace_template(demo_dataset, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("demo_ws_template") / "ws"
    ws = Workspace(root)
    import_dataset(ws, demo_dataset)
    ws.store.close()
    return root


@pytest.fixture
def demo_workspace(_demo_workspace_template, tmp_path) -> Workspace:
    """A fresh, writable copy of the imported demo workspace for one test."""
    root = tmp_path / "ws"
    shutil.copytree(_demo_workspace_template, root)
    return Workspace(root)


@pytest.fixture
def medetec_dir() -> Path:
    """The 38 real Medetec photos in ../shared (the test skips when they are absent)."""
    if not (MEDETEC / "images").is_dir():
        pytest.skip(f"Medetec data not found at {MEDETEC}")
    return MEDETEC


@pytest.fixture(scope="session")
def tiny_phantom(tmp_path_factory):
    """``tiny_phantom(seed, photos, patients, wounds, triplets)`` → a small SYNTHETIC dataset folder,
    built once per session for each size."""
    from core.phantoms import build

    built: dict[tuple[int, ...], Path] = {}

    def make(seed: int, photos: int, patients: int, wounds: int, triplets: int) -> Path:
        key = (seed, photos, patients, wounds, triplets)
        if key not in built:
            built[key] = tmp_path_factory.mktemp("tiny") / "ds"
            build(built[key], seed=seed, photos=photos, patients=patients, wounds=wounds, triplets=triplets)
        return built[key]

    return make


@pytest.fixture(scope="session")
def tiny_phantom_workspace(tiny_phantom, tmp_path_factory):
    """``tiny_phantom_workspace(seed, photos, patients, wounds, triplets)`` → a new workspace holding
    that :func:`tiny_phantom` dataset (a fixture of a wider scope than one test imports it once)."""
    def make(seed: int, photos: int, patients: int, wounds: int, triplets: int) -> Workspace:
        ws = Workspace(tmp_path_factory.mktemp("tinyws") / "ws")
        import_dataset(ws, tiny_phantom(seed, photos, patients, wounds, triplets))
        return ws

    return make


@pytest.fixture
def imported(tmp_path):
    """``imported(dataset)`` → a new workspace in this test's temporary folder holding ``dataset``."""
    def make(dataset: Path) -> Workspace:
        ws = Workspace(tmp_path / "ws")
        import_dataset(ws, dataset)
        return ws

    return make
