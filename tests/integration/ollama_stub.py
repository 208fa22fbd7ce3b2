"""A loopback HTTP server speaking the two Ollama REST endpoints the oracle uses.

``/api/tags`` lists the served models; ``/api/chat`` answers a (non-streaming) chat request.
Tests drive the real ``ollama`` client over real sockets against it and switch behaviours:

- ``normal``: a structured answer ``{"answer": "j"|"k"}`` — the reference whose description
  shares more words with the anchor's (ties → j), so answers are deterministic;
- ``slow``: sleeps ``slow_s`` seconds before answering (client timeouts);
- ``error500``: HTTP 500 with an Ollama-style ``{"error": ...}`` body;
- ``malformed``: HTTP 200 whose body is not JSON;
- ``bad_content``: a valid response whose message content is not JSON;
- ``outside``: ``{"answer": "maybe"}`` — outside {j, k};
- ``missing``: the model is absent from ``/api/tags`` and ``/api/chat`` returns 404.

``queue(behaviour, n)`` overrides the default for the next ``n`` chat requests (e.g. two HTTP
500s, then normal answers). Every chat request is recorded (``chats``) for counting.
Only 127.0.0.1 is bound; ``delay_s`` slows every normal answer (to interrupt a run mid-way), or
``delay_of(n)`` gives the n-th chat request's delay (answers then complete out of order);
``in_flight``/``max_in_flight`` count the chat requests being served at once.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import re
import threading
import time
from collections import deque
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

BEHAVIOURS = ("normal", "slow", "error500", "malformed", "bad_content", "outside", "missing")
_BLOCK = re.compile(r"Wound ([ijk]):\n(.*?)(?=\n\nWound [jk]:|\n\nIs wound i)", re.S)


def stub_choice(user_prompt: str) -> str:
    """'j' or 'k': the reference sharing more words with the anchor (ties → 'j')."""
    blocks = dict(_BLOCK.findall(user_prompt))
    words = {key: set(re.findall(r"[a-z]+", blocks.get(key, "").lower())) for key in "ijk"}
    return "k" if len(words["i"] & words["k"]) > len(words["i"] & words["j"]) else "j"


class OllamaStub:
    """Start with ``with OllamaStub() as stub:``; ``stub.host`` is the URL to pass as --host."""

    def __init__(self, models: tuple[str, ...] = ("stub-model:latest",), behaviour: str = "normal",
                 delay_s: float = 0.0, slow_s: float = 5.0, port: int = 0,
                 delay_of: Callable[[int], float] | None = None) -> None:
        if behaviour not in BEHAVIOURS:
            raise ValueError(f"unknown behaviour {behaviour!r}; choose from {BEHAVIOURS}")
        self.models = list(models)
        self.behaviour = behaviour
        self.delay_s = delay_s
        self.slow_s = slow_s
        self.delay_of = delay_of
        self.in_flight = self.max_in_flight = 0
        self.chats: list[dict[str, Any]] = []
        self.tags_requests = 0
        self._queue: deque[str] = deque()
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def host(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def queue(self, behaviour: str, n: int = 1) -> None:
        """Use ``behaviour`` for the next ``n`` chat requests, then the default again."""
        if behaviour not in BEHAVIOURS:
            raise ValueError(f"unknown behaviour {behaviour!r}")
        with self._lock:
            self._queue.extend([behaviour] * n)

    def user_prompts(self) -> list[str]:
        """The user message of every chat request received so far."""
        with self._lock:
            return [m["content"] for c in self.chats for m in c.get("messages", []) if m.get("role") == "user"]

    def reset_counts(self) -> None:
        with self._lock:
            self.chats.clear()
            self.tags_requests = 0

    def _next_behaviour(self, body: dict[str, Any]) -> tuple[str, float]:
        """The request's behaviour and delay; counts it in flight."""
        with self._lock:
            self.chats.append(body)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            delay = self.delay_of(len(self.chats) - 1) if self.delay_of else self.delay_s
            return (self._queue.popleft() if self._queue else self.behaviour), delay

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def _send(self, status: int, payload: Any, raw: bytes | None = None) -> None:
                data = raw if raw is not None else json.dumps(payload).encode()
                self._done()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the client timed out
                    self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path != "/api/tags":
                    return self._send(404, {"error": "not found"})
                with stub._lock:
                    stub.tags_requests += 1
                served = [] if stub.behaviour == "missing" else stub.models
                self._send(200, {"models": [
                    {"name": m, "model": m, "modified_at": "2025-01-01T00:00:00Z", "size": 1,
                     "digest": "0" * 64, "details": {"format": "gguf", "family": "stub"}} for m in served]})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                if self.path != "/api/chat":
                    return self._send(404, {"error": "not found"})
                behaviour, delay = stub._next_behaviour(body)
                self.counted = True
                try:
                    self._chat(body, behaviour, delay)
                finally:
                    self._done()

            def _done(self) -> None:
                """No longer in flight (before the answer is sent: the client may ask again at once)."""
                if getattr(self, "counted", False):
                    self.counted = False
                    with stub._lock:
                        stub.in_flight -= 1

            def _chat(self, body: dict[str, Any], behaviour: str, delay: float) -> None:
                model = body.get("model", "")
                if behaviour == "missing":
                    return self._send(404, {"error": f"model '{model}' not found, try pulling it first"})
                if behaviour == "error500":
                    return self._send(500, {"error": "llama runner process has terminated"})
                if behaviour == "malformed":
                    return self._send(200, None, raw=b'{"model": "x", "message": {"role": "assist')
                if behaviour == "slow":
                    time.sleep(stub.slow_s)
                elif delay:
                    time.sleep(delay)
                user = next((m["content"] for m in body.get("messages", []) if m.get("role") == "user"), "")
                if behaviour == "outside":
                    content = json.dumps({"answer": "maybe"})
                elif behaviour == "bad_content":
                    content = "I think wound j, because"
                else:
                    content = json.dumps({"answer": stub_choice(user)})
                self._send(200, {
                    "model": model, "created_at": "2025-01-01T00:00:00Z",
                    "message": {"role": "assistant", "content": content},
                    "done": True, "done_reason": "stop", "total_duration": 1000,
                    "prompt_eval_count": len(user.split()), "eval_count": 5})

        return Handler

    def start(self) -> "OllamaStub":
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> "OllamaStub":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description="Loopback Ollama API stub for tests (127.0.0.1 only).")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--behaviour", choices=BEHAVIOURS, default="normal")
    parser.add_argument("--model", action="append", default=None)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--seconds", type=float, default=600.0, help="stop by itself after this long")
    args = parser.parse_args()
    stub = OllamaStub(tuple(args.model or ["stub-model:latest"]), args.behaviour, args.delay, port=args.port)
    with stub:
        print(stub.host, flush=True)
        time.sleep(args.seconds)


if __name__ == "__main__":
    main()
