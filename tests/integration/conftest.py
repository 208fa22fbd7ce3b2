"""Fixtures shared by the integration tests (beside tests/conftest.py's)."""
from __future__ import annotations

import pytest

from annotations.infra.workspace import Workspace


@pytest.fixture
def ws(demo_workspace, monkeypatch, tmp_path) -> Workspace:
    """The demo workspace as the app's pages open it ($TRIDERM_WORKSPACE), with no result files (a test file
    that means another workspace by ``ws`` defines its own)."""
    monkeypatch.setenv("TRIDERM_WORKSPACE", str(demo_workspace.root))
    monkeypatch.setenv("TRIDERM_RESULTS_DIR", str(tmp_path / "no-results"))  # not the repository's result files
    return demo_workspace
