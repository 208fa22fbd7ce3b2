"""The browser session: its workspace, the signed-in account (session cookie, identity provider), sign-in and
sign-out. The rules themselves live in :mod:`annotations.accounts` and :mod:`annotations.accounts.session`; this
module only wires them to Streamlit."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping

import streamlit as st

from annotations.accounts import accounts, session
from annotations.accounts.accounts import Account, AuthError
from annotations.infra import holders
from annotations.infra.workspace import Workspace
from app.markup import escape_md


def workspace() -> Workspace:
    """The workspace of this browser session (one store connection per session)."""
    root = session.workspace_root(sys.argv[1:])
    ws = st.session_state.get("_ws")
    if ws is None or ws.root != root:
        ws = Workspace(root)
        holders.register(ws.root)  # restore refuses while this app holds the workspace
        st.session_state["_ws"] = ws
    return ws


def oidc_providers() -> list[str | None] | None:
    """Identity providers of the ``[auth]`` secrets section (None: OIDC is not configured; a
    ``None`` entry is the unnamed default provider)."""
    try:
        auth = st.secrets.get("auth")
    except FileNotFoundError:  # no secrets.toml anywhere (StreamlitSecretNotFoundError)
        return None
    if not isinstance(auth, Mapping):
        return None
    named = [k for k, v in auth.items() if isinstance(v, Mapping)]
    return ([None] if "client_id" in auth else []) + named or None


def session_key() -> str:
    """The workspace's session-signing key; an unusable key stops the app with the reason."""
    try:
        return accounts.secret_key(workspace().root)
    except accounts.SessionKeyError as err:
        st.error(f"TriDerm Studio cannot start: {escape_md(str(err))}")
        st.stop()


def account() -> Account | None:
    """The signed-in account, checked against the store on every run (sign-out elsewhere, a
    password or role change, or disabling ends the session on the next click); restored from the
    session cookie or the identity provider after a reload. A forged, expired or revoked session
    signs the visitor out with a message."""
    state = st.session_state
    store = workspace().store
    current = state.get("account")
    if current is not None:
        try:
            fresh = accounts.account_from_token(store, session_key(), state.get("_cookie") or "")
        except AuthError as err:
            _forget(str(err))
            return None
        if fresh != current:
            state["account"] = fresh
        return fresh
    token = browser_cookie()
    if token and token != state.get("_rejected_cookie"):
        try:
            restored = accounts.account_from_token(store, session_key(), token)
        except AuthError as err:
            state["_rejected_cookie"] = token
            _forget(str(err))
            return None
        state["account"] = restored
        state["_cookie"] = token
        return restored
    if oidc_providers() and getattr(st.user, "is_logged_in", False):
        email = str(st.user.get("email") or "")
        found = accounts.by_email(store, email) if email else None
        if found is None:
            state["_auth_notice"] = (f"The identity provider signed you in as {email or 'an unknown user'}, but no "
                                     "TriDerm account has that e-mail. Ask an admin to create one.")
            return None
        sign_in(found)
        return found
    return None


def browser_cookie() -> str | None:
    """The session cookie this browser sent when it connected (None when absent)."""
    token = st.context.cookies.get(accounts.COOKIE_NAME)
    return token if isinstance(token, str) and token else None  # (AppTest's context answers a mock)


def sign_in(found: Account) -> None:
    """Start this browser's session for ``found`` (and set the signed session cookie)."""
    st.session_state["account"] = found
    st.session_state["_cookie"] = accounts.issue_token(workspace().store, session_key(), found)
    st.session_state.pop("_auth_notice", None)
    workspace().store.add_annotator(found.name)


def _forget(notice: str | None = None) -> None:
    for key in ("account", "_cookie", "question", "history", "pending", "_sched", "_sched_settings"):
        st.session_state.pop(key, None)
    st.session_state["_clear_cookie"] = True
    if notice:
        st.session_state["_auth_notice"] = notice


def sign_out() -> None:
    """Sign the account out: revoke its sessions on the server (every browser, and any copy of
    the cookie), forget the account here and delete the cookie."""
    current = st.session_state.get("account")
    if current is not None:
        accounts.revoke_sessions(workspace().store, current.name)
    token = browser_cookie()
    if token:
        st.session_state["_rejected_cookie"] = token  # this connection still carries the old cookie
    _forget()
    if oidc_providers() and getattr(st.user, "is_logged_in", False):
        st.logout()


def sync_cookie() -> None:
    """Write (or delete) the session cookie in the browser to match this session."""
    state = st.session_state
    token = state.get("_cookie")
    if token and token != browser_cookie():
        value = f"{accounts.COOKIE_NAME}={token}; path=/; max-age={accounts.SESSION_MAX_AGE_S}; SameSite=Strict"
    elif state.get("_clear_cookie"):
        value = f"{accounts.COOKIE_NAME}=; path=/; max-age=0; SameSite=Strict"
    else:
        return
    # the token is URL-safe base64 from itsdangerous: no quote or semicolon to escape. A script can set
    # neither HttpOnly nor read the scheme on the server: Secure is added when the page came over HTTPS.
    st.html(f"<script>document.cookie = {json.dumps(value)} + (location.protocol === 'https:' ? '; Secure' : '');"
            "</script>", unsafe_allow_javascript=True)


def annotator() -> str | None:
    """The signed-in account's name (judgments are stored as ``expert:<name>``)."""
    found = account()
    return found.name if found else None


def actor() -> str:
    """The name to record in the revisions table for a change made on this page."""
    found = account()
    if found is None:
        raise RuntimeError("no account is signed in")
    return found.name


def allowed(permission: str | None) -> bool:
    """Whether the signed-in account holds ``permission`` (None: any signed-in account)."""
    found = account()
    return found is not None and (permission is None or found.can(permission))
