"""Accounts, roles, lock-out, session tokens, name migration and exclusions (no Streamlit)."""
from __future__ import annotations

import io
import math
import time
from datetime import datetime, timedelta, timezone

import pytest

from annotations import accounts, consistency
from annotations.__main__ import main as cli
from annotations.accounts import AuthError
from annotations.store import Store

PW = "correct horse battery"


@pytest.fixture
def store(tmp_path) -> Store:
    s = Store(tmp_path / "triderm.sqlite")
    for n in range(1, 5):
        s.upsert_image(f"p{n}", f"p{n}.png", "0" * 64, 8, 8)
    return s


def test_salted_hashes_and_case_insensitive_unique_names(store):
    accounts.add_account(store, "Dr A", "annotator", PW, "test")
    accounts.add_account(store, "Dr B", "annotator", PW, "test")
    hashes = [r[0] for r in store.db.execute("SELECT password_hash FROM accounts")]
    assert len(set(hashes)) == 2 and all(h.startswith("$argon2id$") and PW not in h for h in hashes)
    with pytest.raises(AuthError, match="already exists"):
        accounts.add_account(store, "  dr   a ", "viewer", PW, "test")
    assert accounts.authenticate(store, "DR A", PW).name == "Dr A"
    with pytest.raises(AuthError, match="at least"):
        accounts.add_account(store, "Dr C", "viewer", "short", "test")
    with pytest.raises(AuthError, match="role"):
        accounts.add_account(store, "Dr C", "superuser", PW, "test")
    assert [r["action"] for r in store.revisions("accounts")] == ["insert", "insert"]


def test_lock_out_after_repeated_failures_then_expiry(store):
    accounts.add_account(store, "Dr A", "annotator", PW, "test")
    t0 = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)
    for _ in range(accounts.MAX_FAILED - 1):
        with pytest.raises(AuthError, match="wrong password"):
            accounts.authenticate(store, "Dr A", "nope", at=t0)
    with pytest.raises(AuthError, match="locked for"):
        accounts.authenticate(store, "Dr A", "nope", at=t0)
    with pytest.raises(AuthError, match="locked until 12:15 UTC"):  # the right password, still locked
        accounts.authenticate(store, "Dr A", PW, at=t0 + timedelta(minutes=5))
    assert accounts.authenticate(store, "Dr A", PW, at=t0 + timedelta(minutes=accounts.LOCK_MINUTES + 1))
    assert accounts.list_accounts(store)[0]["failed"] == 0
    with pytest.raises(AuthError, match="Unknown account or wrong password"):
        accounts.authenticate(store, "Nobody", PW)


def test_session_tokens_forged_expired_and_revoked(store, tmp_path, monkeypatch):
    found = accounts.add_account(store, "Dr A", "annotator", PW, "test")
    key = accounts.secret_key(tmp_path)
    assert accounts.secret_key(tmp_path) == key and (tmp_path / ".session_key").stat().st_mode & 0o077 == 0
    token = accounts.issue_token(store, key, found)
    assert accounts.account_from_token(store, key, token) == found
    with pytest.raises(AuthError, match="could not be verified"):
        accounts.account_from_token(store, key, token[:-2] + ("AA" if token[-2:] != "AA" else "BB"))
    with pytest.raises(AuthError, match="could not be verified"):
        accounts.account_from_token(store, "another key", token)
    with monkeypatch.context() as m:  # a token issued two seconds ago (the signer's clock is time.time)
        real = time.time
        m.setattr(time, "time", lambda: real() - 2)
        old = accounts.issue_token(store, key, found)
    with pytest.raises(AuthError, match="expired"):
        accounts.account_from_token(store, key, old, max_age_s=0)
    assert accounts.account_from_token(store, key, old, max_age_s=60) == found
    accounts.set_password(store, "Dr A", PW + "!", "test")  # signs every browser out
    with pytest.raises(AuthError, match="no longer valid"):
        accounts.account_from_token(store, key, token)


def test_roles_and_last_admin(store):
    accounts.add_account(store, "Boss", "admin", PW, "test")
    assert accounts.get(store, "boss").can("manage") and not accounts.Account("x", "viewer").can("annotate")
    with pytest.raises(AuthError, match="only admin"):
        accounts.set_role(store, "Boss", "viewer", "test")
    with pytest.raises(AuthError, match="only admin"):
        accounts.set_disabled(store, "Boss", True, "test")


def test_cli_adds_an_admin_without_a_default_password(tmp_path, monkeypatch, capsys):
    ws = str(tmp_path / "ws")
    monkeypatch.setattr("sys.stdin", io.StringIO(PW + "\n"))
    assert cli(["users", "add", "--role", "admin", "Boss", "--password-stdin", "--workspace", ws]) == 0
    monkeypatch.setattr("sys.stdin", io.StringIO("\n"))
    assert cli(["users", "add", "--role", "viewer", "Empty", "--password-stdin", "--workspace", ws]) == 2
    assert "at least" in capsys.readouterr().err
    store = Store(tmp_path / "ws" / "triderm.sqlite")
    assert accounts.authenticate(store, "boss", PW).role == "admin" and accounts.get(store, "Empty") is None
    assert cli(["users", "list", "--workspace", ws]) == 0
    assert "Boss\tadmin" in capsys.readouterr().out


def test_free_text_names_move_to_an_account_with_history(store):
    for name, choice in (("dr a", "j"), ("Dr A ", "k")):
        store.add_triplet("p1", "p2", "p3", choice, f"expert:{name.strip()}")
    accounts.add_account(store, "Dr A", "annotator", PW, "test")
    assert accounts.legacy_names(store) == ["dr a"]  # "Dr A" already is the account's source
    assert accounts.map_name(store, "dr a", "Dr A", "Boss") == 1
    rows = store.triplets(source="expert:Dr A")
    assert sorted((r["choice"], r["rep"]) for r in rows) == [("j", 1), ("k", 0)]  # kept as a repeat
    (change,) = [r for r in store.revisions("triplets") if r["action"] == "update"]
    assert change["old"] == {"source": "expert:dr a", "rep": 0} and change["actor"] == "Boss"
    assert accounts.legacy_names(store) == []


def test_exclusions_leave_rows_out_of_every_metric(store):
    ids = [store.add_triplet("p1", "p2", f"p{n}", "j", "expert:Tess") for n in (3, 4)]
    store.add_triplet("p1", "p2", "p3", "k", "expert:Practice")
    accounts.exclude(store, "annotator", "Practice", "practice", "Boss")
    accounts.exclude(store, "triplet", ids[0], "", "Boss")
    assert [r["id"] for r in store.expert_triplets()] == [ids[1]]
    assert len(store.expert_triplets(include_excluded=True)) == 3
    accounts.include(store, "triplet", ids[0], "Boss")
    assert [r["id"] for r in store.expert_triplets()] == ids
    assert [r["action"] for r in store.revisions("exclusions")] == ["insert", "insert", "delete"]


def test_review_progress_and_disagreements():
    rows = [{"id": 1, "anchor": "a", "ref_j": "b", "ref_k": "c", "choice": "j", "source": "expert:X", "rep": 0,
             "latency_ms": 1000.0, "created": "1"},
            {"id": 2, "anchor": "a", "ref_j": "c", "ref_k": "b", "choice": "j", "source": "expert:Y", "rep": 0,
             "latency_ms": 3000.0, "created": "2"},
            {"id": 3, "anchor": "a", "ref_j": "d", "ref_k": "b", "choice": "skip", "source": "expert:Y", "rep": 0,
             "latency_ms": None, "created": "3"}]
    (d,) = consistency.disagreements(rows)
    assert d["refs"] == ("b", "c") and d["answers"] == {"X": (1, "b"), "Y": (2, "c")}
    prog = consistency.progress(rows)
    assert prog["Y"]["answered"] == 2 and prog["Y"]["skips"] == 1 and prog["Y"]["median_ms"] == 3000.0
    assert math.isnan(consistency.progress([{**rows[2]}])["Y"]["median_ms"])
