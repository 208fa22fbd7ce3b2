"""The ``[app]``-only rule at run time: a page that imports a module of an extra this server lacks (``torch``
on an ``[app]``-only install) says which extra to install and stops (:class:`MissingExtra`); the probes
:func:`extra_missing` and :func:`missing_extra` let a page keep its controls in place, disabled, saying so."""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from pathlib import Path

import streamlit as st

from triderm import EXTRA_OF, install_hint

PAGES_DIR = Path(__file__).resolve().parents[1] / "pages"
#: the modules that only probe for an extra (their ``find_spec`` must never stop the page)
PROBES = ("app.extras",)


class MissingExtra(importlib.abc.MetaPathFinder):
    """Last on ``sys.meta_path``, so asked only for a module no other finder has: when the app's own code
    (a page, the ``app`` package, ``core``) imports a module of an extra that is not installed (``torch`` on an ``[app]``-only
    server), the page says which extra to install and stops, instead of failing with a traceback.
    Anywhere else (outside a Streamlit run, a library probing an optional module) it finds nothing."""

    def find_spec(self, name: str, path=None, target=None) -> None:
        """Stop the page with an install hint when the app's code imports a module of a missing extra."""
        hint = install_hint(name) if path is None else None
        if hint is None or not _imported_by_the_app():
            return None
        from streamlit.runtime.scriptrunner import get_script_run_ctx

        if get_script_run_ctx() is None:
            return None
        st.error(f"This page needs `{name}`, which this installation does not have (an annotation server "
                 f"installs only the `[app]` extra). To use it, install the extra on the server: `{hint}`.",
                 icon=":material/extension:")
        if "_home_page" in st.session_state:
            st.page_link(st.session_state["_home_page"], label="Home", icon=":material/home:")
        st.stop()



def _imported_by_the_app() -> bool:
    """Whether the import statement being run is in a page, in the app's package (not a probe of this module)
    or in ``core`` (not in a third-party library)."""
    frame = sys._getframe(1)
    while frame is not None and (frame.f_code.co_filename.startswith("<frozen importlib")
                                 or frame.f_code.co_name in ("find_spec", "_imported_by_the_app")):
        frame = frame.f_back
    if frame is None:
        return False
    module = str(frame.f_globals.get("__name__", ""))
    if module.split(".")[0] in ("core", "app"):
        return module not in PROBES
    return Path(frame.f_code.co_filename).resolve().parent == PAGES_DIR


def extra_missing(module: str) -> str | None:
    """The install hint (``pip install "triderm-studio[ml]"``) when ``module`` of an extra is not installed
    here, else None. Probed from this module, not a page, so :class:`MissingExtra` does not stop the page: a
    page keeps its controls in place, disabled, with this hint as their help."""
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a module hidden (scripts/app_smoke.py --block-ml) or half-installed
        found = False
    return None if found else install_hint(module)


#: the extras a job's extra builds on (``triderm-studio[llm]`` installs ``[ml]`` too)
EXTRA_NEEDS = {"ml": ("ml",), "llm": ("ml", "llm")}


def missing_extra(extra: str) -> str | None:
    """``pip install "triderm-studio[EXTRA]"`` when a module of ``extra`` (:data:`triderm.EXTRA_OF`, with the
    extras it builds on) is not installed on this server (an ``[app]``-only one), else None."""
    for module, of in EXTRA_OF.items():
        if of not in EXTRA_NEEDS[extra]:
            continue
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a finder that refuses the module: not installed here either
            found = False
        if not found:
            return f'pip install "triderm-studio[{extra}]"'
    return None


if not any(isinstance(finder, MissingExtra) for finder in sys.meta_path):
    sys.meta_path.append(MissingExtra())
