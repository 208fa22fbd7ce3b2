"""Accounts: the store's queries of the ``accounts`` and ``exclusions`` tables, and the moves of an earlier
version's free-text annotator's judgments to an account (:class:`Accounts`, which
:class:`~annotations.store.store.Store` composes).

:mod:`annotations.accounts.accounts` holds the rules (names, passwords, sign-in throttling, session tokens)
and the transactions; these queries join them.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from annotations.store.rows import now

if TYPE_CHECKING:
    import sqlite_utils


class Accounts:
    """The ``accounts`` and ``exclusions`` tables' queries, a part of :class:`~annotations.store.store.Store`."""

    if TYPE_CHECKING:  # set by Store.__init__
        db: sqlite_utils.Database

    # -- accounts ------------------------------------------------------------------------------------
    def account_rows(self) -> list[dict[str, Any]]:
        """Every account row, password hash included, by stored name."""
        return list(self.db.query("SELECT * FROM accounts ORDER BY name"))

    def account_names(self, *, ordered: bool = True) -> list[str]:
        """Every account's stored name, by name when ``ordered`` (else in the order SQLite reads them)."""
        sql = "SELECT name FROM accounts" + (" ORDER BY name" if ordered else "")
        return [r["name"] for r in self.db.query(sql)]

    def account_by_email(self, email: str) -> dict[str, Any] | None:
        """The enabled account row with this e-mail address (compared ignoring case), or None."""
        rows = list(self.db.query("SELECT * FROM accounts WHERE email = ? COLLATE NOCASE AND disabled = 0",
                                  [email]))
        return rows[0] if rows else None

    def account_list(self) -> list[dict[str, Any]]:
        """Every account row without its password hash, by name ignoring case."""
        return [{k: v for k, v in r.items() if k != "password_hash"}
                for r in self.db.query("SELECT * FROM accounts ORDER BY name COLLATE NOCASE")]

    def insert_account(self, name: str, password_hash: str | None, role: str, email: str | None) -> None:
        """Insert the account row (created now)."""
        self.db.execute(
            "INSERT INTO accounts (name, password_hash, role, email, created) VALUES (?, ?, ?, ?, ?)",
            [name, password_hash, role, email, now()])

    def set_account_role(self, name: str, role: str) -> None:
        """Set the account's role and end its sessions."""
        self.db.execute("UPDATE accounts SET role = ?, session_epoch = session_epoch + 1 WHERE name = ?",
                        [role, name])

    def set_account_password(self, name: str, password_hash: str) -> None:
        """Set the account's password hash, clear its failed sign-ins and lock, and end its sessions."""
        self.db.execute("UPDATE accounts SET password_hash = ?, failed = 0, locked_until = NULL, "
                        "session_epoch = session_epoch + 1 WHERE name = ?", [password_hash, name])

    def unlock_account(self, name: str) -> None:
        """Clear the account's failed sign-ins and lock."""
        self.db.execute("UPDATE accounts SET failed = 0, locked_until = NULL WHERE name = ?", [name])

    def end_account_sessions(self, name: str) -> None:
        """Bump the account's ``session_epoch``: every session token issued so far stops being valid."""
        self.db.execute("UPDATE accounts SET session_epoch = session_epoch + 1 WHERE name = ?", [name])

    def set_account_disabled(self, name: str, disabled: bool) -> None:
        """Disable or re-enable the account and end its sessions."""
        self.db.execute("UPDATE accounts SET disabled = ?, session_epoch = session_epoch + 1 WHERE name = ?",
                        [int(disabled), name])

    def enabled_admins(self) -> int:
        """How many enabled admin accounts there are."""
        return self.db.execute("SELECT count(*) FROM accounts WHERE role = 'admin' AND disabled = 0").fetchone()[0]

    def has_accounts(self) -> bool:
        """Whether the store holds at least one account."""
        return self.db.execute("SELECT count(*) FROM accounts").fetchone()[0] > 0

    def set_sign_in_failures(self, name: str, failed: int, locked_until: str | None) -> None:
        """Store the account's count of failed sign-ins in a row and its lock (None: not locked)."""
        self.db.execute("UPDATE accounts SET failed = ?, locked_until = ? WHERE name = ?",
                        [failed, locked_until, name])

    def signed_in(self, name: str, password_hash: str, new_hash: str) -> None:
        """Clear the account's failed sign-ins and lock and store ``new_hash``, unless its password hash is no
        longer ``password_hash`` (changed since it was checked)."""
        self.db.execute("UPDATE accounts SET failed = 0, locked_until = NULL, password_hash = ? WHERE name = ? "
                        "AND password_hash = ?", [new_hash, name, password_hash])

    # -- free-text annotator names of earlier versions --------------------------------------------------
    def expert_sources(self) -> list[str]:
        """The distinct ``expert:<name>`` sources of the judgments."""
        return [r["source"] for r in self.db.query("SELECT DISTINCT source FROM triplets WHERE source LIKE 'expert:%'")]

    def triplet_taken(self, source: str, anchor: str, ref_j: str, ref_k: str, rep: int) -> bool:
        """Whether a judgment of ``source`` of this triplet and repeat number is stored."""
        return bool(self.db.execute(
            "SELECT 1 FROM triplets WHERE source = ? AND anchor = ? AND ref_j = ? AND ref_k = ? AND rep = ?",
            [source, anchor, ref_j, ref_k, rep]).fetchone())

    def move_triplet(self, triplet_id: int, source: str, rep: int) -> None:
        """Give the judgment ``triplet_id`` another source and repeat number."""
        self.db.execute("UPDATE triplets SET source = ?, rep = ? WHERE id = ?", [source, rep, triplet_id])

    def rename_excluded_annotator(self, name: str, new_name: str) -> None:
        """Make the exclusion of the annotator ``name`` (if any) name ``new_name``."""
        self.db.execute("UPDATE exclusions SET target = ? WHERE kind = 'annotator' AND target = ?",
                        [new_name, name])

    # -- exclusions from evaluation ------------------------------------------------------------------
    def insert_exclusion(self, kind: str, target: str, reason: str, actor: str) -> bool:
        """Insert the exclusion of ``target`` (created now); False when it was already excluded."""
        cur = self.db.execute("INSERT OR IGNORE INTO exclusions (kind, target, reason, actor, created) "
                              "VALUES (?, ?, ?, ?, ?)", [kind, target, reason, actor, now()])
        return cur.rowcount == 1

    def delete_exclusion(self, kind: str, target: str) -> bool:
        """Delete the exclusion of ``target``; False when there was none."""
        cur = self.db.execute("DELETE FROM exclusions WHERE kind = ? AND target = ?", [kind, target])
        return cur.rowcount == 1

    def exclusions(self) -> list[dict[str, Any]]:
        """Every exclusion row, by kind and target."""
        return list(self.db.query("SELECT * FROM exclusions ORDER BY kind, target"))
