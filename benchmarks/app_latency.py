"""Benchmark: what a person waits for in the app, measured in Chromium (Playwright) against a live
``streamlit run app.py`` on the synthetic demo.

* Explore's first load (click to the map drawn): a fresh server whose embedding run has no UMAP yet
  (the page shows an instant classical-MDS map while the UMAP is computed once in the background),
  a new browser session once that UMAP is stored, and a restarted server with the UMAP stored.
  Target (issue 18): ≤ 3 s on the demo.
* Next triplet by keyboard: key press (→ answer) to the progress line counting it, median and
  90th percentile over ``--presses`` answers. Target: ≤ 150 ms median.

The embedding run is **TEST-ONLY random vectors** (the page's cost does not depend on what the
vectors mean); the photos are the SYNTHETIC phantom demo.

    python -m benchmarks.app_latency [--presses 40] [--photos 53] [--keep DIR]
"""
from __future__ import annotations

import argparse
import re
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from annotations import accounts
from annotations.dataset import import_dataset
from annotations.workspace import Workspace
from benchmarks.results import render_tables
from tests.browser.conftest import CHROMIUM, CHROMIUM_ARGS, AppServer

PASSWORD = "benchmark-password"
TARGET_EXPLORE_S = 3.0
TARGET_NEXT_MS = 150.0


def demo_workspace(root: Path, photos: int) -> Workspace:
    """The phantom demo imported, one TEST-ONLY random embedding run, an admin account."""
    from core.phantoms import build
    from core.runtime import save_embeddings

    build(root / "demo", seed=0, photos=photos, patients=max(1, round(photos * 21 / 53)),
          wounds=max(photos, round(photos * 120 / 53)),
          triplets=min(round(photos * 513 / 53), photos * (photos - 1) * (photos - 2) // 2))
    ws = Workspace(root / "ws")
    import_dataset(ws, root / "demo")
    ids = [im["image_id"] for im in ws.store.images()]
    run_id = ws.store.start_run("vision-baseline", {"modality": "vision", "test_only": True},
                                name="TEST-ONLY random embedding")
    save_embeddings(ws, run_id, ids, image_emb=np.random.default_rng(0).normal(size=(len(ids), 8)))
    ws.store.finish_run(run_id)
    accounts.add_account(ws.store, "Bench", "admin", PASSWORD, "benchmark")
    return ws


def sign_in(pg, url: str) -> None:
    pg.goto(url)
    pg.get_by_role("textbox", name="Account name").fill("Bench")
    pg.get_by_label("Password", exact=True).fill(PASSWORD)
    pg.get_by_role("button", name="Sign in").click()
    pg.get_by_text("Signed in as").first.wait_for()
    pg.wait_for_selector('[data-test-script-state="notRunning"]', state="attached")


def explore_load(browser, url: str) -> tuple[float, str]:
    """Seconds from opening Explore (signed in) to the map drawn, and the map's title."""
    context = browser.new_context(viewport={"width": 1366, "height": 900})
    pg = context.new_page()
    pg.set_default_timeout(300_000)
    sign_in(pg, url)
    t0 = time.perf_counter()
    pg.get_by_role("link", name="Explore").click()
    title = pg.locator(".js-plotly-plot .gtitle").first
    title.wait_for()
    seconds = time.perf_counter() - t0
    text = title.text_content()
    context.close()
    return seconds, text


def next_triplet_ms(browser, url: str, presses: int) -> list[float]:
    """Milliseconds from each → key press to the progress line counting the answer."""
    context = browser.new_context(viewport={"width": 1366, "height": 768})
    pg = context.new_page()
    pg.set_default_timeout(120_000)
    sign_in(pg, url)
    pg.goto(f"{url}/Triplets")
    progress = pg.get_by_text(re.compile(r"^Bench: \d+ of"))
    progress.wait_for()
    pg.wait_for_selector('[data-test-script-state="notRunning"]', state="attached")
    out = []
    for _ in range(presses):
        done = int(re.match(r"Bench: (\d+)", progress.inner_text()).group(1))
        t0 = time.perf_counter()
        pg.keyboard.press("ArrowRight")
        pg.get_by_text(re.compile(rf"^Bench: {done + 1} of")).wait_for()
        out.append(1000 * (time.perf_counter() - t0))
        pg.wait_for_selector('[data-test-script-state="notRunning"]', state="attached")
    context.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.app_latency", description=__doc__.split("\n\n")[0])
    parser.add_argument("--presses", type=int, default=40, help="triplets answered by keyboard")
    parser.add_argument("--photos", type=int, default=53, help="photos in the phantom demo")
    parser.add_argument("--keep", default=None, help="build the workspace here and keep it (default: a temp dir)")
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.keep or tmp)
        ws = demo_workspace(root, args.photos)
        umaps = lambda: list(ws.runs_dir.rglob("umap_*.npy"))
        rows = []
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            server = AppServer(ws.root, root / "streamlit.log")
            try:
                s, title = explore_load(browser, server.url)
                rows.append(["Explore, fresh server, no UMAP stored yet", round(s, 2), title])
                deadline = time.time() + 600
                while not umaps() and time.time() < deadline:
                    time.sleep(1)
                s, title = explore_load(browser, server.url)
                rows.append(["Explore, new session, UMAP stored", round(s, 2), title])
                latencies = next_triplet_ms(browser, server.url, args.presses)
            finally:
                server.stop()
            server = AppServer(ws.root, root / "streamlit2.log")
            try:
                s, title = explore_load(browser, server.url)
                rows.append(["Explore, restarted server, UMAP stored", round(s, 2), title])
            finally:
                server.stop()
            browser.close()
    median = statistics.median(latencies)
    p90 = float(np.percentile(latencies, 90))
    tables = [
        {"caption": f"Explore first load (click → map drawn), target ≤ {TARGET_EXPLORE_S:.0f} s",
         "columns": ["case", "seconds", "map"], "rows": rows},
        {"caption": f"Next triplet by keyboard over {len(latencies)} answers, target ≤ {TARGET_NEXT_MS:.0f} ms median",
         "columns": ["median ms", "90th percentile ms", "min ms", "max ms", "median / target"],
         "rows": [[round(median, 1), round(p90, 1), round(min(latencies), 1), round(max(latencies), 1),
                   round(median / TARGET_NEXT_MS, 2)]]},
    ]
    print(render_tables(tables))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
