"""No LLM client follows a redirect: an allowed loopback server answering 301/302/303/307/308 towards a
second loopback server (on a port off the allow-list) is one clear error naming both URLs; the second
server gets no request and no answer is stored."""
from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ollama_stub import OllamaStub
from openai_stub import OpenAIStub

from core import llm_triplets
from core.text.llm import PROMPT_VERSION, OllamaOracle, OpenAIOracle, OracleRedirect, Question

STATUSES = (301, 302, 303, 307, 308)


class Redirector:
    """A loopback server that lists ``stub-model`` (GET, both APIs) unless ``redirect_gets``, and answers
    every other request with ``status`` and ``Location: target`` + the request's path."""

    def __init__(self, status: int, target: str, redirect_gets: bool = False) -> None:
        self.requests: list[str] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _redirect(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(status)
                self.send_header("Location", target + self.path)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_GET(self) -> None:
                owner.requests.append(f"GET {self.path}")
                if redirect_gets:
                    return self._redirect()
                listing = {"/api/tags": {"models": [{"name": "stub-model:latest", "model": "stub-model:latest"}]},
                           "/v1/models": {"object": "list", "data": [{"id": "stub-model", "object": "model"}]}}
                data = json.dumps(listing.get(self.path, {})).encode()
                self.send_response(200 if self.path in listing else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                owner.requests.append(f"POST {self.path}")
                self._redirect()

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> Redirector:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()


def _target_requests(stub: OllamaStub | OpenAIStub) -> int:
    return len(stub.chats) + getattr(stub, "tags_requests", 0)


@pytest.mark.parametrize("status", STATUSES)
@pytest.mark.parametrize("kind", ["ollama", "openai"])
def test_a_redirected_chat_is_refused_and_nothing_reaches_the_target(demo_workspace, capsys, monkeypatch, kind,
                                                                     status):
    target_stub = OllamaStub() if kind == "ollama" else OpenAIStub()
    with target_stub as target:
        target_url = target.host if kind == "ollama" else target.base_url.removesuffix("/v1")
        with Redirector(status, target_url) as redirector:
            monkeypatch.setenv("TRIDERM_OLLAMA_HOSTS", redirector.url)  # the redirector's port only
            server = ["--ollama-host", redirector.url] if kind == "ollama" else ["--base-url", f"{redirector.url}/v1"]
            with pytest.raises(SystemExit) as exit_:
                llm_triplets.main(["--workspace", str(demo_workspace.root), "--oracle", kind, *server,
                                   "--model", "stub-model", "--budget", "4", "--seed", "5", "--retries", "0"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert f"HTTP {status}, a redirect to '{target_url}/" in err and redirector.url in err
    assert "redirects are never followed" in err and "Traceback" not in err
    assert any(r.startswith("POST") for r in redirector.requests)
    assert _target_requests(target) == 0
    assert demo_workspace.store.llm_answers(kind, "stub-model", PROMPT_VERSION) == []
    assert demo_workspace.store.triplets(source="llm:stub-model") == []


@pytest.mark.parametrize("status", STATUSES)
@pytest.mark.parametrize("kind", ["ollama", "openai"])
def test_a_redirected_server_check_is_refused(kind, status):
    with OllamaStub() as target, Redirector(status, target.host, redirect_gets=True) as redirector:
        allowed = [redirector.url]
        oracle = (OllamaOracle("stub-model", host=redirector.url, allowed_hosts=allowed, retries=0) if kind == "ollama"
                  else OpenAIOracle("stub-model", base_url=f"{redirector.url}/v1", allowed_hosts=allowed, retries=0))
        with pytest.raises(OracleRedirect, match=f"HTTP {status}, a redirect to '{target.host}/"):
            oracle.check()
        with pytest.raises(OracleRedirect, match=f"{redirector.url}/.* answered HTTP {status}"):
            oracle.answer_question(Question("a", "b", "c", "red wound", "red wound", "blue wound"))
    assert _target_requests(target) == 0 and len(redirector.requests) == 2


def test_a_redirecting_host_among_several_is_dead_and_the_others_answer(demo_workspace, capsys, monkeypatch):
    with OllamaStub() as target, OllamaStub() as good, Redirector(307, target.host) as redirector:
        monkeypatch.setenv("TRIDERM_OLLAMA_HOSTS", f"{redirector.url},{good.host}")
        assert llm_triplets.main(["--workspace", str(demo_workspace.root), "--oracle", "ollama", "--ollama-host",
                                  redirector.url, "--ollama-host", good.host, "--model", "stub-model", "--budget",
                                  "6", "--seed", "5", "--retries", "0"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert "HTTP 307, a redirect to" in summary["hosts"][redirector.url]["dead"]
    assert summary["hosts"][good.host]["answered"] == len(good.chats) == 6
    assert _target_requests(target) == 0
    assert len(demo_workspace.store.llm_answers("ollama", "stub-model", PROMPT_VERSION)) == 6
