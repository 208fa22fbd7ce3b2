"""Asking the synthetic expert (TriDerm-T, §2.3): triplet questions over the photos' descriptions
put to an oracle, resumable and concurrent, uniform, anchor-balanced or active, answers stored.

A run stops asking once ``max_failures`` questions have failed after the oracle's retries (a
dead or broken server is not asked for days); its record is then ``failed`` and says why.
"""
from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from collections.abc import Generator, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
from tqdm import tqdm

from annotations.infra.workspace import Workspace
from annotations.store import runs
from core.text.llm import PROMPT_VERSION, Answer, Oracle, Question
from core.text.sampling import (
    SAMPLINGS,
    ActiveSampler,
    anchor_balanced_order,
    canonical_key,
    default_active_batch,
    n_questions,
    resolve_budget,
    uniform_order,
)

log = logging.getLogger(__name__)


def photo_texts(ws: Workspace) -> dict[str, str]:
    """Per photo with at least one description: its wounds' descriptions, numbered."""
    by_image: dict[str, list[str]] = {}
    for w in ws.store.wounds():
        text = (w["description"] or "").strip()
        if text:
            by_image.setdefault(w["image_id"], []).append(f"Wound {w['wound_index']}: {text}")
    return {im: "\n".join(lines) for im, lines in sorted(by_image.items())}


class QueryRun:
    """One query run: the plan, the cache, the workers and the bookkeeping of a summary."""

    def __init__(self, ws: Workspace, oracle: Oracle, debias: bool = False, workers: int = 1,
                 run_id: int | None = None, progress: bool = True, max_failures: int | None = None) -> None:
        self.ws, self.oracle, self.debias = ws, oracle, debias
        self.max_failures = max_failures
        self.stopped: str | None = None  # why asking stopped early (too many failures)
        self.workers = max(1, workers)
        self.run_id = run_id
        self.progress = progress
        self.texts = photo_texts(ws)
        self.ids = list(self.texts)
        self.n = len(self.ids)
        self.source = f"llm:{oracle.model}"
        self.cache: dict[tuple[str, str, str], str] = {
            (r["anchor"], r["ref_j"], r["ref_k"]): r["choice"]
            for r in ws.store.llm_answers(oracle.name, oracle.model, PROMPT_VERSION)}
        self.answered = self.from_cache = self.failed = 0
        self.budget = 0
        self.estimate: dict[str, Any] | None = None

    # -- questions -------------------------------------------------------------------------
    def question(self, q: np.ndarray) -> Question:
        """The question ``q`` (photo indices) with the photos' texts."""
        a, j, k = (self.ids[int(x)] for x in q)
        return Question(a, j, k, self.texts[a], self.texts[j], self.texts[k])

    def orders(self, q: np.ndarray) -> list[tuple[str, str, str]]:
        """The orders in which ``q`` is asked: both sides when debiasing, else as drawn."""
        a, j, k = (self.ids[int(x)] for x in q)
        return [(a, j, k), (a, k, j)] if self.debias else [(a, j, k)]

    def is_answered(self, q: np.ndarray) -> bool:
        """Whether every order of ``q`` has a cached answer."""
        return all(o in self.cache for o in self.orders(q))

    def pending_orders(self, questions: Iterable[np.ndarray]) -> list[Question]:
        """The orders of ``questions`` still to ask (cached ones are counted as such)."""
        out: list[Question] = []
        for q in questions:
            base = self.question(q)
            for order, question in zip(self.orders(q), (base, base.swapped())):
                if order in self.cache:
                    self.from_cache += 1
                else:
                    out.append(question)
        return out

    # -- asking ----------------------------------------------------------------------------
    def _answers(self, questions: list[Question]) -> Generator[tuple[Question, Answer | Exception], None, None]:
        """Answers in question order (so the store's order is the plan's, whatever the timing),
        ``workers`` requests in flight and at most 2×workers chunks under way."""
        size = max(1, self.oracle.batch_size)
        chunks = [questions[s:s + size] for s in range(0, len(questions), size)]
        pool = ThreadPoolExecutor(self.workers)
        running: deque[tuple[Future, list[Question]]] = deque()
        try:
            todo = iter(chunks)
            while True:
                while len(running) < 2 * self.workers:
                    chunk = next(todo, None)
                    if chunk is None:
                        break
                    running.append((pool.submit(self.oracle.answer_batch, chunk), chunk))
                if not running:
                    return
                fut, chunk = running.popleft()
                yield from zip(chunk, fut.result())
        finally:  # stopped early (failures, unavailable oracle, interrupt): ask nothing more
            for f, _ in running:
                f.cancel()
            pool.shutdown(wait=False, cancel_futures=True)

    # -- the estimate printed before a run asks ----------------------------------------------
    def history(self, last: int = 200) -> tuple[float | None, float | None]:
        """Median latency (ms) and mean input tokens of this oracle and model's last ``last``
        stored answers (None when there are none)."""
        rows = self.ws.store.llm_latencies(self.oracle.name, self.oracle.model, last)
        if not rows:
            return None, None
        tokens = [t for _, t in rows if t is not None]
        return float(np.median([lat for lat, _ in rows])), (float(np.mean(tokens)) if tokens else None)

    def announce(self, to_ask: int, probe_ms: float | None = None) -> dict[str, Any]:
        """The run's estimate (``self.estimate``, printed to stderr when ``progress``): questions to
        ask, concurrency, expected throughput (``workers`` × batch / median latency, assuming the
        server serves the requests in parallel), time and input tokens. The latency is the stored
        answers' of this oracle and model, else ``probe_ms`` (one question asked first)."""
        latency, tokens = self.history()
        basis = "stored answers"
        if probe_ms is not None:
            latency, basis = probe_ms, "one probe question"
        per_request = max(1, self.oracle.batch_size)
        qps = self.workers * per_request * 1000.0 / latency if latency else None
        self.estimate = {"to_ask": to_ask, "concurrency": self.workers, "latency_ms": latency, "basis": basis,
                         "throughput_qps": qps, "eta_s": to_ask / qps if qps else None,
                         "input_tokens": round(tokens * to_ask) if tokens is not None else None}
        if self.progress:
            eta = "unknown" if qps is None else time.strftime("%H:%M:%S", time.gmtime(to_ask / qps))
            tok = f", ~{self.estimate['input_tokens']:,} input tokens" if tokens is not None else ""
            log.info(f"{self.oracle.name}:{self.oracle.model}: {to_ask:,} questions to ask ({self.from_cache:,} "
                     f"cached), concurrency {self.workers}: ~{qps or 0:.2f} questions/s (median latency "
                     f"{latency or 0:.0f} ms, from {basis}); estimated time {eta}{tok}")
        return self.estimate

    def start(self, questions: list[Question], to_ask: int, bar: tqdm | None = None) -> list[Question]:
        """Print the estimate before asking (probing with the first question when nothing is
        stored yet); returns the questions still to ask."""
        if self.estimate is not None:
            return questions
        probe_ms = None
        if questions and self.history()[0] is None:
            t0 = time.perf_counter()
            self.ask(questions[:1], bar)
            probe_ms, questions = 1000 * (time.perf_counter() - t0), questions[1:]
        self.announce(to_ask, probe_ms)
        return questions

    def ask(self, questions: list[Question], bar: tqdm | None = None) -> None:
        """Ask, store every answer at once, count failures and stop at ``max_failures``;
        OracleUnavailable propagates."""
        last_update = 0.0
        if self.stopped:
            return
        with contextlib.closing(self._answers(questions)) as answers:
            for q, result in answers:
                if isinstance(result, Exception):
                    self.failed += 1
                    if bar is not None:
                        bar.set_postfix(failed=self.failed)
                    if self.max_failures is not None and self.failed >= self.max_failures:
                        self.stopped = (f"stopped after {self.failed} failed questions (--max-failures "
                                        f"{self.max_failures}); last error: {result}")
                        break
                else:
                    self.ws.store.add_llm_answer(
                        self.oracle.name, self.oracle.model, PROMPT_VERSION, q.anchor, q.ref_j, q.ref_k,
                        result.choice, result.raw, result.latency_ms, result.tokens_in, result.tokens_out)
                    self.cache[(q.anchor, q.ref_j, q.ref_k)] = result.choice
                    self.answered += 1
                if bar is not None:
                    bar.update(1)
                now = time.monotonic()
                if self.run_id is not None and now - last_update > 0.5:
                    last_update = now
                    self._report_progress()
        self._report_progress()

    def _report_progress(self) -> None:
        if self.run_id is None:
            return
        per_q = 2 if self.debias else 1
        done = min(1.0, (self.from_cache + self.answered + self.failed) / max(1, self.budget * per_q))
        self.ws.store.update_run(self.run_id, progress=done, metrics={
            "asked": self.answered + self.failed, "answered": self.answered, "from_cache": self.from_cache,
            "failed": self.failed})

    def bar(self, total: int) -> tqdm:
        """A progress bar over ``total`` questions to the oracle."""
        return tqdm(total=total, desc=f"{self.oracle.name}:{self.oracle.model}", unit="q",
                    disable=not self.progress, dynamic_ncols=True)

    # -- plans -----------------------------------------------------------------------------
    def run_fixed(self, order: np.ndarray, budget: int) -> np.ndarray:
        """Ask the first ``budget`` questions of ``order``; returns them."""
        plan = order[:budget]
        pending = self.pending_orders(plan)
        with self.bar(len(pending)) as bar:
            self.ask(self.start(pending, len(pending), bar), bar)
        return plan

    def oriented(self, questions: np.ndarray) -> np.ndarray:
        """Oriented (i, closer, farther) index triplets from the cached answers (agreeing pairs)."""
        rows = []
        for q in questions:
            choices = [self.cache.get(o) for o in self.orders(q)]
            if any(c not in ("j", "k") for c in choices):
                continue
            if self.debias and choices[0] == choices[1]:  # swapped positions: same letter = disagreement
                continue
            a, j, k = (int(x) for x in q)
            rows.append((a, j, k) if choices[0] == "j" else (a, k, j))
        return np.array(rows, dtype=np.int64).reshape(-1, 3)

    def run_active(self, budget: int, batch: int, seed: int) -> np.ndarray:
        """Ask ``budget`` questions chosen by active sampling in batches of ``batch``; returns them."""
        sampler = ActiveSampler(self.n, batch, seed=seed)
        candidates = sampler.questions
        if candidates is None:  # too many to enumerate: the answered ones come from the cache
            index = {image_id: i for i, image_id in enumerate(self.ids)}
            asked = {(index[a], *sorted((index[j], index[k]))): (index[a], index[j], index[k])
                     for a, j, k in self.cache if a in index and j in index and k in index}  # as asked
            candidates = np.array([asked[key] for key in sorted(asked)], dtype=np.int64).reshape(-1, 3)
        answered_mask = np.array([self.is_answered(q) for q in candidates], dtype=bool)
        asked_q = candidates[answered_mask][:budget]
        self.from_cache += len(asked_q) * (2 if self.debias else 1)
        with self.bar(max(0, budget - len(asked_q)) * (2 if self.debias else 1)) as bar:
            while len(asked_q) < budget and not self.stopped:
                size = min(batch, budget - len(asked_q))
                nxt = sampler.next_batch(self.oriented(asked_q), canonical_key(asked_q, self.n), size)
                if len(nxt) == 0:
                    break
                to_ask = max(0, budget - len(asked_q)) * (2 if self.debias else 1)
                self.ask(self.start(self.pending_orders(nxt), to_ask, bar), bar)
                asked_q = np.concatenate([asked_q, nxt[[self.is_answered(q) for q in nxt]]])
                if not all(self.is_answered(q) for q in nxt):  # failures: do not loop forever
                    break
        return asked_q

    # -- debias bookkeeping and summary ------------------------------------------------------
    def mark_position_bias(self, plan: np.ndarray) -> tuple[int, int]:
        """Replace the triplets of disagreeing order pairs by one 'skip'; (pairs, disagreeing)."""
        pairs = bias = 0
        rows = {(r["anchor"], r["ref_j"], r["ref_k"]): r for r in self.ws.store.triplets(source=self.source)}
        for q in plan:
            o1, o2 = self.orders(q)
            c1, c2 = self.cache.get(o1), self.cache.get(o2)
            if c1 not in ("j", "k") or c2 not in ("j", "k"):
                continue
            pairs += 1
            if c1 != c2:
                continue
            bias += 1
            for o in (o1, o2):
                row = rows.get(o)
                if row is not None and row["choice"] != "skip":
                    self.ws.store.delete_triplet(row["id"])
            if rows.get(o1, {}).get("choice") != "skip":
                self.ws.store.add_triplet(*o1, "skip", self.source)
        return pairs, bias

    def expert_overlap(self, oriented: np.ndarray) -> dict[str, Any]:
        """Agreement with the expert's non-skip triplets on the same (anchor, {j, k})."""
        llm = {(self.ids[a], frozenset((self.ids[j], self.ids[k]))): self.ids[j] for a, j, k in oriented}
        hits = total = 0
        for r in self.ws.store.expert_triplets():
            if r["choice"] not in ("j", "k"):
                continue
            chosen = llm.get((r["anchor"], frozenset((r["ref_j"], r["ref_k"]))))
            if chosen is not None:
                total += 1
                hits += chosen == (r["ref_j"] if r["choice"] == "j" else r["ref_k"])
        return {"n": total, "agreement": hits / total if total else None}

    def first_position_rate(self, plan: np.ndarray) -> float | None:
        """The share of j answers among the j/k answers to ``plan`` (position bias), or None without any."""
        answers = [self.cache.get(o) for q in plan for o in self.orders(q)]
        jk = [a for a in answers if a in ("j", "k")]
        return sum(a == "j" for a in jk) / len(jk) if jk else None


def run(ws: Workspace, oracle: Oracle, budget: int | float, sampling: str = "uniform", workers: int = 1,
        debias: bool = False, seed: int = 0, active_batch: int | None = None, progress: bool = True,
        config_extra: dict | None = None, max_failures: int | None = None) -> dict[str, Any]:
    """Run a query plan against ``oracle``; returns the JSON summary (also stored in the run).

    ``asked`` counts the questions put to the oracle by this run, ``answered`` those it answered,
    ``failed`` those that failed after its retries, ``from_cache`` those answered before; asking
    stops once ``max_failures`` questions have failed (``stopped`` says so)."""
    if sampling not in SAMPLINGS:
        raise ValueError(f"unknown sampling {sampling!r}; choose one of {', '.join(SAMPLINGS)}")
    if max_failures is not None and max_failures < 1:
        raise ValueError(f"max_failures must be ≥ 1, got {max_failures}")
    qr = QueryRun(ws, oracle, debias=debias, workers=workers, progress=progress, max_failures=max_failures)
    if qr.n < 3:
        raise ValueError(f"{ws.root}: only {qr.n} photos have wound descriptions; triplets need at least 3")
    total = n_questions(qr.n)
    count = resolve_budget(budget, total)
    qr.budget = count
    batch = active_batch or default_active_batch(qr.n)
    config = {"oracle": oracle.name, "model": oracle.model, "prompt_version": PROMPT_VERSION,
              "budget": budget, "budget_questions": count, "sampling": sampling, "workers": workers,
              "debias": debias, "n_images": qr.n, "synthetic": ws.is_synthetic, "source": qr.source,
              "max_failures": max_failures,
              **({"active_batch": batch} if sampling == "active" else {}), **(config_extra or {})}
    with runs.recording(ws, runs.LLM_TRIPLETS, config, seed=seed,
                        name=f"{oracle.name}:{oracle.model} {sampling} {count}",
                        stop_message="interrupted; rerun to resume") as rec:
        qr.run_id = rec.id
        oracle.check()
        if sampling == "active":
            plan = qr.run_active(count, batch, seed)
        else:
            order = uniform_order(qr.n, seed) if sampling == "uniform" else anchor_balanced_order(qr.n, seed)
            plan = qr.run_fixed(order, count)
        pairs, bias = qr.mark_position_bias(plan) if debias else (0, 0)
        oriented = qr.oriented(plan)
        summary = {
            "run_id": qr.run_id, "oracle": oracle.name, "model": oracle.model, "source": qr.source,
            "prompt_version": PROMPT_VERSION, "sampling": sampling, "questions": len(plan),
            "budget_questions": count, "asked": qr.answered + qr.failed, "answered": qr.answered,
            "from_cache": qr.from_cache, "failed": qr.failed, "stopped": qr.stopped,
            "usable_triplets": len(oriented),
            "position_bias_rate": bias / pairs if debias and pairs else None, "debiased_pairs": pairs,
            "first_position_rate": qr.first_position_rate(plan),
            "expert_overlap": qr.expert_overlap(oriented),
            "synthetic": ws.is_synthetic, "demo_oracle": oracle.name == "local", "estimate": qr.estimate,
        }
        rec.metrics = summary
        if qr.failed or len(plan) != count:
            rec.status = "failed"
            rec.message = qr.stopped or f"{qr.failed} questions failed after retries; rerun to retry them"
    return summary

