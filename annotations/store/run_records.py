"""The run records: the store's queries of the ``runs`` table (:class:`RunRecords`, which
:class:`~annotations.store.store.Store` composes).

A run opens ``running`` with its config, seed, git sha and the process's identity; a heartbeat thread
stamps it until it finishes; a running record whose process is gone reads back as ``interrupted``.
"""
from __future__ import annotations

import sqlite3
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from annotations.infra import jobs
from annotations.store.rows import _decode, _dumps, now, where_equal

if TYPE_CHECKING:
    import sqlite_utils

#: ``interrupted``: the process ended without finishing its run (killed, crashed, machine restarted),
#: found by :func:`annotations.infra.jobs.run_gone` when runs are listed or opened
RUN_STATUSES = ("running", "done", "failed", "stopped", "interrupted")


def running_runs(path: Path) -> list[dict[str, Any]]:
    """The ``running`` run records of the store file ``path``, read only on a connection of their own
    (none when the file cannot be opened or is not a store)."""
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
    except sqlite3.Error:
        return []
    try:
        conn.row_factory = sqlite3.Row
        return [dict(r) for r in conn.execute("SELECT * FROM runs WHERE status = 'running'")]
    except sqlite3.Error:
        return []  # not a store (restore checks the backup, not this)
    finally:
        conn.close()


def git_sha() -> str:
    """The source tree's git commit (``unknown`` outside a checkout)."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], check=False, cwd=Path(__file__).resolve().parent,
            capture_output=True, text=True, timeout=5,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"


class RunRecords:
    """The ``runs`` table's queries, a part of :class:`~annotations.store.store.Store`."""

    if TYPE_CHECKING:  # set by Store.__init__
        db: sqlite_utils.Database
        path: Path
        timeout_s: float
        _heartbeats: dict[int, jobs.Heartbeat]

        transaction: Callable[[], Any]

    def start_run(self, kind: str, config: dict, seed: int | None = None,
                  name: str | None = None) -> int:
        """Open a run record (status ``running``) with its config, seed, git sha and this process's
        identity (pid, create time, host); a heartbeat thread stamps it until :meth:`finish_run`."""
        pid, created = jobs.process_identity()
        stamp = now()
        cur = self.db.execute(
            "INSERT INTO runs (kind, name, config, seed, git_sha, status, pid, pid_created, host, heartbeat, "
            "created) VALUES (?, ?, ?, ?, ?, 'running', ?, ?, ?, ?, ?)",
            [kind, name, _dumps(config), seed, git_sha(), pid, created, jobs.hostname(), stamp, stamp])
        assert cur.lastrowid is not None  # set by the INSERT
        run_id = cur.lastrowid
        self._heartbeats[run_id] = jobs.Heartbeat(lambda: self._beat(run_id))
        return run_id

    def _beat(self, run_id: int) -> bool:
        """Stamp a running run's heartbeat on a connection of the calling (heartbeat) thread;
        False once the run is no longer running."""
        conn = sqlite3.connect(self.path, timeout=self.timeout_s)
        try:
            with conn:
                cur = conn.execute("UPDATE runs SET heartbeat = ? WHERE id = ? AND status = 'running'",
                                   [now(), run_id])
            return cur.rowcount == 1
        finally:
            conn.close()

    def update_run(self, run_id: int, progress: float | None = None, metrics: dict | None = None,
                   message: str | None = None, artifacts: dict | None = None) -> None:
        """Update a run in place; ``metrics`` and ``artifacts`` are merged into the stored JSON."""
        with self.transaction():
            run = self.run(run_id)
            if run is None:
                raise KeyError(f"no run {run_id}")
            # the keys are SQL column names (f"{c} = ?"), which SQLite reads case-insensitively
            updates: dict[str, Any] = {"heartbeat": now()}  # pragma: no mutate
            if progress is not None:
                updates["progress"] = float(progress)  # pragma: no mutate (a column name: any case)
            if message is not None:
                updates["message"] = message  # pragma: no mutate (a column name: any case)
            if metrics:
                updates["metrics"] = _dumps({**run["metrics"], **metrics})  # pragma: no mutate (a column name: any case)
            if artifacts:
                updates["artifacts"] = _dumps({**run["artifacts"], **artifacts})  # pragma: no mutate (a column name)
            cols = ", ".join(f"{c} = ?" for c in updates)
            self.db.execute(f"UPDATE runs SET {cols} WHERE id = ?", [*updates.values(), run_id])

    def finish_run(self, run_id: int, status: str = "done", metrics: dict | None = None,
                   artifacts: dict | None = None, message: str | None = None) -> None:
        """Mark a run finished with ``status`` (``done`` sets progress to 1) and its last metrics, artifacts, message."""
        if status not in RUN_STATUSES:
            raise ValueError(f"status must be one of {RUN_STATUSES}, got {status!r}")
        self.update_run(run_id, progress=1.0 if status == "done" else None, metrics=metrics,
                        artifacts=artifacts, message=message)
        self.db.execute("UPDATE runs SET status = ?, finished = ? WHERE id = ?",
                        [status, now(), run_id])
        beat = self._heartbeats.pop(int(run_id), None)
        if beat is not None:
            beat.stop()

    def runs(self, kind: str | None = None, status: str | None = None) -> list[dict]:
        """Run records, newest first."""
        where, args = where_equal(kind=kind, status=status)
        rows = [self._reconciled(_decode(r)) for r in self.db.query("SELECT * FROM runs" + where + " ORDER BY id DESC", args)]
        return [r for r in rows if status is None or r["status"] == status]

    def run(self, run_id: int) -> dict | None:
        """One run's row, marked interrupted when its process is gone, or None."""
        rows = list(self.db.query("SELECT * FROM runs WHERE id = ?", [int(run_id)]))
        return self._reconciled(_decode(rows[0])) if rows else None

    def _reconciled(self, run: dict) -> dict:
        """``run``, marked ``interrupted`` (in the store too) when it says running but its process
        is gone (:func:`annotations.infra.jobs.run_gone`)."""
        reason = jobs.run_gone(run)
        if reason is None:
            return run
        stamp = now()
        marked = {**run, "status": "interrupted", "finished": stamp, "message": reason}
        try:
            cur = self.db.execute("UPDATE runs SET status = 'interrupted', finished = ?, message = ? "
                                  "WHERE id = ? AND status = 'running'", [stamp, reason, run["id"]])
        except sqlite3.OperationalError:  # read-only copy, or locked for long: say so, store it next time
            return marked
        # it finished meanwhile: read what it wrote (re-reading the row it just marked gives the marked values)
        if cur.rowcount != 1:  # pragma: no mutate
            return _decode(next(iter(self.db.query("SELECT * FROM runs WHERE id = ?", [run["id"]]))))
        return marked
