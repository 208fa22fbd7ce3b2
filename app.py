"""TriDerm Studio — ``streamlit run app.py [-- --workspace PATH]``.

Home page (sign-in, workspace overview, import / demo for admins) and the router for the pages in
``pages/``. Until a visitor signs in with a personal account (or the identity provider configured
in the ``[auth]`` secrets), every address shows the sign-in page and no page script runs; after
sign-in the visitor lands on the page whose address they opened. The first admin account is created
on the command line: ``python -m annotations users add --role admin NAME``.
"""

from __future__ import annotations

import streamlit as st

from app import auth, home, navigation


def main() -> None:
    """The app's entry point: the sign-in gate, or the navigation over the pages the account may open."""
    st.set_page_config(page_title="TriDerm Studio", page_icon="🩹", layout="wide")
    auth.session_key()  # an unusable signing key stops the app here, with the reason
    signed_in = auth.account() is not None  # a store query: asked once per run
    if not signed_in:  # every page's address shows the sign-in (no page runs); signing in reruns that
        # address, which then holds the page itself: a deep link lands on the page asked for after sign-in
        asked = [st.Page(home.gate, title="Sign in", icon=":material/lock:", url_path=st.Page(p).url_path,
                         visibility="hidden") for p, *_ in navigation.PAGES]
        nav = st.navigation([st.Page(home.gate, title="Sign in", icon=":material/lock:", default=True)] + asked,
                            position="hidden")
    else:  # every page is routable; each one tells a role without access why it is closed
        st.session_state["_home_page"] = st.Page(home.home, title="Home", icon=":material/home:", default=True)
        nav = st.navigation([st.session_state["_home_page"]]
                            + [st.Page(p, title=t, icon=i) for p, t, i, _ in navigation.PAGES], position="hidden")
    nav.run()
    if signed_in:
        navigation.preload()
    navigation.freeze_imports()


main()
