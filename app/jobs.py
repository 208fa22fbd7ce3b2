"""Background work of the app: a job's controls, status and log (:func:`job_panel`), and a task run once per
server process in a thread (:func:`in_background`)."""

from __future__ import annotations

import re
import threading

import streamlit as st

from annotations.infra.workspace import Workspace
from app.markup import escape_md, status_badge
from triderm import install_hint

_BACKGROUND: set[str] = set()
_BACKGROUND_LOCK = threading.Lock()


def in_background(key: str, fn, *args) -> None:
    """Run ``fn(*args)`` in a daemon thread unless a task with ``key`` is already running in this
    server process (e.g. one UMAP per run, however many browsers ask for it)."""
    with _BACKGROUND_LOCK:
        if key in _BACKGROUND:
            return
        _BACKGROUND.add(key)

    def work() -> None:
        try:
            fn(*args)
        finally:
            with _BACKGROUND_LOCK:
                _BACKGROUND.discard(key)

    threading.Thread(target=work, name=f"triderm-{key}", daemon=True).start()


def module_available(module: str) -> bool:
    """Whether ``core.<module>`` exists (other parts of the product may land later)."""
    import importlib.util

    try:
        return importlib.util.find_spec(f"core.{module}") is not None
    except (ImportError, ValueError):
        return False



def readable_log(log: str) -> tuple[str, str | None]:
    """A job log's tail without its Python traceback, and the failure as one sentence (the exception's last
    line, with the extra to install when it is a missing module of one); (the log, None) when it has none."""
    lines = log.splitlines()
    start = next((n for n, line in enumerate(lines) if line.startswith(("Traceback (most recent call last)",
                                                                          '  File "'))), None)
    if start is None:
        return log, None
    last = next((line.strip() for line in reversed(lines[start:]) if line.strip() and not line.startswith(" ")),
                "")
    missing = re.match(r"(?:ModuleNotFoundError|ImportError): No module named '([\w.]+)'", last)
    hint = install_hint(missing.group(1)) if missing else None
    why = (f"this server lacks the module {missing.group(1)}; install its extra: {hint}" if hint else last
           or "it ended with an error")
    return "\n".join(lines[:start]), f"The job failed: {why}."


def job_panel(ws: Workspace, name: str, module: str, args: list[str], label: str, start: bool = True,
              blocked: str | None = None) -> dict | None:
    """Start / stop / resume controls, status, progress and log tail of one background job
    (``start=False``: the page starts it itself, e.g. from a form's submit button; ``blocked``: why it cannot
    start here, e.g. the install hint of a missing extra: Start and Resume stay, disabled, saying so)."""
    from annotations.infra import jobs

    if not module_available(module):
        st.info(f"`python -m core.{module}` is not available in this installation yet — "
                "this job cannot be started here.", icon="🚧")
        return None
    record = jobs.job(ws, name)
    alive = bool(record and record["alive"])
    c1, c2, c3 = st.columns([1, 1, 4])
    if start and c1.button(f"Start {label}", key=f"start_{name}", type="primary", disabled=alive or bool(blocked),
                           help=blocked):
        try:
            jobs.start_job(ws, name, module, args)
        except ValueError as err:
            st.error(escape_md(str(err)))
        st.rerun()
    if alive:
        if c2.button("Stop", key=f"stop_{name}"):
            jobs.stop_job(ws, name)
            st.rerun()
    elif record is not None and c2.button("Resume", key=f"resume_{name}", disabled=bool(blocked),
                                          help=blocked or "Relaunch the same command; it continues from its cache"):
        jobs.resume_job(ws, name)
        st.rerun()
    if record is not None:
        run = record.get("run")
        state = "running" if alive else (run["status"] if run else "exited")
        if not alive and run is not None and run["status"] == "running":
            state = "exited without finishing (resume to continue)"
        c3.markdown(f"{escape_md(status_badge(state))} · pid {record['pid']} · {escape_md(' '.join(record['cmd'][2:]))}")
        if run is not None:
            st.progress(min(1.0, float(run["progress"] or 0)),
                        text=f"run {run['id']} ({escape_md(run['kind'])}): {escape_md(run['message'] or run['status'])}")
        log, failure = readable_log(jobs.tail_log(ws, name, 12))
        if failure:
            st.error(escape_md(failure))
        if log:
            st.code(log, language=None)
    return record


def any_job_running(ws: Workspace) -> bool:
    """Whether any job of the workspace is still running."""
    from annotations.infra import jobs

    return any(j["alive"] for j in jobs.jobs(ws))
