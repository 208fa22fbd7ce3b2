"""Smoke test of the annotation server: the app's annotation pages run without the ``[ml]`` extra.

    python scripts/app_smoke.py [--block-ml]

Builds a small SYNTHETIC phantom workspace in a temporary folder, signs an admin in (Streamlit's
AppTest, no browser) and opens Home and the annotation pages (wound masks, triplets, review,
accounts, follow-up); each must render without an exception, and afterwards no module of the
``[ml]`` or ``[llm]`` extras may have been imported. Then a page that needs ``[ml]`` (Train) must say
which extra to install instead of failing, and the wound masks page must keep its model controls in
place, disabled, naming that extra (no page-wide message): on an ``[app]``-only install because torch is
absent, with ``--block-ml`` because this script hides the ``[ml]`` modules first (for a full install).
It runs the installed app (the one ``triderm app`` serves). Prints one line per check; exit 1 at the
first failure. CI runs it in a fresh venv holding only the wheel with ``[app]``.
"""
from __future__ import annotations

import argparse
import importlib.abc
import importlib.util
import os
import sys
import tempfile
from pathlib import Path

from triderm import EXTRA_OF, app_path

ANNOTATION_PAGES = ("pages/1_Wound_masks.py", "pages/2_Triplets.py", "pages/7_Review.py", "pages/8_Accounts.py",
                    "pages/9_Follow_up.py")
ML_PAGE = "pages/4_Train.py"
ML_HINT = 'pip install "triderm-studio[ml]"'
HEAVY = sorted(name for name, extra in EXTRA_OF.items() if extra in ("ml", "llm"))


class HideML(importlib.abc.MetaPathFinder):
    """First on ``sys.meta_path``: an ``[ml]`` module is found by nobody but the app's own guard, as on
    an ``[app]``-only server (where the guard then stops the page), else it is missing."""

    def find_spec(self, name: str, path=None, target=None) -> None:
        """Route an ``[ml]`` module to the app's missing-extra guard, as if it were not installed."""
        if path is None and EXTRA_OF.get(name) == "ml":
            from app import extras

            extras.MissingExtra().find_spec(name, path, target)
            raise ModuleNotFoundError(f"No module named {name!r} (hidden by app_smoke.py --block-ml)", name=name)
        return None


def workspace(root: Path) -> None:
    """A 6-photo SYNTHETIC phantom workspace at ``root`` with an admin account."""
    from annotations.accounts import accounts
    from annotations.infra.workspace import Workspace
    from annotations.io.dataset import import_dataset
    from core.phantoms import build

    build(root.parent / "demo", seed=0, photos=6, patients=3, wounds=8, triplets=20)
    ws = Workspace(root)
    import_dataset(ws, root.parent / "demo")
    accounts.add_account(ws.store, "smoke", "admin", "correct horse battery", "app_smoke")


def signed_in_app():
    """The app (the installed app.py) with the admin signed in, after its first run."""
    from streamlit.testing.v1 import AppTest

    from annotations.accounts import accounts
    from annotations.infra.workspace import Workspace

    at = AppTest.from_file(str(app_path()), default_timeout=120)
    ws = Workspace(None)
    found = accounts.get(ws.store, "smoke")
    at.session_state["account"] = found
    at.session_state["_cookie"] = accounts.issue_token(ws.store, accounts.secret_key(ws.root), found)
    return at.run()


def check(at, what: str) -> None:
    """Exit with FAIL when the AppTest ``at`` raised, else print ok for ``what``."""
    if at.exception:
        sys.exit(f"FAIL {what}: {at.exception[0].message}")
    print(f"ok   {what}")


def main(argv: list[str] | None = None) -> int:
    """The smoke test's entry point; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python scripts/app_smoke.py", description=__doc__.splitlines()[0])
    parser.add_argument("--block-ml", action="store_true", help="hide the [ml] modules before the ML page")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["TRIDERM_WORKSPACE"] = str(Path(tmp) / "ws")
        workspace(Path(tmp) / "ws")
        at = signed_in_app()
        check(at, "Home")
        for page in ANNOTATION_PAGES:
            check(at.switch_page(page).run(), page)
        imported = [name for name in HEAVY if name in sys.modules]
        if imported:
            sys.exit(f"FAIL the annotation pages imported modules of the [ml]/[llm] extras: {imported}")
        print(f"ok   no module of the [ml]/[llm] extras imported ({', '.join(HEAVY)})")
        if args.block_ml:
            sys.meta_path.insert(0, HideML())
        elif importlib.util.find_spec("torch") is not None:
            print(f"skip {ML_PAGE}: torch is installed (--block-ml hides it)")
            return 0
        at = at.switch_page(ML_PAGE).run()
        check(at, ML_PAGE)
        said = " ".join(e.value for e in at.error)
        if ML_HINT not in said:
            sys.exit(f"FAIL {ML_PAGE} does not name the [ml] extra: {said!r}")
        print(f"ok   {ML_PAGE} names the extra to install")
        masks = ANNOTATION_PAGES[0]
        at = at.switch_page(masks).run()
        check(at, f"{masks} without the [ml] extra")
        suggest = next((b for b in at.button if b.label == "Suggest outlines"), None)
        if at.error or suggest is None or not suggest.disabled or ML_HINT not in (suggest.help or ""):
            sys.exit(f"FAIL {masks} without [ml]: errors {[e.value for e in at.error]!r}, Suggest outlines "
                     f"{'missing' if suggest is None else f'disabled={suggest.disabled}, help={suggest.help!r}'}")
        print(f"ok   {masks} keeps Suggest outlines in place, disabled, naming the extra")
    return 0


if __name__ == "__main__":
    sys.exit(main())
