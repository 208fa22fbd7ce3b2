"""Explore: UMAP of a run's embeddings, retrieval of similar / dissimilar photos, wound attention maps,
and per-wound top concepts with concept heatmaps from a `concepts` run.

The map's data, its UMAP (computed once per embedding and stored beside it), the retrieval index and
the tables and text drawn here come from :mod:`core.eval.explore`; this page only draws them, one
function per section (:func:`app.explore.main` calls them in order)."""

from __future__ import annotations

import streamlit as st

from app import markup, navigation

ws = navigation.page("Explore", need="view")
# the map above the fold on a 1366×768 laptop: narrow top margin and title (the sidebar stays open)
st.html("<style>[data-testid='stMainBlockContainer'] {padding-top: 3.75rem;} "
        "[data-testid='stMainBlockContainer'] h1 {font-size: 1.6rem; padding: 0;}</style>")

try:
    from app import explore
except ImportError as err:  # the ML part of the product is not installed
    st.info(f"The explorer needs the `core` models, which are not available here yet ({markup.escape_md(str(err))}).", icon="🚧")
    st.stop()
explore.main(ws)
