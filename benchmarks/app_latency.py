"""Benchmark: what a person waits for in the app, measured in Chromium (Playwright) against a live
``streamlit run app.py`` on the synthetic demo.

* Explore's first load (click on "Explore" to the scatter drawn), median over ``--runs`` fresh
  servers: with the run's UMAP stored (every visit after the first computation), and with none
  stored yet (the very first visit: an instant classical-MDS map while the UMAP is computed once
  in the background). Target (issue 18): ≤ 3 s on the demo.
* Next triplet by keyboard: key press (→ answer) to the next question's three photos shown (loaded),
  median and 90th percentile over ``--presses`` answers; undo (U) likewise. ``--triplets``: only
  this, at the machine's load and with two busy processes more, for this checkout and (``--before
  REV``) the page of an earlier revision, written to results/app_latency.json. Target (issue 36):
  ≤ 300 ms median, ≤ 500 ms 90th percentile at a load average of about 2.
* ``--scale DIR``: Explore at scale on the phantom study in ``DIR`` (e.g. ``python -m core.phantoms
  --out DIR --photos 2500 --wounds 10000``): after the first computation (UMAPs stored), the seconds
  from choosing "wounds" to the 10,000-point scatter drawn and the bytes the browser received for
  it (every websocket frame of that rerun), median over ``--runs`` browser sessions of a fresh
  server. Target (issue 20): ≤ 2 s.
* ``--upload N``: photo upload in the browser (Home's "Upload photos", as an annotator): N phone photos
  (12 MP JPEG, turned by EXIF) put in the file chooser to every file on the server, then the click on
  "Upload the visit" to its message (each photo checked, turned upright, stripped and stored), median
  over ``--runs`` uploads of one server; and the data layer alone (:func:`annotations.io.upload.upload_photos`
  in-process) for comparison.
* ``--worklist``: next photo on the outline page's worklist: key press (N) to the next photo's heading and
  its picture in the outline editor, median and 90th percentile over ``--presses`` photos. ``--zoom``: key
  press (W) on the Triplets page to the zoom dialog's picture loaded (fitted to the query photo's wounds, cut
  on the server), over ``--presses`` photos (the dialog closed and the next triplet shown between two).
  Both on the SYNTHETIC demo of ``--photos`` photos at 1366×768; targets (issue 54): ≤ 300 ms median.
* ``--after-job [ARGS]``: Explore's first open after a new run: the demo imported, ``python -m
  core.train_triderm ARGS`` run (the job stores the run's UMAP and token maps), then on a fresh server the click
  on "Explore" to the map drawn and to its token-map tiles shown, first and second visit. Target (issue 54): ≤ 3 s.

``--upload``, ``--worklist``, ``--zoom`` and ``--after-job`` combine with each other and with ``--triplets``; with
``--triplets`` every table measured goes into results/app_latency.json (each row with its load average).

The embedding runs are **TEST-ONLY random vectors** (the page's cost does not depend on what the
vectors mean); the photos are the SYNTHETIC phantoms.

    python -m benchmarks.app_latency [--runs 3] [--presses 40] [--photos 53] [--keep DIR]
    python -m benchmarks.app_latency --scale DIR [--runs 3] [--dim 64]
    python -m benchmarks.app_latency --triplets [--before REV] [--presses 40]   # writes results/app_latency.json
    python -m benchmarks.app_latency --upload 20 [--runs 3]
    python -m benchmarks.app_latency --upload 20 --worklist --zoom [--runs 1] [--presses 40]   # issue 54's figures
    python -m benchmarks.app_latency --triplets --upload 20 --worklist --zoom --after-job   # all, into the file
"""
from __future__ import annotations

import argparse
import inspect
import io
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import date
from functools import partial
from pathlib import Path

import numpy as np

from annotations.accounts import accounts
from annotations.infra.workspace import Workspace
from annotations.io.dataset import import_dataset
from annotations.io.upload import MAX_PHOTOS, upload_photos
from annotations.store.runs import VISION_BASELINE, recording
from benchmarks.results import REPO, RESULTS_DIR, command_line, render_tables, write_result
from tests.browser.conftest import CHROMIUM, CHROMIUM_ARGS, AppServer
from tests.browser.streamlit_page import idle, wait_for_cookie

PASSWORD = "benchmark-password"
TARGET_EXPLORE_S = 3.0
TARGET_NEXT_MS, TARGET_NEXT_P90_MS = 300.0, 500.0  # issue 36: key → next photos at load ≈ 2
TARGET_WORKLIST_MS, TARGET_ZOOM_MS = 300.0, 300.0  # issue 54: key → next photo / zoom shown, median
UMAP_NEIGHBOURS, UMAP_MIN_DIST = 15, 0.1  # the page's default UMAP setting
TOKEN_TILES = 4  # the photos of Explore's token-map grid (pages/5_Explore.py GRID_PHOTOS)
#: The job of the Explore-after-a-new-run figure: make demo's mode (fine-tune), shortened (the page's cost does not
#: depend on how long the run trained).
AFTER_JOB = "--mode fine-tune --views 2 --cv-repeats 1 --steps 10"


def add_random_run(ws: Workspace, dim: int, seed: int = 0) -> int:
    """A finished TEST-ONLY run with random photo and wound embeddings of ``dim`` dimensions."""
    from core.runtime import save_embeddings

    ids = [im["image_id"] for im in ws.store.images()]
    keys = [(w["image_id"], w["wound_index"]) for w in ws.store.wounds()]
    rng = np.random.default_rng(seed)
    with recording(ws, VISION_BASELINE, {"modality": "vision", "test_only": True},
                        name="TEST-ONLY random embedding") as rec:
        save_embeddings(ws, rec.id, ids, image_emb=rng.normal(size=(len(ids), dim)),
                        wound_keys=keys or None, wound_emb=rng.normal(size=(len(keys), dim)) if keys else None)
    return rec.id


def demo_workspace(root: Path, photos: int, random_run: bool = True) -> Workspace:
    """The phantom demo imported, one TEST-ONLY random embedding run (unless not ``random_run``), an admin
    account."""
    from core.phantoms import build

    build(root / "demo", seed=0, photos=photos, patients=max(1, round(photos * 21 / 53)),
          wounds=max(photos, round(photos * 120 / 53)),
          triplets=min(round(photos * 513 / 53), photos * (photos - 1) * (photos - 2) // 2))
    ws = Workspace(root / "ws")
    import_dataset(ws, root / "demo")
    if random_run:
        add_random_run(ws, 8)
    accounts.add_account(ws.store, "Bench", "admin", PASSWORD, "benchmark")
    return ws


def demo_workspace_of(repo: Path, root: Path, photos: int) -> Path:
    """The folder of :func:`demo_workspace` made by ``repo``'s own code: a checkout of another revision
    refuses a store whose schema is newer than its own (its page then never signs in), so its workspace
    is built in a subprocess there, never opened by this checkout."""
    if repo == REPO:
        return demo_workspace(root, photos).root
    script = "\n".join(["from pathlib import Path", "import sys", "import numpy as np",
                        "from annotations.accounts import accounts", "from annotations.io.dataset import import_dataset",
                        "from annotations.infra.workspace import Workspace", f"PASSWORD = {PASSWORD!r}",
                        inspect.getsource(add_random_run), inspect.getsource(demo_workspace),
                        "demo_workspace(Path(sys.argv[1]), int(sys.argv[2]))"])
    subprocess.run([sys.executable, "-c", script, str(root), str(photos)], cwd=repo, check=True, capture_output=True,
                   env={**os.environ, "PYTHONPATH": str(repo)})
    return root / "ws"


def sign_in(pg, url: str) -> None:
    """Sign the benchmark account in at ``url`` and wait for the home page."""
    pg.goto(url)
    pg.get_by_role("textbox", name="Account name").fill("Bench")
    pg.get_by_label("Password", exact=True).fill(PASSWORD)
    pg.get_by_role("button", name="Sign in").click()
    pg.get_by_text("Signed in as").first.wait_for()
    wait_for_cookie(pg, timeout_ms=600_000)  # a goto before the app's script has set it opens a signed-out session
    idle(pg)


class Session:
    """One signed-in browser session that counts the bytes its websocket receives."""

    def __init__(self, browser, url: str) -> None:
        self.context = browser.new_context(viewport={"width": 1366, "height": 900})
        self.page = self.context.new_page()
        self.page.set_default_timeout(600_000)
        self.received = 0
        self.page.on("websocket", lambda sock: sock.on("framereceived", self._count))
        sign_in(self.page, url)

    def _count(self, payload: bytes | str) -> None:
        self.received += len(payload)

    def until_map(self, action, level: str) -> tuple[float, str, int]:
        """Seconds from ``action()`` to the scatter of ``level`` drawn, its title, and the bytes received
        by the end of that script run."""
        self.received = 0
        t0 = time.perf_counter()
        action()
        chart = self.page.locator(f'[data-testid="stVegaLiteChart"][aria-label$="({level})"]').first
        chart.locator(".marks").first.wait_for()  # an SVG or a canvas, there once Vega has drawn the map
        seconds = time.perf_counter() - t0
        idle(self.page)
        return seconds, chart.get_attribute("aria-label") or "", self.received

    def close(self) -> None:
        """Close the browser context."""
        self.context.close()


def open_explore(page) -> None:
    """Open the Explore page from the sidebar."""
    page.get_by_role("link", name="Explore").click()


def choose_wounds(page) -> None:
    """Switch Explore to the wounds level."""
    page.get_by_text("wounds", exact=True).click()


def explore_load(browser, url: str) -> tuple[float, str]:
    """Seconds from clicking "Explore" (signed in) to the photo map drawn, and the map's title."""
    session = Session(browser, url)
    seconds, title, _ = session.until_map(partial(open_explore, session.page), "photos")
    session.close()
    return seconds, title


def fresh_server_loads(browser, ws: Workspace, log: Path, runs: int, stored: bool) -> tuple[list[float], str]:
    """``runs`` Explore first loads, each on a fresh server; without ``stored`` the run's stored UMAPs
    are removed before each start (and the one computed meanwhile after)."""
    seconds, title = [], ""
    for n in range(runs):
        if not stored:
            for path in ws.runs_dir.rglob("umap-*.npy"):
                path.unlink()
        server = AppServer(ws.root, log.with_suffix(f".{'stored' if stored else 'none'}{n}.log"))
        try:
            s, title = explore_load(browser, server.url)
            seconds.append(s)
        finally:
            server.stop()
    return seconds, title


def wait_for_umaps(ws: Workspace, count: int, timeout: float = 1800) -> float:
    """Seconds until ``count`` UMAP files are stored under the workspace's runs."""
    t0 = time.time()
    while len(list(ws.runs_dir.rglob("umap-*.npy"))) < count:
        if time.time() - t0 > timeout:
            raise TimeoutError(f"no {count} stored UMAPs after {timeout:.0f} s")
        time.sleep(1)
    return time.time() - t0


#: True once the three photos of the main area are loaded and the zoom buttons no longer name
#: ``before`` (the photos of the question answered: never the next question's, which is a new
#: triplet, a repeat with its sides swapped, or after an undo the one answered before).
NEXT_SHOWN_JS = """before => {
  const names = [...document.querySelectorAll('button')].map(b => b.innerText).filter(t => t.includes('Zoom '));
  const imgs = [...document.querySelectorAll('[data-testid="stMain"] [data-testid="stImage"] img')];
  return names.length === 3 && names.join('|') !== before && imgs.length === 3
    && imgs.every(i => i.complete && i.naturalWidth > 0);
}"""


def zoom_names(pg) -> str:
    """The three zoom buttons' texts (they name the photos shown), joined as NEXT_SHOWN_JS joins them."""
    return "|".join(t for t in pg.get_by_role("button").all_inner_texts() if "Zoom " in t)


def timed_press(pg, key: str, shown_js: str, arg: str | None = None) -> float:
    """Milliseconds from pressing ``key`` to ``shown_js(arg)`` true (polled every frame); then waits for the
    app to be idle."""
    t0 = time.perf_counter()
    pg.keyboard.press(key)
    pg.wait_for_function(shown_js, arg=arg, polling="raf")
    ms = 1000 * (time.perf_counter() - t0)
    idle(pg)
    return ms


def next_triplet_ms(browser, url: str, presses: int) -> tuple[list[float], list[float]]:
    """Milliseconds from each → key press to the next question's three photos shown (loaded), and
    from every fifth press of U (undo) to the undone question's photos shown again."""
    context = browser.new_context(viewport={"width": 1366, "height": 768})
    pg = context.new_page()
    pg.set_default_timeout(600_000)  # the first visit of a fresh server on a loaded machine
    sign_in(pg, url)
    pg.goto(f"{url}/Triplets")
    pg.get_by_text(re.compile(r"^Bench: \d+ of")).wait_for()
    idle(pg)
    pg.set_default_timeout(120_000)
    nexts, undos = [], []
    for n in range(presses):
        nexts.append(timed_press(pg, "ArrowRight", NEXT_SHOWN_JS, zoom_names(pg)))
        if n % 5 == 4:
            undos.append(timed_press(pg, "u", NEXT_SHOWN_JS, zoom_names(pg)))
    context.close()
    return nexts, undos


class Load:
    """``n`` busy-looping processes for the duration of a ``with`` block (extra CPU load)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.procs: list[subprocess.Popen] = []

    def __enter__(self) -> Load:
        self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(self.n)]
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()


def triplet_rows(browser, url: str, presses: int, extra_loads: Sequence[int]) -> list[list]:
    """One row per extra load: the machine's 1-minute load average at the end, next-photos median and
    90th percentile, undo median (ms)."""
    rows = []
    for extra in extra_loads:
        with Load(extra):
            if extra:
                time.sleep(20)  # let the load average rise
            nexts, undos = next_triplet_ms(browser, url, presses)
            load = os.getloadavg()[0]
        rows.append([f"+{extra} busy processes", round(load, 1), round(statistics.median(nexts), 1),
                     round(float(np.percentile(nexts, 90)), 1), round(statistics.median(undos), 1), len(nexts)])
    return rows


def summary(seconds: list[float]) -> list[float]:
    """Median, min and max of ``seconds``, rounded to 0.01 s."""
    return [round(statistics.median(seconds), 2), round(min(seconds), 2), round(max(seconds), 2)]


def demo_tables(browser, root: Path, args: argparse.Namespace) -> list[dict]:
    """Explore's first load and the next triplet on the phantom demo."""
    from core.eval.explore import compute_umap, map_input

    ws = demo_workspace(root, args.photos)
    (run_id,) = [r["id"] for r in ws.store.runs(status="done")]
    log = root / "streamlit"
    none_s, none_title = fresh_server_loads(browser, ws, log, args.runs, stored=False)
    t0 = time.perf_counter()  # the first computation, as the page's background thread does it
    compute_umap(ws, map_input(ws, [run_id]), UMAP_NEIGHBOURS, UMAP_MIN_DIST)
    umap_s = time.perf_counter() - t0
    stored_s, stored_title = fresh_server_loads(browser, ws, log, args.runs, stored=True)
    server = AppServer(ws.root, root / "streamlit-triplets.log")
    try:
        latencies = next_triplet_ms(browser, server.url, args.presses)[0]
    finally:
        server.stop()
    median = statistics.median(latencies)
    return [
        {"caption": f"Explore first load (click → scatter drawn), fresh server each run, {args.runs} runs, "
                    f"target ≤ {TARGET_EXPLORE_S:.0f} s",
         "columns": ["case", "median s", "min s", "max s", "map"],
         "rows": [["UMAP stored (after the first computation)", *summary(stored_s), stored_title],
                  ["no UMAP stored yet (first visit ever)", *summary(none_s), none_title],
                  [f"(the UMAP itself, computed once: {umap_s:.1f} s in a fresh process)", "", "", "", ""]]},
        {"caption": f"Next triplet by keyboard (key → next photos shown) over {len(latencies)} answers, "
                    f"target ≤ {TARGET_NEXT_MS:.0f} ms median",
         "columns": ["median ms", "90th percentile ms", "min ms", "max ms", "median / target"],
         "rows": [[round(median, 1), round(float(np.percentile(latencies, 90)), 1), round(min(latencies), 1),
                   round(max(latencies), 1), round(median / TARGET_NEXT_MS, 2)]]},
    ]


def checkout(rev: str, folder: Path) -> Path:
    """A detached git worktree of revision ``rev`` of this repository in ``folder``."""
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(folder), rev], check=True,
                   capture_output=True)
    return folder


def triplet_tables(browser, root: Path, args: argparse.Namespace) -> list[dict]:
    """Key → next photos and undo on the Triplets page, for this checkout and (``--before REV``) the
    page of revision REV, each at the machine's load and with two busy processes more."""
    codes = [("this checkout", REPO)]
    if args.before:
        codes.insert(0, (f"before ({args.before})", checkout(args.before, root / "before")))
    rows = []
    try:
        for n, (label, repo) in enumerate(codes):
            server = AppServer(demo_workspace_of(repo, root / f"workspace-{n}", args.photos), root / f"streamlit-{n}.log",
                               repo=repo)
            try:
                rows += [[label, *row] for row in triplet_rows(browser, server.url, args.presses, args.loads)]
            finally:
                server.stop()
    finally:
        if args.before:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(root / "before")],
                           check=False, capture_output=True)
    return [{"caption": f"Triplets page, key press → the next question's three photos shown (loaded), "
                        f"{args.presses} answers by → and one undo (U) after every fifth, per row; SYNTHETIC demo of "
                        f"{args.photos} photos; target ≤ {TARGET_NEXT_MS:.0f} ms median, ≤ {TARGET_NEXT_P90_MS:.0f} ms "
                        "90th percentile at a load average of about 2",
             "columns": ["page", "extra load", "load average (1 min)", "next_triplet_median_ms", "next_triplet_p90_ms",
                         "undo_median_ms", "answers"],
             "rows": rows}]


def tile_study(src: Path, out: Path, wounds: int) -> Path:
    """A study of about ``wounds`` wounds made of copies of the phantom study ``src`` (photos and masks
    copied under new ids ``<id>c<k>``; same patients; no triplets), for page costs that grow with the
    number of points, not with what the photos show."""
    import csv
    import shutil

    def rows(name: str) -> tuple[list[str], list[dict]]:
        with open(src / name, newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            return list(reader.fieldnames or []), list(reader)

    (img_cols, images), (wound_cols, src_wounds) = rows("images.csv"), rows("wounds.csv")
    per_photo: dict[str, list[dict]] = {}
    for w in src_wounds:
        per_photo.setdefault(w["image_id"], []).append(w)
    out_images, out_wounds, copy = [], [], 0
    (out / "images").mkdir(parents=True)
    (out / "masks").mkdir()
    while len(out_wounds) < wounds:
        for im in images:
            if len(out_wounds) >= wounds:
                break
            new = f"{im['image_id']}c{copy}"
            for folder in ("images", "masks"):
                shutil.copyfile(src / folder / f"{im['image_id']}.png", out / folder / f"{new}.png")
            out_images.append({**im, "image_id": new})
            out_wounds += [{**w, "image_id": new} for w in per_photo.get(im["image_id"], [])]
        copy += 1
    for name, cols, table in (("images.csv", img_cols, out_images), ("wounds.csv", wound_cols, out_wounds)):
        with open(out / name, "w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, cols)
            writer.writeheader()
            writer.writerows(table)
    shutil.copy(src / "patients.csv", out / "patients.csv")
    shutil.copy(src / "dataset.json", out / "dataset.json")
    return out


def scale_tables(browser, root: Path, args: argparse.Namespace) -> list[dict]:
    """Explore on the phantom study in ``args.scale``: the wound map after the first computation."""
    ws = Workspace(root / "ws")
    study = tile_study(Path(args.scale), root / "tiled", args.wounds) if args.wounds else Path(args.scale)
    t0 = time.perf_counter()
    import_dataset(ws, study)
    import_s = time.perf_counter() - t0
    add_random_run(ws, args.dim)
    accounts.add_account(ws.store, "Bench", "admin", PASSWORD, "benchmark")
    n_photos, n_wounds = len(ws.store.images()), len(ws.store.wounds())

    server = AppServer(ws.root, root / "streamlit-first.log")
    try:  # the first computation: both maps' UMAPs, in the background
        session = Session(browser, server.url)
        first_photos = session.until_map(partial(open_explore, session.page), "photos")
        first_wounds = session.until_map(partial(choose_wounds, session.page), "wounds")
        umap_s = wait_for_umaps(ws, 2)
        session.close()
    finally:
        server.stop()
    server = AppServer(ws.root, root / "streamlit-stored.log")
    photos_s, wounds_s, payload, title = [], [], [], ""
    try:
        for _ in range(args.runs):
            session = Session(browser, server.url)
            photos_s.append(session.until_map(partial(open_explore, session.page), "photos")[0])
            s, title, size = session.until_map(partial(choose_wounds, session.page), "wounds")
            wounds_s.append(s)
            payload.append(size / 1024)
            session.close()
    finally:
        server.stop()
    tiled = f" tiled from {args.scale}" if args.wounds else ""
    return [{"caption": f"Explore at scale: SYNTHETIC phantom study of {n_photos:,} photos, {n_wounds:,} wounds{tiled} "
                        f"(TEST-ONLY random embedding, dim {args.dim}; import {import_s:.0f} s); "
                        f"{args.runs} browser sessions of a fresh server, target ≤ 2 s",
             "columns": ["case", "median s", "min s", "max s", "websocket KiB (median)", "map"],
             "rows": [["first visit, photos (instant MDS; UMAPs computed in the background)",
                       round(first_photos[0], 2), "", "", round(first_photos[2] / 1024), first_photos[1]],
                      ["first visit, wounds", round(first_wounds[0], 2), "", "", round(first_wounds[2] / 1024),
                       first_wounds[1]],
                      [f"both UMAPs stored after {umap_s:.0f} s more", "", "", "", "", ""],
                      ["UMAP stored: Explore opened, photos", *summary(photos_s), "", ""],
                      ["UMAP stored: wounds chosen", *summary(wounds_s), round(statistics.median(payload)), title]]}]


#: The phone photo of the upload figure: 12 MP, as a phone's main camera takes it.
PHONE_SIZE = (4032, 3024)
UPLOADED_PATIENT = "P-1"
#: A file in the chooser is on the server once no chip shows its spinner.
ALL_SENT_JS = """n => document.querySelectorAll('[data-testid="stFileChip"]').length === n
  && !document.querySelector('[data-testid="stFileChipIconSpinner"]')"""


def phone_photo(seed: int = 0) -> bytes:
    """A phone's JPEG (:data:`PHONE_SIZE`, quality 90): a smooth skin-toned field with sensor noise, turned
    by EXIF orientation 6 and carrying maker and GPS tags, so an upload turns it upright and strips it."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    width, height = PHONE_SIZE
    field = Image.fromarray(rng.integers(90, 210, (24, 32, 3), dtype=np.uint8)).resize(PHONE_SIZE,
                                                                                        Image.Resampling.BICUBIC)
    noisy = np.asarray(field, np.int16) + rng.normal(0, 5, (height, width, 3)).astype(np.int16)
    exif = Image.Exif()
    exif[0x0112], exif[0x010F] = 6, "PhoneMaker"
    exif.get_ifd(0x8825)[1] = "N"
    buf = io.BytesIO()
    Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8)).save(buf, format="JPEG", quality=90, exif=exif)
    return buf.getvalue()


def upload_visit(pg, files: list[Path]) -> tuple[float, float]:
    """On Home (signed in): seconds from ``files`` put in the chooser to every one on the server, and from
    the click on "Upload the visit" (patient :data:`UPLOADED_PATIENT`, today) to its message."""
    pg.get_by_text("Upload photos", exact=True).click()
    pg.get_by_test_id("stFileUploaderDropzone").wait_for()
    t0 = time.perf_counter()
    pg.get_by_test_id("stFileUploader").locator("input[type='file']").set_input_files([str(f) for f in files])
    pg.wait_for_function(ALL_SENT_JS, arg=len(files), polling="raf")
    sent_s = time.perf_counter() - t0
    patient = pg.get_by_role("combobox", name="Patient")
    patient.click()
    patient.press_sequentially(UPLOADED_PATIENT)
    pg.get_by_role("option", name=UPLOADED_PATIENT, exact=True).click()
    t0 = time.perf_counter()
    pg.get_by_role("button", name="Upload the visit").click()
    pg.get_by_text(f"Uploaded {len(files)} photo(s) of patient {UPLOADED_PATIENT}").wait_for()
    stored_s = time.perf_counter() - t0
    idle(pg)
    return sent_s, stored_s


def upload_tables(browser, root: Path, args: argparse.Namespace) -> list[dict]:
    """The upload of ``args.upload`` phone photos in Chromium (``args.runs`` uploads, one server), and the
    data layer alone."""
    bench = accounts.Account("Bench", "annotator")
    ws = Workspace(root / "ws")
    upload_photos(ws, [("first-visit.jpg", phone_photo(1))], UPLOADED_PATIENT, "2024-03-01", account=bench)
    accounts.add_account(ws.store, bench.name, bench.role, PASSWORD, "benchmark")
    data = phone_photo()
    sent, stored = [], []
    server = AppServer(ws.root, root / "streamlit-upload.log")
    try:
        for run in range(args.runs):
            folder = root / f"photos-{run}"
            folder.mkdir()
            files = [folder / f"r{run}-visit-{n:02d}.jpg" for n in range(args.upload)]
            for f in files:
                f.write_bytes(data)
            session = Session(browser, server.url)
            s, t = upload_visit(session.page, files)
            session.close()
            sent.append(s)
            stored.append(t)
        load = round(os.getloadavg()[0], 1)
    finally:
        server.stop()
    assert len(ws.store.images()) == 1 + args.runs * args.upload
    t0 = time.perf_counter()
    upload_photos(Workspace(root / "ws-direct"), [(f"visit-{n:02d}.jpg", data) for n in range(args.upload)],
                  UPLOADED_PATIENT, date.today(), account=bench)
    direct_s = time.perf_counter() - t0
    direct_load = round(os.getloadavg()[0], 1)

    def row(case: str, seconds: list[float], at: float) -> list:
        return [case, *summary(seconds), round(statistics.median(seconds) / args.upload, 3), at]

    return [{"caption": f"Upload of {args.upload} phone photos in Chromium as an annotator ({PHONE_SIZE[0]}×"
                        f"{PHONE_SIZE[1]} JPEG, {len(data) / 1e6:.1f} MB each, EXIF orientation 6), "
                        f"{args.runs} upload(s) of one server (issue 54 sets no target); load average (1 min) "
                        f"on {os.cpu_count()} CPUs at the end of each row's measurement",
             "columns": ["case", "median s", "min s", "max s", "per photo s (median)", "load average (1 min)"],
             "rows": [row("files sent (chooser → every file on the server)", sent, load),
                      row("stored (click → message: checked, turned upright, stripped, written)", stored, load),
                      row("total (wall)", [a + b for a, b in zip(sent, stored)], load),
                      row("the data layer alone (annotations.upload, in-process, once)", [direct_s], direct_load)]}]


#: The photo on the outline page: its heading and a short signature of the editor's picture (a data URI; the
#: editor, a components.v2 component, lives in a shadow root).
PHOTO_SHOWN_JS = """() => {
  const find = root => root.querySelector('.oe svg image')
    || [...root.querySelectorAll('*')].filter(e => e.shadowRoot).map(e => find(e.shadowRoot)).find(Boolean) || null;
  const heading = [...document.querySelectorAll('h3')].map(h => h.innerText).find(t => t.startsWith('Wounds of'));
  const href = find(document)?.getAttribute('href') || '';
  return heading && href ? heading + '|' + href.length + '|' + href.slice(-48) : '';
}"""
#: True once both the heading and the editor's picture differ from ``before`` (a PHOTO_SHOWN_JS value).
NEXT_PHOTO_JS = f"""before => {{
  const [h0, l0, t0] = before.split('|'), [h1, l1, t1] = ({PHOTO_SHOWN_JS})().split('|');
  return !!h1 && h1 !== h0 && (l1 !== l0 || t1 !== t0);
}}"""
#: True once the zoom dialog's picture of the query photo is loaded.
ZOOM_SHOWN_JS = """() => {
  const dialog = document.querySelector('[role="dialog"]');
  const img = dialog && dialog.querySelector('[data-testid="stImage"] img');
  return !!img && img.complete && img.naturalWidth > 0 && dialog.innerText.includes('Query · ');
}"""


def laptop_page(browser, url: str, path: str):
    """A signed-in 1366×768 page on ``url/path`` after its first run; returns (context, page)."""
    context = browser.new_context(viewport={"width": 1366, "height": 768})
    pg = context.new_page()
    pg.set_default_timeout(600_000)  # the first visit of a fresh server on a loaded machine
    sign_in(pg, url)
    pg.goto(f"{url}/{path}")
    return context, pg


def worklist_next_ms(browser, url: str, presses: int) -> list[float]:
    """Milliseconds from each press of N on the outline page to the next photo's heading and picture shown."""
    context, pg = laptop_page(browser, url, "Wound_masks")
    pg.wait_for_function(PHOTO_SHOWN_JS)
    idle(pg)
    pg.set_default_timeout(120_000)
    nexts = [timed_press(pg, "n", NEXT_PHOTO_JS, pg.evaluate(PHOTO_SHOWN_JS)) for _ in range(presses)]
    context.close()
    return nexts


def zoom_open_ms(browser, url: str, presses: int) -> list[float]:
    """Milliseconds from each press of W on the Triplets page to the zoom dialog's picture loaded; the dialog
    is closed and the next triplet answered (→) between two, so each zoom is of another question."""
    context, pg = laptop_page(browser, url, "Triplets")
    pg.get_by_text(re.compile(r"^Bench: \d+ of")).wait_for()
    idle(pg)
    pg.set_default_timeout(120_000)
    opens = []
    for _ in range(presses):
        opens.append(timed_press(pg, "w", ZOOM_SHOWN_JS))
        pg.keyboard.press("Escape")
        pg.get_by_role("dialog").wait_for(state="detached")
        timed_press(pg, "ArrowRight", NEXT_SHOWN_JS, zoom_names(pg))
    context.close()
    return opens


def spread(name: str, ms: list[float], target: float) -> list:
    """A row: ``name``, median, 90th percentile, min, max (ms), median / target, count, and the 1-minute load
    average now (call it right after the measurement)."""
    median = statistics.median(ms)
    return [name, round(median, 1), round(float(np.percentile(ms, 90)), 1), round(min(ms), 1), round(max(ms), 1),
            round(median / target, 2), len(ms), round(os.getloadavg()[0], 1)]


def day_tables(browser, root: Path, args: argparse.Namespace) -> list[dict]:
    """Issue 54's figures on the phantom demo, one server: next photo of the outline page's worklist
    (``--worklist``) and the zoom's opening (``--zoom``)."""
    ws = demo_workspace(root, args.photos)
    server = AppServer(ws.root, root / "streamlit-day.log")
    rows = []
    try:
        if args.worklist:
            rows.append(spread("outline page: N → next photo's heading and picture shown",
                               worklist_next_ms(browser, server.url, args.presses), TARGET_WORKLIST_MS))
        if args.zoom:
            rows.append(spread("Triplets: W → zoom dialog's picture loaded (fitted to the wounds)",
                               zoom_open_ms(browser, server.url, args.presses), TARGET_ZOOM_MS))
    finally:
        server.stop()
    return [{"caption": f"Key press → shown at 1366×768 in Chromium, SYNTHETIC demo of {args.photos} photos, one "
                        f"server; targets (issue 54) ≤ {TARGET_WORKLIST_MS:.0f} ms (next photo) and "
                        f"≤ {TARGET_ZOOM_MS:.0f} ms (zoom) median; load average (1 min) on {os.cpu_count()} CPUs at "
                        "the end of each row's presses",
             "columns": ["case", "median ms", "90th percentile ms", "min ms", "max ms", "median / target", "presses",
                         "load average (1 min)"],
             "rows": rows}]


#: The token-map tiles of Explore's grid (the query photo and its nearest) whose picture is loaded: their count.
TILES_SHOWN_JS = """() => [...document.querySelectorAll('[data-testid="stMain"] [data-testid="stImage"]')]
  .filter(e => /\\(the photo\\)|· similar/.test(e.innerText))
  .filter(e => { const i = e.querySelector('img'); return i && i.complete && i.naturalWidth > 0; }).length"""


def explore_visit(browser, url: str, tiles: int) -> tuple[float, float | None, str]:
    """One signed-in session's click on "Explore": seconds to the map drawn, to ``tiles`` token-map tiles shown
    (None when ``tiles`` is 0), and the map's title."""
    session = Session(browser, url)
    t0 = time.perf_counter()
    seconds, title, _ = session.until_map(partial(open_explore, session.page), "photos")
    tiles_s = None
    if tiles:
        session.page.wait_for_function(f"({TILES_SHOWN_JS})() >= {tiles}", polling="raf")
        tiles_s = round(time.perf_counter() - t0, 2)
    session.close()
    return seconds, tiles_s, title


def after_job_tables(browser, root: Path, args: argparse.Namespace) -> list[dict]:
    """Explore's first visit after a new run: the phantom demo, ``python -m core.train_triderm ARGS`` (the job,
    which stores the run's map and token maps), then a fresh server's first and second visits."""
    ws = demo_workspace(root, args.photos, random_run=False)
    t0 = time.perf_counter()
    job = shlex.split(args.after_job)
    subprocess.run([sys.executable, "-m", "core.train_triderm", "--workspace", str(ws.root), *job],
                   cwd=REPO, check=True, capture_output=True)
    job_s, job_load = time.perf_counter() - t0, round(os.getloadavg()[0], 1)
    from core.eval.explore import TOKEN_MAPS_ARTIFACT, run_choices
    from core.eval.report import embedding_runs

    run = ws.store.run(next(iter(run_choices(embedding_runs(ws)))))  # the run Explore opens on
    stored = [p.name for p in ws.runs_dir.rglob("umap-*.npy")]
    tiles = min(TOKEN_TILES, args.photos) if (run.get("artifacts") or {}).get(TOKEN_MAPS_ARTIFACT) else 0
    server = AppServer(ws.root, root / "streamlit-after-job.log")
    rows = []
    try:
        for visit in ("first visit after the run (fresh server)", "second visit (another session)"):
            seconds, tiles_s, title = explore_visit(browser, server.url, tiles)
            rows.append([visit, round(seconds, 2), tiles_s, round(seconds / TARGET_EXPLORE_S, 2), title,
                         round(os.getloadavg()[0], 1)])
    finally:
        server.stop()
    rows.append([f"(the job itself: python -m core.train_triderm {args.after_job}: run {run['id']} {run['kind']}; "
                 f"{len(stored)} UMAP file(s) stored by the job)", round(job_s, 1), "", "", "", job_load])
    return [{"caption": f"Explore's first open after a new run: click on Explore (signed in) → the map drawn, and → "
                        f"its {TOKEN_TILES} token-map tiles shown (when the run stored token maps), SYNTHETIC demo of {args.photos} photos, newest run made by "
                        f"the training job just before; target (issue 54) ≤ {TARGET_EXPLORE_S:.0f} s to the map; "
                        f"load average (1 min) on {os.cpu_count()} CPUs at the end of each row",
             "columns": ["case", "map drawn s", "token maps shown s", "map / target", "map", "load average (1 min)"],
             "rows": rows}]


def main(argv: list[str] | None = None) -> int:
    """The ``python -m benchmarks.app_latency`` benchmark; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.app_latency", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="fresh servers / sessions per Explore figure (median)")
    parser.add_argument("--presses", type=int, default=40, help="triplets answered by keyboard")
    parser.add_argument("--photos", type=int, default=53, help="photos in the phantom demo")
    parser.add_argument("--scale", default=None, help="a phantom study folder: measure Explore at its scale instead")
    parser.add_argument("--wounds", type=int, default=None,
                        help="with --scale: tile that study's photos up to this many wounds (e.g. 10000)")
    parser.add_argument("--dim", type=int, default=64, help="embedding dimensions of the --scale run")
    parser.add_argument("--triplets", action="store_true",
                        help="measure only the Triplets page at two loads and write results/app_latency.json")
    parser.add_argument("--before", default=None, metavar="REV",
                        help="with --triplets: also measure the page of git revision REV (e.g. 4b5f213)")
    parser.add_argument("--loads", type=int, nargs="+", default=[0, 2], metavar="N",
                        help="with --triplets: busy processes added, one measurement each (default 0 2)")
    parser.add_argument("--results", default=str(RESULTS_DIR), help="with --triplets: folder of app_latency.json")
    parser.add_argument("--upload", type=int, default=None, metavar="N",
                        help="measure only the upload of N phone photos in the browser (e.g. 20)")
    parser.add_argument("--worklist", action="store_true",
                        help="measure the outline page's next photo (N) on the demo (with --zoom / --upload: those too)")
    parser.add_argument("--zoom", action="store_true",
                        help="measure the Triplets page's zoom opening (W) on the demo (with --worklist / --upload too)")
    parser.add_argument("--after-job", nargs="?", const=AFTER_JOB, default=None, metavar="ARGS",
                        help="measure Explore's first open after python -m core.train_triderm ARGS made the newest "
                             f"run (default ARGS: {AFTER_JOB})")
    parser.add_argument("--keep", default=None, help="build the workspace here and keep it (default: a temp dir)")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"--runs must be ≥ 1, got {args.runs}")
    if args.presses < 5:
        parser.error(f"--presses must be ≥ 5 (one undo after every fifth answer), got {args.presses}")
    if min(args.loads) < 0:
        parser.error(f"--loads must be ≥ 0, got {args.loads}")
    if args.upload is not None and not 1 <= args.upload <= MAX_PHOTOS:
        parser.error(f"--upload must be 1 to {MAX_PHOTOS} (photos an upload takes), got {args.upload}")
    if args.scale and not Path(args.scale).is_dir():
        parser.error(f"--scale {args.scale}: not a folder (make one with python -m core.phantoms --out DIR)")
    from playwright.sync_api import sync_playwright

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        root = Path(args.keep or tmp)
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            # the longest part (a training job) first: a failure there costs no other measurement
            job_tables = after_job_tables(browser, root / "after-job", args) if args.after_job else []
            tables = triplet_tables(browser, root, args) if args.triplets else []
            if args.upload:
                tables += upload_tables(browser, root / "upload", args)
            if args.worklist or args.zoom:
                tables += day_tables(browser, root / "day", args)
            tables += job_tables
            if not tables:
                tables = scale_tables(browser, root, args) if args.scale else demo_tables(browser, root, args)
        finally:
            browser.close()
    print(render_tables(tables))
    if args.triplets:
        print(write_result("app_latency", "App latency in Chromium (Playwright): what a person waits for",
                           command_line("benchmarks.app_latency", argv), [0], tables,
                           seconds=time.perf_counter() - t0, results_dir=args.results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
