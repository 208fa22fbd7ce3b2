"""A loopback HTTP server speaking the two endpoints of the OpenAI-compatible API the oracle uses.

``GET /v1/models`` lists the served models; ``POST /v1/chat/completions`` answers a chat request
with ``{"answer": "j"|"k"}`` chosen as :func:`ollama_stub.stub_choice` chooses (the reference sharing
more words with the anchor), in the response shape vLLM, llama.cpp server and TGI share. Behaviours:
``normal``, ``error500`` (HTTP 500), ``missing`` (the model is not served: 404). Only 127.0.0.1 is
bound; ``delay_s`` slows every answer; ``chats`` records every request, ``max_in_flight`` the most
served at once, ``auth`` the Authorization headers seen.
"""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ollama_stub import stub_choice


class OpenAIStub:
    """Start with ``with OpenAIStub() as stub:``; ``stub.base_url`` is the URL to pass as --base-url."""

    def __init__(self, models: tuple[str, ...] = ("stub-model",), behaviour: str = "normal",
                 delay_s: float = 0.0) -> None:
        self.models, self.behaviour, self.delay_s = list(models), behaviour, delay_s
        self.chats: list[dict[str, Any]] = []
        self.auth: list[str | None] = []
        self.in_flight = self.max_in_flight = 0
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, payload: Any) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path != "/v1/models":
                    return self._send(404, {"error": {"message": "not found"}})
                served = [] if stub.behaviour == "missing" else stub.models
                self._send(200, {"object": "list", "data": [{"id": m, "object": "model"} for m in served]})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                if self.path != "/v1/chat/completions":
                    return self._send(404, {"error": {"message": "not found"}})
                with stub._lock:
                    stub.chats.append(body)
                    stub.auth.append(self.headers.get("Authorization"))
                    stub.in_flight += 1
                    stub.max_in_flight = max(stub.max_in_flight, stub.in_flight)
                try:
                    time.sleep(stub.delay_s)
                    status, payload = self._answer(body)
                finally:  # no longer in flight before the answer is sent: the client may ask again at once
                    with stub._lock:
                        stub.in_flight -= 1
                self._send(status, payload)

            def _answer(self, body: dict[str, Any]) -> tuple[int, Any]:
                if stub.behaviour == "error500":
                    return 500, {"error": {"message": "engine died"}}
                if stub.behaviour == "missing" or body.get("model") not in stub.models:
                    return 404, {"error": {"message": f"model {body.get('model')} does not exist"}}
                user = next(m["content"] for m in body["messages"] if m["role"] == "user")
                return 200, {"id": "chatcmpl-1", "object": "chat.completion", "model": body["model"],
                             "choices": [{"index": 0, "finish_reason": "stop", "message": {
                                 "role": "assistant", "content": json.dumps({"answer": stub_choice(user)})}}],
                             "usage": {"prompt_tokens": len(user.split()), "completion_tokens": 5}}

        return Handler

    def __enter__(self) -> "OpenAIStub":
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()
