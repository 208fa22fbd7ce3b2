"""Accounts, roles, lock-out, session tokens, name migration and exclusions (no Streamlit)."""
from __future__ import annotations

import io
import math
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone

import pytest
from argon2 import PasswordHasher
from itsdangerous import URLSafeTimedSerializer

from annotations.__main__ import main as cli
from annotations.accounts import accounts
from annotations.accounts.accounts import AuthError
from annotations.scheduling import consistency
from annotations.store.store import Store

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


def test_lock_out_after_repeated_failures_then_expiry(store, hasher):
    accounts.add_account(store, "Dr A", "annotator", PW, "test")
    t0 = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)
    for _ in range(accounts.MAX_FAILED):
        with pytest.raises(AuthError, match="wrong password"):
            accounts.authenticate(store, "Dr A", "nope", at=t0)
    assert accounts.list_accounts(store)[0]["locked_until"] == "2026-01-01T12:15:00+00:00"
    with pytest.raises(AuthError, match="wrong password"):  # the right password, still locked
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
        accounts.account_from_token(store, "another key, long enough to be a key", token)
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


class CountingHasher(PasswordHasher):
    """A cheap Argon2id hasher that records every password checked against a real account's hash."""

    def __init__(self) -> None:
        super().__init__(time_cost=1, memory_cost=1024, parallelism=1)
        self.checked: list[str] = []
        self.dummy: list[str] = []
        self.lock = threading.Lock()

    def verify(self, hash, password):
        with self.lock:
            (self.dummy if hash == accounts._dummy_hash() else self.checked).append(password)
        time.sleep(0.02)  # a production hash's time, during which other sign-ins arrive
        return super().verify(hash, password)


@pytest.fixture
def hasher(monkeypatch) -> CountingHasher:
    counting = CountingHasher()
    monkeypatch.setattr(accounts, "_HASHER", counting)
    dummy = counting.hash("not a password of any account")
    monkeypatch.setattr(accounts, "_dummy_hash", lambda: dummy)
    return counting


def test_parallel_wrong_passwords_check_at_most_five_hashes(store, hasher):
    accounts.add_account(store, "Dr A", "annotator", PW, "test")

    def attempt(n: int) -> str:
        own = Store(store.path)  # one connection per sign-in, as separate app sessions have
        try:
            accounts.authenticate(own, "dr a", f"wrong {n}")
        except AuthError as err:
            return str(err)
        finally:
            own.close()
        return "signed in"

    with ThreadPoolExecutor(max_workers=32) as pool:
        answers = list(pool.map(attempt, range(100)))
    assert set(answers) == {accounts.REFUSED}
    assert len(hasher.checked) == accounts.MAX_FAILED  # the other 95 were refused by the lock, unchecked
    with pytest.raises(AuthError, match="wrong password"):  # the right password during the lock
        accounts.authenticate(store, "Dr A", PW)
    assert len(hasher.checked) == accounts.MAX_FAILED
    later = datetime.now(timezone.utc) + timedelta(minutes=accounts.LOCK_MINUTES + 1)
    assert accounts.authenticate(store, "Dr A", PW, at=later).name == "Dr A"


def test_unknown_names_get_the_same_answer_and_work(store, hasher):
    accounts.add_account(store, "Dr A", "annotator", PW, "test")
    answers = []
    for name in ("Dr A", "Nobody"):
        with pytest.raises(AuthError) as err:
            accounts.authenticate(store, name, "wrong password")
        answers.append(str(err.value))
    assert answers[0] == answers[1] == accounts.REFUSED  # no "tries left" only for names that exist
    assert len(hasher.checked) == 1 and len(hasher.dummy) == 1  # one hash check each


def test_sign_out_and_account_changes_revoke_sessions(store, tmp_path, hasher):
    accounts.add_account(store, "Boss", "admin", PW, "test")
    found = accounts.add_account(store, "Dr A", "annotator", PW, "test")
    key = accounts.secret_key(tmp_path)
    changes = [lambda: accounts.revoke_sessions(store, "dr a"),  # sign-out
               lambda: accounts.set_password(store, "Dr A", PW + "!", "Boss"),
               lambda: accounts.set_role(store, "Dr A", "viewer", "Boss"),
               lambda: accounts.set_disabled(store, "Dr A", True, "Boss")]
    for change in changes:
        token = accounts.issue_token(store, key, found)
        assert accounts.account_from_token(store, key, token).name == "Dr A"
        change()
        with pytest.raises(AuthError, match="no longer valid"):
            accounts.account_from_token(store, key, token)
    assert accounts.account_from_token(store, key, accounts.issue_token(store, key, accounts.get(store, "Boss")))


def test_session_key_is_whole_private_and_one_under_concurrent_first_use(tmp_path):
    for trial in range(40):
        root = tmp_path / f"ws{trial}"
        root.mkdir()
        start = threading.Barrier(8)

        def first_use(_: int) -> str:
            start.wait()
            return accounts.secret_key(root)

        with ThreadPoolExecutor(max_workers=8) as pool:
            keys = set(pool.map(first_use, range(8)))
        assert len(keys) == 1 and len(keys.pop()) >= accounts.MIN_KEY_CHARS, trial
        assert os.listdir(root) == [".session_key"]  # no temporary file left behind
        assert (root / ".session_key").stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("content", ["", "\n", "short-key"])
def test_an_empty_or_short_session_key_is_refused_never_used(store, tmp_path, content):
    found = accounts.add_account(store, "Boss", "admin", PW, "test")
    (tmp_path / ".session_key").write_text(content)  # left by a crash or a full disk at first use
    with pytest.raises(accounts.SessionKeyError, match="Delete the file and start the app again"):
        accounts.secret_key(tmp_path)
    forged = URLSafeTimedSerializer(content.strip(), salt="triderm-session").dumps({"name": "Boss", "epoch": 0})
    for key in (content, content.strip()):
        with pytest.raises(accounts.SessionKeyError):
            accounts.account_from_token(store, key, forged)
        with pytest.raises(accounts.SessionKeyError):
            accounts.issue_token(store, key, found)


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
