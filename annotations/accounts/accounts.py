"""Personal accounts, roles, sign-in throttling and signed session tokens (no Streamlit here).

* Passwords are stored as salted Argon2id hashes (``argon2-cffi``); nothing here does crypto by hand.
* Names are NFKC-normalised and unique case-insensitively in every script (``"Dr A"`` and ``"dr a"``,
  ``"éva"`` and ``"ÉVA"``, full-width ``"Ｅｖａ"`` and ``"eva"`` are one account: :func:`name_key`); the
  stored spelling is the one shown and the one judgments are stored under (``expert:<name>``). A name
  that only looks like an existing one (Greek or Cyrillic look-alike letters: :func:`skeleton`) and a
  name mixing Latin, Greek and Cyrillic letters are refused.
* Passwords are NFKC-normalised (a composed and a decomposed ``é`` are one password; ASCII is
  unchanged, so every earlier hash still verifies) and need :data:`MIN_PASSWORD` characters, at least
  :data:`MIN_PASSWORD_VISIBLE` of them not spaces.
* After :data:`MAX_FAILED` wrong passwords in a row an account is locked for :data:`LOCK_MINUTES`
  minutes; the count and the lock are stored, so a reload or another browser does not reset them.
  Each attempt is counted (one ``BEGIN IMMEDIATE`` update) *before* its password is checked, so at
  most :data:`MAX_FAILED` passwords are checked per lock window however many arrive at once.
  Every refusal (unknown name, wrong password, locked, disabled) gets one message and one hash
  check's work, so neither the answer nor its timing tells which names exist.
* A session survives a reload through a cookie holding an ``itsdangerous`` signed, timestamped
  token; it names the account and its ``session_epoch``. Sign-out, a password or role change and
  disabling bump the epoch, which revokes every session of that account on the server.
* The signing key (``<workspace>/.session_key``, mode 0600) is written whole or not at all; an
  empty or short key is refused (:class:`SessionKeyError`), never used.
* Free-text annotator names of earlier versions are mapped to accounts by an admin: their
  judgments move to the account's source, each move recorded in the revisions table.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import secrets
import tempfile
import unicodedata
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from itsdangerous import BadSignature, SignatureExpired, URLSafeTimedSerializer

from annotations.store.store import Store

ROLES = ("admin", "researcher", "annotator", "viewer")
#: What each role may do: ``manage`` (import, export, demo, accounts, review), ``jobs`` (LLM and
#: training jobs), ``annotate`` (photo upload, outlines, descriptions, triplets), ``view`` (Explore, Report).
PERMISSIONS: dict[str, frozenset[str]] = {
    "admin": frozenset({"manage", "jobs", "annotate", "view"}),
    "researcher": frozenset({"jobs", "view"}),
    "annotator": frozenset({"annotate"}),
    "viewer": frozenset({"view"}),
}
MAX_FAILED = 5
LOCK_MINUTES = 15
SESSION_MAX_AGE_S = 12 * 3600
COOKIE_NAME = "triderm_session"
MIN_PASSWORD = 10
#: Of those, the fewest that are not white space (ten spaces are no password).
MIN_PASSWORD_VISIBLE = 8
NAME_RE = re.compile(r"[\w][\w .'-]{0,47}")
#: Shortest signing key accepted (``secrets.token_urlsafe(48)`` makes 64 characters).
MIN_KEY_CHARS = 32
KEY_FILE = ".session_key"
#: The one answer to every refused sign-in.
REFUSED = (f"Unknown account or wrong password. After {MAX_FAILED} failed sign-ins in a row an account is "
           f"locked for {LOCK_MINUTES} min (an admin can unlock it).")
_HASHER = PasswordHasher()


@functools.cache
def _dummy_hash() -> str:
    """A hash verified in place of an unknown account's, so every refusal costs one check (made on first use:
    an Argon2 hash at import slowed every command's start)."""
    return _HASHER.hash("not a password of any account")


class AuthError(Exception):
    """A sign-in or account change that was refused; the message is shown as is."""


class SessionKeyError(RuntimeError):
    """The workspace's session-signing key is unusable; the message says why and what to do."""


@dataclass(frozen=True)
class Account:
    """A signed-in person: account name, role and e-mail address."""

    name: str
    role: str
    email: str | None = None

    def can(self, permission: str) -> bool:
        """Whether the account's role grants ``permission`` (see ``PERMISSIONS``)."""
        return permission in PERMISSIONS[self.role]


#: Greek and Cyrillic letters that look like Latin ones (lower case: :func:`skeleton` case-folds
#: first), after Unicode's confusables list (UTS #39); full-width and other compatibility forms are
#: folded by NFKC before.
CONFUSABLES = str.maketrans({
    "а": "a", "в": "b", "ԁ": "d", "е": "e", "һ": "h", "і": "i", "ј": "j", "к": "k", "ӏ": "l",
    "м": "m", "н": "h", "о": "o", "р": "p", "с": "c", "ԛ": "q", "г": "r", "ѕ": "s", "т": "t", "ц": "u", "у": "y", "ԝ": "w",
    "х": "x", "ү": "y", "ь": "b",
    "α": "a", "β": "b", "ε": "e", "ζ": "z", "η": "n", "ι": "i", "κ": "k", "μ": "u", "ν": "v", "ο": "o", "ρ": "p",
    "σ": "o", "τ": "t", "υ": "u", "χ": "x", "ω": "w", "γ": "y",
})
#: Scripts a name may not mix (their letters are the look-alikes).
_MIXABLE = ("LATIN", "GREEK", "CYRILLIC")


def name_key(name: str) -> str:
    """What makes two account names the same: NFKC, white space collapsed, case-folded (every script)."""
    return unicodedata.normalize("NFKC", " ".join(unicodedata.normalize("NFKC", name or "").split())).casefold()


def skeleton(name: str) -> str:
    """What a name looks like: :func:`name_key` with Greek and Cyrillic look-alikes as Latin letters."""
    return unicodedata.normalize("NFC", unicodedata.normalize("NFD", name_key(name)).translate(CONFUSABLES))


def _scripts(name: str) -> set[str]:
    return {unicodedata.name(c, "").split(" ")[0] for c in name if c.isalpha()} & set(_MIXABLE)


def clean_name(name: str) -> str:
    """A trimmed, NFKC-normalised account name: letters, digits, space, ``.'-_``, at most 48 characters,
    of one script among Latin, Greek and Cyrillic."""
    name = " ".join(unicodedata.normalize("NFKC", name or "").split())
    if not name:
        raise AuthError("Enter an account name.")
    if not NAME_RE.fullmatch(name):
        raise AuthError("Names may use letters, digits, spaces and . ' - _ (at most 48 characters).")
    scripts = _scripts(name)
    if len(scripts) > 1:
        raise AuthError(f"The name {name!r} mixes {' and '.join(s.title() for s in sorted(scripts))} letters; "
                        "use one alphabet.")
    return name


def normal_password(password: str) -> str:
    """The password as it is hashed: NFKC (ASCII unchanged)."""
    return unicodedata.normalize("NFKC", password or "")


def check_password_strength(password: str) -> None:
    """Raise AuthError when ``password`` (NFKC) has fewer than ``MIN_PASSWORD`` characters or fewer than
    ``MIN_PASSWORD_VISIBLE`` that are not white space."""
    password = normal_password(password)
    if len(password) < MIN_PASSWORD or sum(not c.isspace() for c in password) < MIN_PASSWORD_VISIBLE:
        raise AuthError(f"A password needs at least {MIN_PASSWORD} characters, {MIN_PASSWORD_VISIBLE} of them "
                        "not spaces.")


def _row(store: Store, name: str) -> dict | None:
    """The account row whose name is ``name`` by :func:`name_key` (any case, any Unicode form)."""
    key = name_key(name)
    rows = [r for r in store.account_rows() if name_key(r["name"]) == key]
    return rows[0] if rows else None


def _look_alike(store: Store, name: str) -> str | None:
    """An existing account name that ``name`` looks like (the same :func:`skeleton`), or None."""
    shape = skeleton(name)
    return next((n for n in store.account_names() if skeleton(n) == shape), None)


def _account(row: dict) -> Account:
    return Account(row["name"], row["role"], row["email"])


def _stored_name(store: Store, name: str) -> str:
    """The stored spelling of an account name that a command has just found (any case)."""
    account = get(store, name)
    assert account is not None, name  # the command would have raised AuthError
    return account.name


def get(store: Store, name: str) -> Account | None:
    """The account named ``name`` (any case), or None."""
    row = _row(store, name)
    return _account(row) if row else None


def active(store: Store, name: str) -> Account | None:
    """The account named ``name`` unless it is missing or disabled."""
    row = _row(store, name)
    return _account(row) if row and not row["disabled"] else None


def by_email(store: Store, email: str) -> Account | None:
    """The enabled account with this e-mail address (case-insensitive), or None."""
    row = store.account_by_email(email.strip())
    return _account(row) if row else None


def list_accounts(store: Store) -> list[dict[str, Any]]:
    """Every account without its hash: name, role, email, failed, locked_until, disabled, created."""
    return store.account_list()


def add_account(store: Store, name: str, role: str, password: str | None, actor: str,
                email: str | None = None) -> Account:
    """Create an account; ``password`` None makes an identity-provider-only (OIDC) account."""
    name = clean_name(name)
    if role not in ROLES:
        raise AuthError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    if password is None and not email:
        raise AuthError("An account without a password needs the e-mail its identity provider reports.")
    if password is not None:
        check_password_strength(password)
    with store.transaction():
        if _row(store, name) is not None:
            raise AuthError(f"An account named {name!r} already exists (names ignore case).")
        similar = _look_alike(store, name)
        if similar is not None:
            raise AuthError(f"The name {name!r} looks like the account {similar!r} (letters of another alphabet "
                            "that look the same); choose another name.")
        if email and by_email(store, email) is not None:
            raise AuthError(f"Another account already uses the e-mail {email!r}.")
        store.insert_account(name, _HASHER.hash(normal_password(password)) if password is not None else None, role,
                             email or None)
        store.record_revision("accounts", name, "role", "insert", None, role, actor)
    store.add_annotator(name)
    return Account(name, role, email or None)


def set_role(store: Store, name: str, role: str, actor: str) -> None:
    """Give account ``name`` another role (recorded); the only admin cannot lose the admin role."""
    if role not in ROLES:
        raise AuthError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    with store.transaction():
        row = _existing(store, name)
        if row["role"] == "admin" and role != "admin" and _admins(store) == 1:
            raise AuthError("This is the only admin account; make another admin first.")
        store.set_account_role(row["name"], role)
        store.record_revision("accounts", row["name"], "role", "update", row["role"], role, actor)


def set_password(store: Store, name: str, password: str, actor: str) -> None:
    """Set a new password (after the strength check), clear failed sign-ins and end the account's sessions."""
    check_password_strength(password)
    with store.transaction():
        row = _existing(store, name)
        store.set_account_password(row["name"], _HASHER.hash(normal_password(password)))
        store.record_revision("accounts", row["name"], "password", "update", None, None, actor)


def unlock(store: Store, name: str, actor: str) -> None:
    """Clear the account's failed sign-ins and lock-out (recorded)."""
    with store.transaction():
        row = _existing(store, name)
        store.unlock_account(row["name"])
        store.record_revision("accounts", row["name"], "locked_until", "update", row["locked_until"], None, actor)


def revoke_sessions(store: Store, name: str) -> None:
    """Sign ``name`` out on the server: every session token issued so far stops being valid."""
    row = _row(store, name)
    if row is not None:
        store.end_account_sessions(row["name"])


def set_disabled(store: Store, name: str, disabled: bool, actor: str) -> None:
    """Disable or re-enable an account (ending its sessions); the only admin cannot be disabled."""
    with store.transaction():
        row = _existing(store, name)
        if disabled and row["role"] == "admin" and _admins(store) == 1:
            raise AuthError("This is the only admin account; it cannot be disabled.")
        store.set_account_disabled(row["name"], disabled)
        store.record_revision("accounts", row["name"], "disabled", "update", bool(row["disabled"]), disabled, actor)


def _existing(store: Store, name: str) -> dict:
    row = _row(store, name)
    if row is None:
        raise AuthError(f"No account named {name!r}.")
    return row


def _admins(store: Store) -> int:
    return store.enabled_admins()


def has_accounts(store: Store) -> bool:
    """Whether the store holds at least one account."""
    return store.has_accounts()


# -- sign-in --------------------------------------------------------------------------------------
def _parse(ts: str | None) -> datetime | None:
    return datetime.fromisoformat(ts) if ts else None


def authenticate(store: Store, name: str, password: str, at: datetime | None = None) -> Account:
    """The account when ``password`` is right; else :class:`AuthError` with :data:`REFUSED`.

    The attempt is counted in one ``BEGIN IMMEDIATE`` transaction before the password is checked:
    the :data:`MAX_FAILED`-th attempt in a row sets the lock, and a locked account's password is
    not checked at all (a dummy hash is, so the time taken is the same). A right password clears
    the count and the lock; an expired lock starts a new count.
    """
    at = at or datetime.now(timezone.utc)
    with store.transaction():
        row = _row(store, name or "")
        if row is not None and (row["password_hash"] is None or row["disabled"]):
            row = None  # unusable: checked against the dummy hash
        locked = _parse(row["locked_until"]) if row is not None else None
        if row is not None and (locked is None or locked <= at):
            failed = (0 if locked is not None else int(row["failed"])) + 1
            until = ((at + timedelta(minutes=LOCK_MINUTES)).isoformat(timespec="seconds")
                     if failed >= MAX_FAILED else None)
            store.set_sign_in_failures(row["name"], failed, until)
        else:
            row = None
    normal = normal_password(password)
    matched = _verify(row["password_hash"] if row else _dummy_hash(), normal, password or "")
    if matched is None or row is None:  # row None: the dummy hash's password
        raise AuthError(REFUSED)
    rehash = (_HASHER.hash(normal) if matched != normal or _HASHER.check_needs_rehash(row["password_hash"])
              else row["password_hash"])
    store.signed_in(row["name"], row["password_hash"], rehash)
    return _account(row)


def _verify(password_hash: str, normal: str, raw: str) -> str | None:
    """Which of ``normal`` (the NFKC password) and ``raw`` as typed (a hash made before passwords were
    normalised) matches ``password_hash``, or None."""
    for candidate in dict.fromkeys([normal, raw]):
        try:
            if _HASHER.verify(password_hash, candidate):
                return candidate
        except (VerificationError, InvalidHashError):
            continue
    return None


# -- session tokens -------------------------------------------------------------------------------
def secret_key(root: str | Path) -> str:
    """The workspace's cookie-signing key (``<root>/.session_key``, mode 0600, made on first use).

    The key is written to a private temporary file, fsynced, then linked to its name (which fails
    when the name exists), so a reader never sees a partial key and two first uses agree on one.
    Raises :class:`SessionKeyError` when the file holds an empty or short key."""
    path = Path(root) / KEY_FILE
    try:
        return _read_key(path)
    except FileNotFoundError:
        pass
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f"{KEY_FILE}.")  # mode 0600
    try:
        with os.fdopen(fd, "w", encoding="ascii") as fh:
            fh.write(secrets.token_urlsafe(48))
            fh.flush()
            os.fsync(fh.fileno())
        with contextlib.suppress(FileExistsError):  # another process made it first: use its key
            os.link(tmp, path)
    finally:
        os.unlink(tmp)
    return _read_key(path)  # (a crash before the link leaves no name; a new key is made next time)


def _read_key(path: Path) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        raise
    except OSError as err:  # a link in its place, no permission
        raise SessionKeyError(f"{path}: the session-signing key cannot be read ({err.strerror}); it must be a "
                              "regular file of the account running the app (delete it to make a new one)") from None
    with os.fdopen(fd, "rb") as fh:
        if os.fstat(fh.fileno()).st_mode & 0o077:
            os.fchmod(fh.fileno(), 0o600)
        key = fh.read(4096).decode("ascii", errors="replace").strip()
    if len(key) < MIN_KEY_CHARS:
        raise SessionKeyError(
            f"{path}: the session-signing key is {'empty' if not key else f'{len(key)} characters'} "
            f"(at least {MIN_KEY_CHARS} needed), probably left by a crash or a full disk while it was made. "
            "TriDerm Studio will not sign sessions with it. Delete the file and start the app again "
            "(a new key is made; everyone signs in again).")
    return key


def _serializer(key: str) -> URLSafeTimedSerializer:
    if len(key or "") < MIN_KEY_CHARS:
        raise SessionKeyError(f"a session-signing key needs at least {MIN_KEY_CHARS} characters, got {len(key or '')}")
    return URLSafeTimedSerializer(key, salt="triderm-session")


def issue_token(store: Store, key: str, account: Account) -> str:
    """A signed, timestamped session token for ``account``."""
    row = _existing(store, account.name)
    return _serializer(key).dumps({"name": row["name"], "epoch": int(row["session_epoch"])})


def account_from_token(store: Store, key: str, token: str, max_age_s: int = SESSION_MAX_AGE_S) -> Account:
    """The account a session token names; :class:`AuthError` (with the reason) when it is forged,
    expired, signed with an unusable key, or names an account that is gone, disabled or whose
    sessions were revoked (:func:`revoke_sessions`)."""
    try:
        data = _serializer(key).loads(token, max_age=max_age_s)
    except SignatureExpired:
        raise AuthError("Your sign-in has expired. Please sign in again.") from None
    except BadSignature:
        raise AuthError("Your sign-in could not be verified (invalid session cookie). Please sign in again.") from None
    row = _row(store, str(data.get("name", ""))) if isinstance(data, dict) else None
    if row is None or row["disabled"] or int(row["session_epoch"]) != data.get("epoch"):
        raise AuthError("Your sign-in is no longer valid (signed out, account changed or disabled). "
                        "Please sign in again.")
    return _account(row)


# -- free-text annotator names of earlier versions --------------------------------------------------
def legacy_names(store: Store) -> list[str]:
    """Annotator names with judgments that belong to no account."""
    names = {source.split(":", 1)[1] for source in store.expert_sources()}
    accounts = set(store.account_names(ordered=False))
    return sorted(names - accounts, key=str.lower)


def map_name(store: Store, legacy: str, account: str, actor: str) -> int:
    """Move every judgment of the free-text annotator ``legacy`` to ``account``; returns how many.

    Each moved row is recorded in the revisions table (old and new source). A judgment the account
    already gave (the same triplet and showing) is kept as a further repeat of it.
    """
    target = _existing(store, account)["name"]
    old_source, new_source = f"expert:{legacy}", f"expert:{target}"
    if old_source == new_source:
        return 0
    moved = 0
    with store.transaction():
        for row in store.triplets(old_source):
            rep = int(row["rep"])
            while store.triplet_taken(new_source, row["anchor"], row["ref_j"], row["ref_k"], rep):
                rep += 1
            store.move_triplet(row["id"], new_source, rep)
            store.record_revision("triplets", row["id"], "source", "update",
                                  {"source": old_source, "rep": row["rep"]}, {"source": new_source, "rep": rep}, actor)
            moved += 1
        store.rename_excluded_annotator(legacy, target)
    return moved


# -- exclusion from evaluation ------------------------------------------------------------------------
def exclude(store: Store, kind: str, target: str | int, reason: str, actor: str) -> None:
    """Leave an annotator (``kind="annotator"``, by name) or one judgment (``kind="triplet"``, by id)
    out of every metric; the data stays in the store, marked."""
    if kind not in ("annotator", "triplet"):
        raise AuthError(f"kind must be 'annotator' or 'triplet', got {kind!r}")
    with store.transaction():
        if store.insert_exclusion(kind, str(target), reason.strip(), actor):
            store.record_revision("exclusions", [kind, str(target)], "excluded", "insert", False,
                                  reason.strip() or True, actor)


def include(store: Store, kind: str, target: str | int, actor: str) -> None:
    """Undo :func:`exclude`."""
    with store.transaction():
        if store.delete_exclusion(kind, str(target)):
            store.record_revision("exclusions", [kind, str(target)], "excluded", "delete", True, False, actor)


def exclusions(store: Store) -> list[dict[str, Any]]:
    """Every exclusion from evaluation (annotators and single judgments), by kind and target."""
    return store.exclusions()


# -- command line (``python -m annotations users …``) ------------------------------------------------
def add_cli(parser: Any) -> None:
    """The ``users`` sub-commands on an argparse (sub)parser."""
    sub = parser.add_subparsers(dest="users_command", required=True)
    add = sub.add_parser("add", help="create an account (password from a prompt or --password-stdin)")
    add.add_argument("name")
    add.add_argument("--role", required=True, choices=ROLES)
    add.add_argument("--email", default=None, help="the e-mail an identity provider (st.login) reports")
    how = add.add_mutually_exclusive_group()
    how.add_argument("--password-stdin", action="store_true", help="read the password from the first line of stdin")
    how.add_argument("--no-password", action="store_true", help="identity-provider sign-in only (needs --email)")
    pw = sub.add_parser("password", help="set a new password (signs the account out everywhere)")
    pw.add_argument("name")
    pw.add_argument("--password-stdin", action="store_true")
    role = sub.add_parser("role", help="change an account's role")
    role.add_argument("name")
    role.add_argument("role", choices=ROLES)
    unl = sub.add_parser("unlock", help="clear an account's failed sign-ins and lock-out")
    unl.add_argument("name")
    lst = sub.add_parser("list", help="list accounts")
    for p in (add, pw, role, unl, lst):
        p.add_argument("--workspace", default=None,
                       help="workspace folder (default: $TRIDERM_WORKSPACE or ./workspace)")


def _read_password(from_stdin: bool) -> str:
    import getpass
    import sys

    if from_stdin:
        return sys.stdin.readline().rstrip("\r\n")
    first = getpass.getpass("Password: ")
    if getpass.getpass("Repeat password: ") != first:
        raise AuthError("The two passwords differ; nothing changed.")
    return first


def run_cli(store: Store, args: Any) -> int:
    """Run one ``users`` sub-command; prints the result, returns the exit status."""
    import sys

    actor = "cli"
    try:
        if args.users_command == "add":
            password = None if args.no_password else _read_password(args.password_stdin)
            account = add_account(store, args.name, args.role, password, actor, email=args.email)
            print(f"created {account.role} account {account.name}")
        elif args.users_command == "password":
            set_password(store, args.name, _read_password(args.password_stdin), actor)
            print(f"password of {_stored_name(store, args.name)} changed")
        elif args.users_command == "role":
            set_role(store, args.name, args.role, actor)
            print(f"{_stored_name(store, args.name)} is now {args.role}")
        elif args.users_command == "unlock":
            unlock(store, args.name, actor)
            print(f"{_stored_name(store, args.name)} unlocked")
        else:
            for row in list_accounts(store):
                state = "disabled" if row["disabled"] else ("locked" if row["locked_until"] else "active")
                print(f"{row['name']}\t{row['role']}\t{row['email'] or ''}\t{state}")
    except AuthError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0
