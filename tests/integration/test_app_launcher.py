"""``triderm app`` as a real process: it listens on the loopback unless told otherwise, and no Streamlit server
outlives it, whichever signal ends it (issue 54)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, suppress
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def terminal_signals() -> None:
    """Start the server as a terminal would: a test runner started under ``nohup`` ignores SIGHUP, and an ignored
    signal stays ignored across exec, so a server it started would outlive the hangup the test sends."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


@contextmanager
def serving(tmp_path: Path, *args: str, host: str = "127.0.0.1", cwd: Path | None = None
            ) -> Iterator[tuple[subprocess.Popen, int]]:
    """``python ARGS…`` (a server) on a free port of ``host``, healthy; every process of its tree ends at exit."""
    port = free_port(host)
    log = tmp_path / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, *args, "--server.port", str(port), "--server.headless", "true"],
                                cwd=cwd or tmp_path, stdout=out, stderr=subprocess.STDOUT, preexec_fn=terminal_signals,
                                env={**os.environ, "PYTHONPATH": str(REPO), "TRIDERM_WORKSPACE": str(tmp_path / "ws")})
    tree = [psutil.Process(proc.pid)]
    try:
        deadline = time.monotonic() + 180  # a generous bound on a loaded machine, not a timing requirement
        while True:
            assert proc.poll() is None, log.read_text()[-2000:]
            assert time.monotonic() < deadline, f"not healthy: {log.read_text()[-2000:]}"
            tree += [p for p in psutil.Process(proc.pid).children(recursive=True) if p not in tree]
            try:
                with urllib.request.urlopen(f"http://{host}:{port}/_stcore/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.3)
        tree += [p for p in psutil.Process(proc.pid).children(recursive=True) if p not in tree]
        yield proc, port
    finally:
        for p in tree:
            with suppress(psutil.NoSuchProcess):
                p.kill()
        proc.wait(timeout=30)


def listening(proc: subprocess.Popen, port: int) -> set[str]:
    """The addresses that ``proc`` or a process under it listens on at ``port``."""
    tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    return {c.laddr.ip for p in tree for c in p.net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == port}


def triderm_app(tmp_path: Path, *options: str, host: str = "127.0.0.1"
                ) -> AbstractContextManager[tuple[subprocess.Popen, int]]:
    """``triderm app`` (as ``python -m triderm app``) on a free port of ``host``, healthy (see :func:`serving`)."""
    return serving(tmp_path, "-m", "triderm", "app", "--workspace", str(tmp_path / "ws"), *options, host=host)


def test_triderm_app_listens_on_the_loopback_only(tmp_path):
    with triderm_app(tmp_path) as (proc, port):
        assert listening(proc, port) == {"127.0.0.1"}


def test_streamlit_run_in_the_checkout_listens_on_the_loopback_only(tmp_path):
    """``make app`` (``streamlit run app.py``) reads the checkout's .streamlit/config.toml."""
    with serving(tmp_path, "-m", "streamlit", "run", "app.py", cwd=REPO) as (proc, port):
        assert listening(proc, port) == {"127.0.0.1"}


def test_an_admin_chooses_the_address(tmp_path):
    """``--server.address`` overrides the shipped loopback (here another loopback address, never a public one)."""
    with triderm_app(tmp_path, "--server.address", "127.0.0.2", host="127.0.0.2") as (proc, port):
        assert listening(proc, port) == {"127.0.0.2"}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGKILL],
                         ids=lambda s: signal.Signals(s).name)
def test_no_server_outlives_the_launcher(tmp_path, sig):
    """A service manager's SIGTERM, Ctrl-C, a closed terminal's SIGHUP or SIGKILL to ``triderm app`` ends the
    server: no process of its tree remains and the port refuses connections."""
    with triderm_app(tmp_path) as (proc, port):
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        os.kill(proc.pid, sig)
        proc.wait(timeout=60)
        _, alive = psutil.wait_procs(tree, timeout=30)
        assert [p.cmdline() for p in alive if p.status() != psutil.STATUS_ZOMBIE] == []
        with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
