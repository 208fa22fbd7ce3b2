"""Browser-test fixtures: a demo workspace with an embedding run and a report, a live
``streamlit run app.py`` on a free loopback port, and Debian Chromium through Playwright."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from annotations.accounts import accounts
from annotations.infra.workspace import Workspace
from annotations.io.dataset import import_dataset

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
PASSWORD = "browser-test-password"  # every test account's password
#: The test server's Streamlit flags beside its port; the shipped .streamlit/config.toml (read from the
#: repository, the server's working directory) holds the rest.
SERVER_FLAGS = ("--server.headless", "true", "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class AppServer:
    """``streamlit run app.py`` of ``repo`` (default this checkout) against one workspace, stopped at teardown."""

    def __init__(self, workspace: Path, log: Path, env: dict[str, str] | None = None, repo: Path = REPO,
                 flags: tuple[str, ...] = SERVER_FLAGS) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.workspace = str(workspace)
        child_env = dict(os.environ)
        child_env.update({"TRIDERM_WORKSPACE": str(workspace), **(env or {})})
        self._log = open(log, "wb")  # noqa: SIM115 — the server's log stays open until stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "streamlit", "run", "app.py", "--server.port", str(self.port), *flags],
            cwd=repo, env=child_env, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300  # generous: the first start imports torch on a loaded machine
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"streamlit exited: {log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(self.url + "/_stcore/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"streamlit did not become healthy within 300 s: {log.read_text()[-2000:]}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._log.close()


@pytest.fixture(scope="module")
def browser_workspace(demo_dataset, tmp_path_factory) -> Path:
    """The demo imported, plus a TEST-ONLY embedding run (random vectors, clearly labelled) and
    a real evaluation report of it, so the explorer and report pages have something to show."""
    from core.eval.report import run_report
    from core.runtime import save_embeddings

    root = tmp_path_factory.mktemp("browser") / "ws"
    ws = Workspace(root)
    import_dataset(ws, demo_dataset)
    ids = [im["image_id"] for im in ws.store.images()]
    keys = [(w["image_id"], w["wound_index"]) for w in ws.store.wounds()]
    rng = np.random.default_rng(0)
    run_id = ws.store.start_run("vision-baseline", {"modality": "vision", "test_only": True},
                                name="TEST-ONLY random embedding")
    wound_emb = rng.normal(size=(len(keys), 8))
    image_emb = np.stack([wound_emb[[n for n, k in enumerate(keys) if k[0] == i]].mean(0) for i in ids])
    save_embeddings(ws, run_id, ids, image_emb=image_emb, wound_keys=keys, wound_emb=wound_emb)
    ws.store.finish_run(run_id)
    # a TEST-ONLY supervised run: the report must show its stored strict out-of-fold figure
    sup_id = ws.store.start_run("vision-triderm", {"modality": "vision", "supervise": "triplets", "test_only": True},
                                name="TEST-ONLY supervised run")
    save_embeddings(ws, sup_id, ids, image_emb=image_emb + 0.1, wound_keys=keys, wound_emb=wound_emb)
    ws.store.finish_run(sup_id, metrics={"cv": {"protocol": "strict", "balanced": 0.612, "ci": [0.55, 0.67],
                                                "n": 40, "n_anchors": 9, "n_patients": 9}})
    run_report(ws, n_boot=50)
    ws.store.close()
    return root


def create_account(workspace: Path | str, name: str, role: str = "annotator") -> str:
    """Create the account ``name`` (password :data:`PASSWORD`) unless it exists; returns the name."""
    ws = Workspace(workspace)
    if accounts.get(ws.store, name) is None:
        accounts.add_account(ws.store, name, role, PASSWORD, "test")
    ws.store.close()
    return name


def sign_in_as(pg, url: str, name: str, password: str = PASSWORD, expect_ok: bool = True) -> None:
    """Fill the sign-in form at ``url`` (and wait for the home page unless ``expect_ok`` is False)."""
    from playwright.sync_api import expect
    from streamlit_page import wait_for_cookie

    pg.goto(url)
    box = pg.get_by_role("textbox", name="Account name")
    expect(box).to_be_visible()
    box.fill(name)
    pg.get_by_label("Password", exact=True).fill(password)
    pg.get_by_role("button", name="Sign in").click()
    if expect_ok:
        expect(pg.get_by_text("Signed in as").first).to_be_visible()
        wait_for_cookie(pg)  # a goto before the app's script has set it would open a signed-out session


@pytest.fixture
def add_account():
    """``add_account(workspace, name, role="annotator")`` → the account's name (see :func:`create_account`)."""
    return create_account


@pytest.fixture
def sign_in():
    """``sign_in(page, url, name, password=PASSWORD, expect_ok=True)`` (see :func:`sign_in_as`)."""
    return sign_in_as


@pytest.fixture(scope="module")
def app_server(browser_workspace, tmp_path_factory) -> Iterator[AppServer]:
    server = AppServer(browser_workspace, tmp_path_factory.mktemp("logs") / "streamlit.log")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def chromium():
    if not CHROMIUM.exists():
        pytest.skip("Debian chromium is not installed at /usr/bin/chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(chromium):
    context = chromium.new_context(viewport={"width": 1440, "height": 1000})
    pg = context.new_page()
    pg.set_default_timeout(120_000)  # first renders compile numba / load models on 2 shared cores
    yield pg
    context.close()


@pytest.fixture
def start_app() -> Iterator:
    """Factory: ``start_app(workspace, log, env)`` → a running AppServer, stopped at teardown."""
    servers: list[AppServer] = []

    def start(workspace: Path, log: Path, env: dict[str, str] | None = None) -> AppServer:
        servers.append(AppServer(workspace, log, env))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def screenshot(tmp_path):
    """``screenshot(page, name)``: a full-page PNG in the test's tmp dir (see :func:`save_screenshot`)."""
    return lambda pg, name: save_screenshot(pg, tmp_path, name)


def save_screenshot(pg, tmp_path: Path, name: str) -> Path:
    """Save a full-page screenshot in the test's tmp dir (and in $TRIDERM_SCREENSHOT_DIR when set)."""
    path = tmp_path / f"{name}.png"
    pg.screenshot(path=str(path), full_page=True)
    extra = os.environ.get("TRIDERM_SCREENSHOT_DIR")
    if extra:
        Path(extra).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, Path(extra) / f"{name}.png")
    assert path.stat().st_size > 10_000
    return path
