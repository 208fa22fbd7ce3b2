"""The wheel's contents and extras (pyproject.toml) and the ``triderm`` command that dispatches to the modules."""
from __future__ import annotations

import fnmatch
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import triderm
from triderm.__main__ import streamlit_flags

REPO = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
ML_MODULES = {"torch", "torchvision", "timm", "open-clip-torch", "transformers", "sentence-transformers",
              "scikit-learn", "umap-learn"}


def names(specs: list[str]) -> set[str]:
    return {re.match(r"[A-Za-z0-9._-]+", s).group(0).lower().replace("_", "-") for s in specs}


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=120)


def test_licence_is_an_spdx_expression_with_its_file():
    assert PROJECT["project"]["license"] == "MIT"
    assert PROJECT["project"]["license-files"] == ["LICENSE"]
    assert (REPO / "LICENSE").read_text().startswith("MIT License")


def test_the_app_extra_installs_no_machine_learning():
    extras = PROJECT["project"]["optional-dependencies"]
    server = names(PROJECT["project"]["dependencies"]) | names(extras["app"])
    assert "streamlit" in server and not server & ML_MODULES
    assert names(extras["ml"]) >= ML_MODULES
    assert {"ollama", "httpx", "pydantic", "gguf", "accelerate", "triderm-studio[ml]"} <= (
        names(extras["llm"]) | set(extras["llm"]))
    assert extras["all"] == ["triderm-studio[app,ml,llm]"]


@pytest.mark.parametrize(("name", "cap"), [("torch", "<2.15"), ("torchvision", "<0.30")])
def test_torch_is_capped_at_the_next_minor_release(name, cap):
    spec = next(s for s in PROJECT["project"]["optional-dependencies"]["ml"] if names([s]) == {name})
    assert cap in spec and ">=" in spec


def test_the_wheel_declares_the_app_its_pages_and_the_component_files():
    setuptools = PROJECT["tool"]["setuptools"]
    assert setuptools["py-modules"] == ["app"]
    assert {"app", "components*", "pages", "triderm*"} <= set(setuptools["packages"]["find"]["include"])
    patterns = setuptools["package-data"]["components.outline_editor"]
    frontend = [p.name for p in (REPO / "components" / "outline_editor").iterdir() if p.suffix in (".js", ".css")]
    assert frontend and all(any(fnmatch.fnmatch(f, p) for p in patterns) for f in frontend)
    assert (REPO / "triderm" / "streamlit.toml").resolve() == (REPO / ".streamlit" / "config.toml").resolve()
    assert PROJECT["project"]["scripts"]["triderm"] == "triderm.__main__:main"


def test_triderm_knows_every_job_and_every_annotations_command():
    from annotations.__main__ import COMMANDS

    jobs = {p.stem for p in (REPO / "core").glob("*.py") if 'if __name__ == "__main__":' in p.read_text()}
    assert set(triderm.JOBS) == jobs | {"phantoms"}
    assert list(triderm.ANNOTATION_COMMANDS) == [*COMMANDS, "users"]
    assert triderm.app_path() == REPO / "app.py"


def test_triderm_help_lists_the_commands_without_importing_them():
    out = run("-c", "import sys; from triderm.__main__ import main; main(['--help']); "
                    "print(sorted(m for m in ('torch', 'pandas', 'streamlit', 'core.embed') if m in sys.modules))")
    assert out.returncode == 0, out.stderr
    assert "train-triderm" in out.stdout and "erase-patient" in out.stdout and "app" in out.stdout
    assert out.stdout.rstrip().endswith("[]")


@pytest.mark.parametrize(("command", "prog"), [("phantoms", "python -m core.phantoms"),
                                                ("export", "python -m annotations export")])
def test_triderm_runs_the_module_behind_a_command(command, prog):
    out = run("-m", "triderm", command, "--help")
    assert out.returncode == 0, out.stderr
    assert f"usage: {prog}" in out.stdout


def test_an_unknown_command_is_one_error_with_the_usage():
    out = run("-m", "triderm", "trian")
    assert out.returncode == 2 and "unknown command 'trian'" in out.stderr and "train-triderm" in out.stderr


def test_the_shipped_streamlit_settings_become_flags(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text('[client]\nshowErrorDetails = "none"\n[server]\nrunOnSave = false\nmaxUploadSize = 50\n')
    assert streamlit_flags(config) == ["--client.showErrorDetails=none", "--server.runOnSave=false",
                                       "--server.maxUploadSize=50"]


def test_the_shipped_settings_hide_tracebacks_from_users():
    """``false`` is Streamlit's legacy spelling of "stacktrace" (traceback shown); "none" shows a generic message."""
    config = tomllib.loads((REPO / ".streamlit" / "config.toml").read_text(encoding="utf-8"))
    assert config["client"]["showErrorDetails"] == "none"
    assert "--client.showErrorDetails=none" in streamlit_flags()
