"""Accounts (admins): create accounts, change roles, unlock, disable, reset passwords, and map the
free-text annotator names of earlier versions to accounts; set the Ollama hosts LLM runs may call."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from annotations.accounts import accounts
from annotations.accounts.accounts import ROLES, AuthError
from app import auth, markup, navigation
from core.text.llm import DEFAULT_OLLAMA_HOSTS, allowed_ollama_host

ws = navigation.page("Accounts", need="manage")
actor = auth.actor()
store = ws.store


def attempt(action, success: str) -> None:
    """Run one account change; show its refusal, or rerun with a success note."""
    try:
        action()
    except (AuthError, ValueError) as err:  # a refused change, or a malformed host
        st.error(markup.escape_md(str(err)))
    else:
        st.session_state["_accounts_done"] = success
        st.rerun()


def unchanged(who: str, field: str, loaded: object, yours: object, change) -> None:
    """Run ``change`` provided the account's ``field`` still holds the ``loaded`` value (one transaction); a
    :class:`~annotations.store.revisions.StaleEdit` (a ValueError, shown by :func:`attempt`) otherwise."""
    with store.expecting("accounts", who, {field: loaded}, {field: yours}):
        change()


def accounts_table(rows: list[dict]) -> None:
    """Every account with its role, state and sign-in record."""
    st.dataframe(pd.DataFrame([{"account": r["name"], "role": r["role"], "e-mail (identity provider)": r["email"] or "",
                                "state": "disabled" if r["disabled"] else ("locked" if r["locked_until"] else "active"),
                                "failed sign-ins": r["failed"], "locked until": r["locked_until"] or "",
                                "created": r["created"][:16].replace("T", " ")} for r in rows]),
                 hide_index=True, width="stretch")


def new_account_tab() -> None:
    """A form creating one account (password, identity-provider e-mail, or both)."""
    with st.form("new_account", clear_on_submit=True):
        c1, c2, c3 = st.columns(3)
        name = c1.text_input("Account name")
        role = c2.selectbox("Role", ROLES, index=ROLES.index("annotator"))
        email = c3.text_input("E-mail (for identity-provider sign-in; optional)")
        password = st.text_input(f"Initial password (at least {accounts.MIN_PASSWORD} characters; empty = identity "
                                 "provider only)", type="password")
        if st.form_submit_button("Create account", type="primary"):
            attempt(lambda: accounts.add_account(store, name, role, password or None, actor, email=email or None),
                    f"Account {name.strip()} created.")


def edit_account_tab(rows: list[dict]) -> None:
    """Role, unlock, disable/enable and password of one account."""
    who = st.selectbox("Account", [r["name"] for r in rows], key="acct_who")
    if not who:
        return
    row = next(r for r in rows if r["name"] == who)
    shown = st.session_state.get("acct_shown")  # the account as the previous run showed it: what a click changes
    loaded = shown if shown and shown["name"] == who else {"name": who, "role": row["role"],
                                                           "disabled": bool(row["disabled"])}
    st.session_state["acct_shown"] = {"name": who, "role": row["role"], "disabled": bool(row["disabled"])}
    c1, c2, c3 = st.columns(3, vertical_alignment="bottom")
    role = c1.selectbox("Role", ROLES, index=ROLES.index(loaded["role"]), key="acct_role")
    if c1.button("Change role", disabled=role == loaded["role"]):
        attempt(lambda: unchanged(who, "role", loaded["role"], role, lambda: accounts.set_role(store, who, role, actor)),
                f"{who} is now {role}.")
    if c2.button("Unlock", disabled=not (row["locked_until"] or row["failed"])):
        attempt(lambda: accounts.unlock(store, who, actor), f"{who} unlocked.")
    if c3.button("Enable" if loaded["disabled"] else "Disable"):
        attempt(lambda: unchanged(who, "disabled", loaded["disabled"], not loaded["disabled"],
                                  lambda: accounts.set_disabled(store, who, not loaded["disabled"], actor)),
                f"{who} {'enabled' if loaded['disabled'] else 'disabled'}.")
    with st.form("reset_password", clear_on_submit=True):
        new = st.text_input("New password (signs the account out in every browser)", type="password")
        if st.form_submit_button("Set password"):
            attempt(lambda: accounts.set_password(store, who, new, actor), f"Password of {who} changed.")


def legacy_names_tab(rows: list[dict]) -> None:
    """Move the judgments stored under an earlier free-text annotator name to an account."""
    legacy = accounts.legacy_names(store)
    if not legacy:
        st.caption("Every annotator name with judgments belongs to an account.")
        return
    st.caption("Judgments stored under a free-text name move to the account you pick; each move is recorded "
               "in the audit trail (old and new source), nothing is deleted.")
    c1, c2, c3 = st.columns([2, 2, 1], vertical_alignment="bottom")
    old = c1.selectbox("Earlier name", legacy, key="legacy_name")
    target = c2.selectbox("Account", [r["name"] for r in rows], key="legacy_account")
    if c3.button("Move judgments", type="primary"):
        attempt(lambda: accounts.map_name(store, old, target, actor), f"Judgments of {old!r} now belong to {target}.")


def hosts_tab() -> None:
    """The allow-list of Ollama servers LLM runs may call."""
    with st.form("ollama_hosts"):
        st.caption("The only Ollama servers LLM runs may call (one per line: host, host:port or http(s)://host:port). "
                   "Researchers pick from this list; nobody types an address per run.")
        stored = store.get_meta("ollama_hosts")
        if "ollama_hosts_text" not in st.session_state:  # the field is (re)created: it shows the stored list
            st.session_state["ollama_hosts_shown"] = stored
        current = stored if stored is not None else list(DEFAULT_OLLAMA_HOSTS)
        text = st.text_area("Allowed hosts", "\n".join(current), key="ollama_hosts_text")
        if st.form_submit_button("Save hosts"):
            hosts = [h.strip() for h in text.splitlines() if h.strip()]

            def save() -> None:
                """Check every host and store the allow-list (nothing stored when one is malformed)."""
                for h in hosts:
                    allowed_ollama_host(h, [h])  # one clear error for a malformed entry; nothing saved
                # only over the list this form showed: another admin's list saved meanwhile is refused, not lost
                with store.expecting("meta", "ollama_hosts", {"value": st.session_state.get("ollama_hosts_shown")},
                                     {"value": hosts}):
                    store.set_meta("ollama_hosts", hosts)
                st.session_state["ollama_hosts_shown"] = hosts

            attempt(save, f"{len(hosts)} Ollama host(s) allowed.")


def main() -> None:
    """The accounts table above four tabs of changes, each recorded in the audit trail."""
    done = st.session_state.pop("_accounts_done", None)
    if done:
        st.success(markup.escape_md(done))
    rows = accounts.list_accounts(store)
    accounts_table(rows)
    tabs = st.tabs(["New account", "Change an account", "Earlier annotator names", "Ollama hosts"])
    with tabs[0]:
        new_account_tab()
    with tabs[1]:
        edit_account_tab(rows)
    with tabs[2]:
        legacy_names_tab(rows)
    with tabs[3]:
        hosts_tab()


main()
