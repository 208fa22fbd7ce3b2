"""The run kinds and the one way a job records its run.

Every run a job records has one of the :data:`KINDS` below, each a named constant. A job records
its run with :func:`recording`: it opens the run, and when the block ends finishes it ``done`` (with
the metrics and artifacts the block set), ``stopped`` on Ctrl-C or ``failed`` on any other error; the
reason of a stop or failure is the run's ``message``, the one field the Home page, the Train page's
job panel and the LLM oracle page show. The exception is re-raised.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

VISION_BASELINE = "vision-baseline"
VISION_MODEL = "vision-model"
VISION_TRIDERM = "vision-triderm"
VISION_FINETUNE = "vision-finetune"
TEXT_BASELINE = "text-baseline"
TEXT_SOE = "text-soe"
LLM_TRIPLETS = "llm-triplets"
FUSION = "fusion"
SLIMP = "slimp"
CONCEPTS = "concepts"
SEGMENTER = "segmenter"
FEATURES = "features"
ABLATION = "ablation"
BENCH_CONTRASTIVE = "bench-contrastive"
REPORT = "report"

KINDS: dict[str, str] = {
    VISION_BASELINE: "vision: a frozen backbone's tokens mean-pooled per wound (a photo the mean of its "
                     "wounds); nothing trained",
    VISION_MODEL: "vision: the workspace's photos embedded with an exported or shared trained model; "
                  "nothing trained",
    VISION_TRIDERM: "vision: TriDerm-V, an attention-pooling head over frozen backbone tokens, trained "
                    "self-supervised or on the expert triplets",
    VISION_FINETUNE: "vision (the default mode): the backbone's last stage and a head fine-tuned on the "
                     "expert triplets",
    TEXT_BASELINE: "text: a sentence encoder's embedding of the wound descriptions; nothing trained",
    TEXT_SOE: "text: an ordinal (SOE) embedding fitted to LLM or expert triplets",
    LLM_TRIPLETS: "text: an LLM oracle answering triplet questions about the wound descriptions",
    FUSION: "fusion: a vision run's and a text run's distances combined; nothing trained",
    SLIMP: "nested: SLIMP, photo and patient-metadata encoders trained contrastively",
    CONCEPTS: "concept: a vision-language model's concept heads trained on the wounds' concept labels",
    SEGMENTER: "vision: the wound segmentation network trained on the outlines",
    FEATURES: "vision: backbone features extracted into the shared feature cache; no embedding",
    ABLATION: "experiment: the Table 2 ablation cells (text and vision), over seeds",
    BENCH_CONTRASTIVE: "experiment: every variant of the contrastive concept training, over seeds",
    REPORT: "evaluation: the agreement report over every embedding run (and its fusion runs)",
}


@dataclass
class Recording:
    """An open run: its ``id``, and what :func:`recording` stores when the block ends normally
    (``metrics`` and ``artifacts`` merged into the run's; ``status`` ``done`` unless the block says
    ``failed`` or ``stopped``, with ``message`` its reason)."""

    id: int
    metrics: dict[str, Any] = field(default_factory=dict)
    artifacts: dict[str, str] = field(default_factory=dict)
    status: str = "done"
    message: str | None = None


def failure_reason(exc: BaseException) -> str:
    """``Type: text`` of ``exc`` (its type alone when it has no text)."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@contextmanager
def recording(ws_or_store: Any, kind: str, config: dict, seed: int | None = None, name: str | None = None,
              stop_message: str = "interrupted") -> Iterator[Recording]:
    """Open a ``kind`` run (a workspace or its store) and finish it when the block ends: ``done`` with
    what the block set on the :class:`Recording`, ``stopped`` (``stop_message``) on KeyboardInterrupt,
    ``failed`` with :func:`failure_reason` on any other exception; the exception is re-raised."""
    if kind not in KINDS:
        raise ValueError(f"unknown run kind {kind!r}; the kinds are {', '.join(KINDS)}")
    store = getattr(ws_or_store, "store", ws_or_store)
    rec = Recording(store.start_run(kind, config, seed=seed, name=name))
    try:
        yield rec
    except KeyboardInterrupt:
        store.finish_run(rec.id, status="stopped", message=stop_message)
        raise
    except BaseException as exc:
        store.finish_run(rec.id, status="failed", message=failure_reason(exc))
        raise
    store.finish_run(rec.id, status=rec.status, metrics=rec.metrics, artifacts=rec.artifacts, message=rec.message)


def finished(ws_or_store: Any, run_id: int, kind: str | None = None) -> dict[str, Any]:
    """Run ``run_id`` (of ``kind`` when given) of a workspace or its store, if it finished; otherwise a
    ValueError naming the run and where its list is."""
    store = getattr(ws_or_store, "store", ws_or_store)
    run = store.run(run_id)
    if run is None or run["status"] != "done" or (kind is not None and run["kind"] != kind):
        where = getattr(ws_or_store, "root", "the workspace")
        raise ValueError(f"{where}: no finished {kind + ' ' if kind else ''}run {run_id} (the Train page lists the "
                         "runs)")
    return run
