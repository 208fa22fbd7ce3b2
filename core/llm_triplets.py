"""Ask a triplet oracle (LLM or phantom) about the workspace's photos; resumable, concurrent.

TriDerm (paper §2.2, §3.2; METHODS.md §1 "Text"): the LLM is a synthetic expert answering
"Is wound i more similar to wound j or to wound k?" for triplets drawn over the photos, each
photo described by all its wounds' descriptions with their wound numbers.

Every answer is written to the store the moment it arrives (``add_llm_answer``: the query
cache keyed by oracle, model, prompt version, i, j, k, plus a triplet with source
``llm:<model>``), so a killed run resumes by asking only what is missing. ``--workers``
threads query concurrently; only the main thread writes to SQLite.

``--debias`` asks every question in both reference orders; agreeing pairs stand, and a
disagreeing pair (the answer followed the position, not the wound) is recorded as position
bias: both answers stay in the query cache, and the pair's triplets are replaced by one
``skip`` triplet so that no fit uses them.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

import numpy as np
from tqdm import tqdm

from annotations.workspace import Workspace, resolve_workspace
from core.llm import (DEFAULT_MODELS, ORACLES, PROMPT_VERSION, Answer, Oracle, OracleUnavailable, Question,
                      make_oracle)
from core.triplet_sampling import (SAMPLINGS, ActiveSampler, anchor_balanced_order, canonical_key,
                                   default_active_batch, n_questions, parse_budget, resolve_budget,
                                   uniform_order)


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
                 run_id: int | None = None, progress: bool = True) -> None:
        self.ws, self.oracle, self.debias = ws, oracle, debias
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
        self.asked = self.from_cache = self.failed = 0
        self.budget = 0

    # -- questions -------------------------------------------------------------------------
    def question(self, q: np.ndarray) -> Question:
        a, j, k = (self.ids[int(x)] for x in q)
        return Question(a, j, k, self.texts[a], self.texts[j], self.texts[k])

    def orders(self, q: np.ndarray) -> list[tuple[str, str, str]]:
        a, j, k = (self.ids[int(x)] for x in q)
        return [(a, j, k), (a, k, j)] if self.debias else [(a, j, k)]

    def is_answered(self, q: np.ndarray) -> bool:
        return all(o in self.cache for o in self.orders(q))

    def pending_orders(self, questions: Iterable[np.ndarray]) -> list[Question]:
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
    def _answers(self, questions: list[Question]) -> Iterator[tuple[Question, Answer | Exception]]:
        """Answers as they complete; at most 2×workers chunks in flight."""
        size = max(1, self.oracle.batch_size)
        chunks = [questions[s:s + size] for s in range(0, len(questions), size)]
        with ThreadPoolExecutor(self.workers) as pool:
            running: dict[Future, list[Question]] = {}
            todo = iter(chunks)
            while True:
                while len(running) < 2 * self.workers:
                    chunk = next(todo, None)
                    if chunk is None:
                        break
                    running[pool.submit(self.oracle.answer_batch, chunk)] = chunk
                if not running:
                    return
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for fut in done:
                    chunk = running.pop(fut)
                    try:
                        results = fut.result()
                    except OracleUnavailable:
                        for f in running:
                            f.cancel()
                        raise
                    yield from zip(chunk, results)

    def ask(self, questions: list[Question], bar: tqdm | None = None) -> None:
        """Ask, store every answer at once, count failures; OracleUnavailable propagates."""
        last_update = 0.0
        for q, result in self._answers(questions):
            if isinstance(result, Exception):
                self.failed += 1
                if bar is not None:
                    bar.set_postfix(failed=self.failed)
            else:
                self.ws.store.add_llm_answer(
                    self.oracle.name, self.oracle.model, PROMPT_VERSION, q.anchor, q.ref_j, q.ref_k,
                    result.choice, result.raw, result.latency_ms, result.tokens_in, result.tokens_out)
                self.cache[(q.anchor, q.ref_j, q.ref_k)] = result.choice
                self.asked += 1
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
        done = min(1.0, (self.from_cache + self.asked + self.failed) / max(1, self.budget * per_q))
        self.ws.store.update_run(self.run_id, progress=done, metrics={
            "asked": self.asked, "from_cache": self.from_cache, "failed": self.failed})

    def bar(self, total: int) -> tqdm:
        return tqdm(total=total, desc=f"{self.oracle.name}:{self.oracle.model}", unit="q",
                    disable=not self.progress, dynamic_ncols=True)

    # -- plans -----------------------------------------------------------------------------
    def run_fixed(self, order: np.ndarray, budget: int) -> np.ndarray:
        plan = order[:budget]
        pending = self.pending_orders(plan)
        with self.bar(len(pending)) as bar:
            self.ask(pending, bar)
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
        sampler = ActiveSampler(self.n, batch, seed=seed)
        answered_mask = np.array([self.is_answered(q) for q in sampler.questions])
        asked_q = sampler.questions[answered_mask][:budget]
        self.from_cache += len(asked_q) * (2 if self.debias else 1)
        with self.bar(max(0, budget - len(asked_q)) * (2 if self.debias else 1)) as bar:
            while len(asked_q) < budget:
                size = min(batch, budget - len(asked_q))
                nxt = sampler.next_batch(self.oriented(asked_q), canonical_key(asked_q, self.n), size)
                if len(nxt) == 0:
                    break
                self.ask(self.pending_orders(nxt), bar)
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
        answers = [self.cache.get(o) for q in plan for o in self.orders(q)]
        jk = [a for a in answers if a in ("j", "k")]
        return sum(a == "j" for a in jk) / len(jk) if jk else None


def run(ws: Workspace, oracle: Oracle, budget: int | float, sampling: str = "uniform", workers: int = 1,
        debias: bool = False, seed: int = 0, active_batch: int | None = None, progress: bool = True,
        config_extra: dict | None = None) -> dict[str, Any]:
    """Run a query plan against ``oracle``; returns the JSON summary (also stored in the run)."""
    if sampling not in SAMPLINGS:
        raise ValueError(f"unknown sampling {sampling!r}; choose one of {', '.join(SAMPLINGS)}")
    qr = QueryRun(ws, oracle, debias=debias, workers=workers, progress=progress)
    if qr.n < 3:
        raise ValueError(f"{ws.root}: only {qr.n} photos have wound descriptions; triplets need at least 3")
    total = n_questions(qr.n)
    count = resolve_budget(budget, total)
    qr.budget = count
    batch = active_batch or default_active_batch(qr.n)
    config = {"oracle": oracle.name, "model": oracle.model, "prompt_version": PROMPT_VERSION,
              "budget": budget, "budget_questions": count, "sampling": sampling, "workers": workers,
              "debias": debias, "n_images": qr.n, "synthetic": ws.is_synthetic, "source": qr.source,
              **({"active_batch": batch} if sampling == "active" else {}), **(config_extra or {})}
    qr.run_id = ws.store.start_run("llm-triplets", config, seed=seed,
                                   name=f"{oracle.name}:{oracle.model} {sampling} {count}")
    try:
        oracle.check()
        if sampling == "active":
            plan = qr.run_active(count, batch, seed)
        else:
            order = uniform_order(qr.n, seed) if sampling == "uniform" else anchor_balanced_order(qr.n, seed)
            plan = qr.run_fixed(order, count)
    except OracleUnavailable as exc:
        ws.store.finish_run(qr.run_id, status="failed", message=str(exc))
        raise
    except KeyboardInterrupt:
        ws.store.finish_run(qr.run_id, status="stopped", message="interrupted; rerun to resume")
        raise
    pairs, bias = qr.mark_position_bias(plan) if debias else (0, 0)
    oriented = qr.oriented(plan)
    summary = {
        "run_id": qr.run_id, "oracle": oracle.name, "model": oracle.model, "source": qr.source,
        "prompt_version": PROMPT_VERSION, "sampling": sampling, "questions": int(len(plan)),
        "budget_questions": count, "asked": qr.asked, "from_cache": qr.from_cache, "failed": qr.failed,
        "usable_triplets": int(len(oriented)),
        "position_bias_rate": bias / pairs if debias and pairs else None, "debiased_pairs": pairs,
        "first_position_rate": qr.first_position_rate(plan),
        "expert_overlap": qr.expert_overlap(oriented),
        "synthetic": ws.is_synthetic, "demo_oracle": oracle.name == "local",
    }
    status = "done" if qr.failed == 0 and len(plan) == count else "failed"
    ws.store.finish_run(qr.run_id, status=status, metrics=summary,
                        message=None if status == "done" else f"{qr.failed} questions failed; rerun to retry them")
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m core.llm_triplets",
        description="Ask a triplet oracle (synthetic expert) about the workspace's photos. Resumable: "
                    "answers are cached in the store; a rerun asks only what is missing.")
    parser.add_argument("--workspace", default=None, help="workspace folder (default $TRIDERM_WORKSPACE or ./workspace)")
    parser.add_argument("--oracle", choices=ORACLES, default="local",
                        help="ollama (real LLM server), local (offline SmolLM2-135M DEMO oracle), "
                             "phantom (SYNTHETIC truth of a phantom workspace; research/benchmark)")
    parser.add_argument("--model", default=None, help=f"model name (defaults: {DEFAULT_MODELS})")
    parser.add_argument("--host", default=None, help="Ollama server URL (default $OLLAMA_HOST or localhost)")
    parser.add_argument("--budget", default="1.0", help="questions: a count (200) or a fraction (0.1, 10%%)")
    parser.add_argument("--sampling", choices=SAMPLINGS, default="uniform")
    parser.add_argument("--active-batch", type=int, default=None,
                        help="questions per active round (default 0.5%% of all, at least one per photo)")
    parser.add_argument("--workers", type=int, default=1, help="concurrent queries")
    parser.add_argument("--debias", action="store_true", help="ask both reference orders; report position bias")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per Ollama request")
    parser.add_argument("--retries", type=int, default=3, help="retries per Ollama request (exponential backoff)")
    parser.add_argument("--batch-size", type=int, default=8, help="questions per forward pass (local oracle)")
    args = parser.parse_args(argv)
    try:
        budget = parse_budget(args.budget)
    except ValueError as exc:
        parser.error(str(exc))
    if args.workers < 1:
        parser.error("--workers must be ≥ 1")
    if args.active_batch is not None and args.active_batch < 1:
        parser.error("--active-batch must be ≥ 1")
    ws = Workspace(resolve_workspace(args.workspace))
    kwargs: dict[str, Any] = {}
    if args.oracle == "ollama":
        kwargs = {"timeout": args.timeout, "retries": args.retries}
    elif args.oracle == "local":
        kwargs = {"batch_size": args.batch_size}
    try:
        oracle = make_oracle(args.oracle, args.model, host=args.host, truth_dir=ws.truth_dir, seed=args.seed, **kwargs)
        summary = run(ws, oracle, budget, args.sampling, args.workers, args.debias, args.seed,
                      args.active_batch, progress=True,
                      config_extra={"host": getattr(oracle, "host", None)})
    except (OracleUnavailable, ValueError) as exc:
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    if args.oracle == "local":
        print("NOTE: the local SmolLM2-135M oracle is a DEMO oracle, not a clinical one.", file=sys.stderr)
    if summary["synthetic"]:
        print("NOTE: SYNTHETIC (phantom) workspace.", file=sys.stderr)
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
