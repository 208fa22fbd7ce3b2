"""Ask a triplet oracle (LLM or phantom) about the workspace's photos; resumable, concurrent.

TriDerm (paper §2.2, §3.2; METHODS.md §1 "Text"): the LLM is a synthetic expert answering
"Is wound i more similar to wound j or to wound k?" for triplets drawn over the photos, each
photo described by all its wounds' descriptions with their wound numbers.

Every answer is written to the store the moment it arrives (``add_llm_answer``: the query
cache keyed by oracle, model, prompt version, i, j, k, plus a triplet with source
``llm:<model>``), so a killed run resumes by asking only what is missing. ``--concurrency`` (or
``--workers``) threads query concurrently; only the main thread writes to SQLite, in question
order. Before asking, the run prints its estimate: questions to ask, concurrency, throughput (from
the stored answers' median latency, else one probe question), time and input tokens.

``--debias`` asks every question in both reference orders; agreeing pairs stand, and a
disagreeing pair (the answer followed the position, not the wound) is recorded as position
bias: both answers stay in the query cache, and the pair's triplets are replaced by one
``skip`` triplet so that no fit uses them.

Exit status: 0 when every question was answered; 1 when any failed after the retries (asking
stops after ``--max-failures`` of them); 2 for bad arguments or an oracle that cannot answer at
all (unreachable server, missing model, a host off the allow-list). The last stderr line sums
the run up: asked, answered, failed, cached. The Ollama host must be on the allow-list: the
workspace setting ``ollama_hosts`` an administrator sets (default this machine), or
``$TRIDERM_OLLAMA_HOSTS`` (comma-separated host names or URLs), which overrides it for the CLI.

At registry scale: ``--ollama-host`` given several times spreads the questions over the servers,
``--concurrency`` requests in flight on each; a server that goes down is reported and its
questions are asked of the others (the run stops only when all are down). ``--oracle openai
--base-url URL`` (repeatable too) asks any OpenAI-compatible server — vLLM, llama.cpp server,
TGI — whose URL is on the same allow-list. Per-host answers and failures end the run's output.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from annotations.infra.workspace import Workspace, resolve_workspace
from core import cli
from core.text.llm import (
    DEFAULT_MODELS,
    OLLAMA_HOSTS_ENV,
    ORACLES,
    MultiHostOracle,
    OracleUnavailable,
    make_oracle,
    ollama_hosts,
)
from core.text.queries import run
from core.text.sampling import SAMPLINGS, parse_budget


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m core.llm_triplets",
        description="Ask a triplet oracle (synthetic expert) about the workspace's photos. Resumable: "
                    "answers are cached in the store; a rerun asks only what is missing.")
    cli.add_workspace(parser)
    cli.add_device(parser, help="device of the local oracle: auto (CUDA when available), cpu or cuda")
    parser.add_argument("--oracle", choices=ORACLES, default="local",
                        help="ollama (real LLM server), openai (an OpenAI-compatible server: --base-url), local (offline SmolLM2-135M DEMO oracle), "
                             "phantom (SYNTHETIC text oracle of a phantom workspace: reads only the descriptions; "
                             "research/benchmark)")
    parser.add_argument("--model", default=None, help=f"model name (defaults: {DEFAULT_MODELS})")
    parser.add_argument("--ollama-host", "--host", dest="host", action="append", default=None, metavar="URL",
                        help="Ollama server URL (default $OLLAMA_HOST or localhost; repeat for several servers); "
                             f"must be on the allow-list (workspace setting ollama_hosts, or ${OLLAMA_HOSTS_ENV})")
    parser.add_argument("--base-url", action="append", default=None, metavar="URL",
                        help="--oracle openai: the server's OpenAI-compatible API, e.g. http://gpu1:8000/v1 "
                             "(vLLM, llama.cpp server, TGI; repeat for several); on the same allow-list")
    parser.add_argument("--budget", default="1.0", help="questions: a count (200) or a fraction (0.1, 10%%)")
    parser.add_argument("--sampling", choices=SAMPLINGS, default="uniform")
    parser.add_argument("--active-batch", type=int, default=None,
                        help="questions per active round (default 0.5%% of all, at least one per photo)")
    parser.add_argument("--concurrency", "--workers", dest="workers", type=int, default=1,
                        help="concurrent requests to the oracle, per server (threads; answers are stored in "
                             "question order); the throughput and time expected are printed before asking")
    parser.add_argument("--debias", action="store_true", help="ask both reference orders; report position bias")
    cli.add_seed(parser)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per Ollama request")
    parser.add_argument("--retries", type=int, default=3,
                        help="retries per Ollama request on network and server errors (exponential backoff)")
    parser.add_argument("--connect-timeout", type=float, default=5.0, help="seconds to connect to the Ollama server")
    parser.add_argument("--max-failures", type=int, default=5,
                        help="stop asking after this many questions failed after retries (0: never stop)")
    cli.add_batch_size(parser, 8, help="questions per forward pass (local oracle; default 8)")
    return parser


def _budget(parser: argparse.ArgumentParser, args: argparse.Namespace) -> float | int:
    """Check the options; the question budget (a count or a fraction)."""
    try:
        budget = parse_budget(args.budget)
    except ValueError as exc:
        parser.error(str(exc))
    if args.workers < 1:
        parser.error("--concurrency must be ≥ 1")
    if args.active_batch is not None and args.active_batch < 1:
        parser.error("--active-batch must be ≥ 1")
    if args.max_failures < 0:
        parser.error("--max-failures must be ≥ 0")
    if args.base_url and args.oracle != "openai":
        parser.error("--base-url is for --oracle openai (Ollama servers: --ollama-host)")
    if args.host and args.oracle != "ollama":
        parser.error("--ollama-host is for --oracle ollama (OpenAI-compatible servers: --base-url)")
    if args.oracle == "openai" and not args.base_url:
        parser.error("--oracle openai needs --base-url (e.g. http://127.0.0.1:8000/v1)")
    return budget


def _oracle_kwargs(args: argparse.Namespace, ws: Workspace) -> dict[str, Any]:
    """The options of the chosen oracle: network settings and the allow-list of a server, the batch of the local one."""
    kwargs: dict[str, Any] = {}
    if args.oracle in ("ollama", "openai"):
        kwargs = {"timeout": args.timeout, "retries": args.retries, "connect_timeout": args.connect_timeout,
                  "allowed_hosts": ollama_hosts(ws.store.get_meta("ollama_hosts")),
                  "per_host": args.workers}
    elif args.oracle == "local":
        kwargs = {"batch_size": args.batch_size}
    return kwargs


def main(argv: list[str] | None = None) -> int:
    """Ask the oracle the planned questions and print the run summary as JSON; 1 when questions failed
    (rerun to retry them), 0 otherwise."""
    parser = _parser()
    args = cli.parse_args(parser, argv)
    budget = _budget(parser, args)
    ws = Workspace(resolve_workspace(args.workspace))
    hosts = args.base_url if args.oracle == "openai" else args.host
    kwargs = _oracle_kwargs(args, ws)
    workers = args.workers * (len(hosts) if hosts else 1)
    try:
        oracle = make_oracle(args.oracle, args.model, host=hosts, truth_dir=ws.truth_dir, seed=args.seed, **kwargs)
        if args.oracle in ("ollama", "openai"):
            oracle.check()  # an unreachable server or missing model: one clear error within --connect-timeout
        summary = run(ws, oracle, budget, args.sampling, workers, args.debias, args.seed,
                      args.active_batch, progress=True, config_extra={"host": getattr(oracle, "host", None)},
                      max_failures=args.max_failures or None)
    except (OracleUnavailable, ValueError) as exc:
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    if isinstance(oracle, MultiHostOracle):
        summary["hosts"] = oracle.stats
        for line in oracle.report():
            print(f"{parser.prog}: {line}", file=sys.stderr)
    if args.oracle == "local":
        print("NOTE: the local SmolLM2-135M oracle is a DEMO oracle, not a clinical one.", file=sys.stderr)
    if summary["synthetic"]:
        print("NOTE: SYNTHETIC (phantom) workspace.", file=sys.stderr)
    print(json.dumps(summary, indent=1))
    print(f"{parser.prog}: run {summary['run_id']}: asked {summary['asked']}, answered {summary['answered']}, "
          f"failed {summary['failed']}, cached {summary['from_cache']} "
          f"({summary['questions']} of {summary['budget_questions']} questions)", file=sys.stderr)
    if summary["failed"]:
        why = summary["stopped"] or f"{summary['failed']} questions failed after retries"
        print(f"{parser.prog}: error: {why}; rerun to retry them", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

