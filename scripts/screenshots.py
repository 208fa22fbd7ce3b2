"""Regenerate the README's screenshots at 1366×768 from the current app on the SYNTHETIC demo workspace.

    python scripts/screenshots.py [--out docs/screenshots] [--train ARGS] [--keep DIR | --workspace W]
    make screenshots [TRAIN="--mode fine-tune"]

Builds the phantom demo (:mod:`core.phantoms`, seed 0) in a temporary folder, starts ``streamlit run app.py``
on the loopback with the shipped settings on a new empty workspace with one admin account, and in headless
Chromium at 1366×768 signs in and imports the demo folder through Home's import form. With ``--train ARGS`` it
then runs ``python -m core.train_triderm ARGS`` on the workspace: ``--mode fine-tune`` (what ``auto`` picks)
gives the Report its verdict but takes minutes on a CPU; ``--mode frozen`` records the untrained embedding
only. Then it saves Home as it opens after the import (``home.png``), the outline page with its worklist
(``outline_editor.png``), the triplet page (``triplets_1366x768.png``), the Report (``report.png``), Explore
(``explore.png``), the LLM oracle, Train and Review pages (``llm_oracle.png``, ``train.png``, ``review.png``).
Each PNG is the window as a 1366×768 laptop shows it (no scrolling), reduced to 256 colours so that it stays
small; the script prints each file's size. ``--keep DIR`` keeps the workspace there (else it is deleted);
``--workspace W`` shoots an existing workspace (e.g. one ``make demo`` trained) without importing.
"""
from __future__ import annotations

import argparse
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script: the repository's packages
sys.path.insert(0, str(REPO / "tests" / "browser"))  # the browser tests' server and waits

from conftest import CHROMIUM, CHROMIUM_ARGS, AppServer  # noqa: E402
from streamlit_page import idle, image_shown, wait_for_cookie  # noqa: E402

from annotations.accounts import accounts  # noqa: E402
from annotations.infra.workspace import Workspace  # noqa: E402

LAPTOP = {"width": 1366, "height": 768}
ADMIN = "Dr Demo"
#: Streamlit flags beside the shipped .streamlit/config.toml (read from the repository, the server's folder).
FLAGS = ("--server.headless", "true")
COLOURS = 256
TIMEOUT_MS = 300_000  # first renders load models and compile on a loaded machine


def save(pg, out: Path, name: str) -> Path:
    """The window as shown (1366×768), reduced to :data:`COLOURS` colours, as ``out/name.png``."""
    import io

    from PIL import Image

    idle(pg)
    pg.wait_for_timeout(1500)  # charts and the editor's frame draw after the script run ends
    shot = Image.open(io.BytesIO(pg.screenshot())).convert("RGB")
    path = out / f"{name}.png"
    shot.quantize(COLOURS, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(path, optimize=True)
    print(f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}: {path.stat().st_size / 1000:.0f} kB")
    return path


def goto(pg, url: str, page: str) -> None:
    """Open ``page`` (its address: the file name without its number) and wait for its script run."""
    pg.goto(f"{url}/{page}")
    idle(pg)


def shoot(url: str, demo: Path | None, out: Path, password: str, train) -> None:
    """Sign in, import ``demo`` on Home (unless None), call ``train()``, then save the pages' screenshots in
    ``out``."""
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=TIMEOUT_MS)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        pg = browser.new_context(viewport=LAPTOP).new_page()
        pg.set_default_timeout(TIMEOUT_MS)
        pg.goto(url)
        pg.get_by_role("textbox", name="Account name").fill(ADMIN)
        pg.get_by_label("Password", exact=True).fill(password)
        pg.get_by_role("button", name="Sign in").click()
        expect(pg.get_by_text("Signed in as").first).to_be_visible()
        wait_for_cookie(pg, timeout_ms=TIMEOUT_MS)
        idle(pg)
        if demo is not None:
            pg.get_by_label("Dataset folder on the server").fill(str(demo))
            pg.get_by_role("button", name="Import", exact=True).click()
            expect(pg.get_by_text(re.compile(r"^Imported \d+ photos")).first).to_be_visible()
        train()
        goto(pg, url, "")  # Home as it opens after the import (and the training): the workspace's counts
        expect(pg.get_by_text("Photos", exact=True).first).to_be_visible()
        save(pg, out, "home")
        goto(pg, url, "Wound_masks")
        expect(pg.get_by_role("heading", name=re.compile("^Wounds of "))).to_be_visible()
        pg.wait_for_selector(".oe svg image")  # the outline editor's photo
        save(pg, out, "outline_editor")
        goto(pg, url, "Triplets")
        image_shown(pg, '[data-testid="stMain"] [data-testid="stImage"] img', 3)
        save(pg, out, "triplets_1366x768")
        goto(pg, url, "Report")
        expect(pg.get_by_role("heading", name="Verdict")).to_be_visible()
        save(pg, out, "report")
        goto(pg, url, "Explore")
        save(pg, out, "explore")
        for page, name in (("LLM_oracle", "llm_oracle"), ("Train", "train"), ("Review", "review")):
            goto(pg, url, page)
            save(pg, out, name)
        browser.close()


def admin_password(root: Path) -> str:
    """A new random password of the script's admin account :data:`ADMIN` in the workspace at ``root`` (the
    account is created when absent)."""
    ws = Workspace(root)
    password = secrets.token_urlsafe(16)
    if accounts.get(ws.store, ADMIN) is None:
        accounts.add_account(ws.store, ADMIN, "admin", password, "screenshots")
    else:
        accounts.set_password(ws.store, ADMIN, password, "screenshots")
    ws.store.close()
    return password


def main(argv: list[str] | None = None) -> int:
    """Build the demo (or take ``--workspace``), serve it, save the screenshots; 0 when all were saved."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "screenshots", help="where the PNGs go")
    parser.add_argument("--train", metavar="ARGS", default=None,
                        help="run python -m core.train_triderm ARGS after the import (e.g. '--mode fine-tune')")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--keep", type=Path, default=None, help="keep the new workspace in this (new) folder")
    where.add_argument("--workspace", type=Path, default=None,
                       help="an existing workspace instead of a new demo (no import; its account "
                            f"{ADMIN!r} is created, or its password changed)")
    args = parser.parse_args(argv)
    if not CHROMIUM.exists():
        parser.error(f"Chromium not found at {CHROMIUM}")
    if args.keep is not None and args.keep.exists():
        parser.error(f"--keep {args.keep}: the folder exists; name a new one")
    if args.workspace is not None and not (args.workspace / "triderm.sqlite").is_file():
        parser.error(f"--workspace {args.workspace}: no TriDerm workspace there (triderm.sqlite)")
    from core.phantoms import build

    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="triderm-screenshots-") as tmp:
        demo: Path | None = None
        if args.workspace is None:
            demo, root = Path(tmp) / "demo", (args.keep or Path(tmp) / "ws").resolve()
            build(demo, seed=0)
        else:
            root = args.workspace.resolve()
        password = admin_password(root)

        def train() -> None:
            if args.train:
                subprocess.run([sys.executable, "-m", "core.train_triderm", "--workspace", str(root),
                                *shlex.split(args.train)], cwd=REPO, check=True)

        server = AppServer(root, Path(tmp) / "streamlit.log", flags=FLAGS)
        try:
            shoot(server.url, demo, args.out, password, train)
        finally:
            server.stop()
        if args.workspace is None and args.keep is None:
            shutil.rmtree(root)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
