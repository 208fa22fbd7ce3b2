"""Streamlit helpers shared by the app's pages: workspace, accounts and roles, banners, images.

The rules themselves live in :mod:`annotations.accounts` (passwords, lock-out, session tokens,
roles) and :mod:`annotations.accounts.session`; this module only wires them to Streamlit. Every page
starts with ``ws = page(title, need=PERMISSION)``: it stops the script with a clear message for a
visitor who is not signed in or whose role lacks ``PERMISSION``.
"""

from __future__ import annotations

import base64
import gc
import hashlib
import importlib.abc
import importlib.util
import io
import json
import math
import re
import sys
import threading
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import streamlit as st
from PIL import Image, ImageOps

from annotations.accounts import accounts, session
from annotations.accounts.accounts import Account, AuthError
from annotations.infra import holders
from annotations.infra.workspace import Workspace
from triderm import EXTRA_OF, install_hint

PAGES_DIR = Path(__file__).resolve().parent / "pages"


class MissingExtra(importlib.abc.MetaPathFinder):
    """Last on ``sys.meta_path``, so asked only for a module no other finder has: when the app's own code
    (a page, ``core``) imports a module of an extra that is not installed (``torch`` on an ``[app]``-only
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
    """Whether the import statement being run is in a page or in ``core`` (not in a third-party library)."""
    frame = sys._getframe(1)
    while frame is not None and (frame.f_code.co_filename.startswith("<frozen importlib")
                                 or frame.f_code.co_name in ("find_spec", "_imported_by_the_app")):
        frame = frame.f_back
    if frame is None:
        return False
    module = str(frame.f_globals.get("__name__", ""))
    return module.split(".")[0] == "core" or Path(frame.f_code.co_filename).resolve().parent == PAGES_DIR


def extra_missing(module: str) -> str | None:
    """The install hint (``pip install "triderm-studio[ml]"``) when ``module`` of an extra is not installed
    here, else None. Probed from this module, not a page, so :class:`MissingExtra` does not stop the page: a
    page keeps its controls in place, disabled, with this hint as their help."""
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a module hidden (scripts/app_smoke.py --block-ml) or half-installed
        found = False
    return None if found else install_hint(module)


if not any(isinstance(finder, MissingExtra) for finder in sys.meta_path):
    sys.meta_path.append(MissingExtra())

APP_TITLE = "TriDerm Studio"
#: (script, title, icon, permission) of every page after Home, in sidebar order.
PAGES = [
    ("pages/1_Wound_masks.py", "Wound masks", ":material/draw:", "annotate"),
    ("pages/2_Triplets.py", "Triplet judgments", ":material/compare:", "annotate"),
    ("pages/3_LLM_oracle.py", "LLM oracle", ":material/smart_toy:", "jobs"),
    ("pages/4_Train.py", "Train", ":material/model_training:", "jobs"),
    ("pages/5_Explore.py", "Explore", ":material/scatter_plot:", "view"),
    ("pages/6_Report.py", "Report", ":material/table_chart:", "view"),
    ("pages/7_Review.py", "Review", ":material/fact_check:", "manage"),
    ("pages/8_Accounts.py", "Accounts", ":material/group:", "manage"),
    ("pages/9_Follow_up.py", "Follow-up", ":material/timeline:", "view"),
]
PERMISSION_TEXT = {"manage": "admins", "jobs": "admins and researchers", "annotate": "admins and annotators",
                   "view": "admins, researchers and viewers"}


def workspace() -> Workspace:
    """The workspace of this browser session (one store connection per session)."""
    root = session.workspace_root(sys.argv[1:])
    ws = st.session_state.get("_ws")
    if ws is None or ws.root != root:
        ws = Workspace(root)
        holders.register(ws.root)  # restore refuses while this app holds the workspace
        st.session_state["_ws"] = ws
    return ws


# -- accounts -------------------------------------------------------------------------------------
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


def page(title: str, need: str | None = None, compact: bool = False, banner: bool = True) -> Workspace:
    """Start a page: config, sign-in and role gate (stops the script when either fails), sidebar,
    synthetic banner. ``need``: ``manage``, ``jobs``, ``annotate``, ``view`` or None (any account).
    ``compact``: sidebar collapsed and narrow margins, for pages that need the whole screen width.
    ``banner=False``: the page labels its sections' data itself (a page that also shows real data)."""
    st.set_page_config(page_title=f"{title} · {APP_TITLE}", page_icon="🩹", layout="wide",
                       initial_sidebar_state="collapsed" if compact else "auto")
    if compact:
        st.html("<style>[data-testid='stMainBlockContainer'] {padding: 3.75rem 1rem 1rem 1rem;} "
                "[data-testid='stMainBlockContainer'] h1 {font-size: 1.6rem; padding: 0;}</style>")
    sync_cookie()
    found = account()
    if found is None or "_home_page" not in st.session_state:  # not reached through app.py's router
        route_through_app()
    if found is None:
        st.error(escape_md(st.session_state.get("_auth_notice")) or "Sign in on the Home page to use TriDerm Studio.")
        st.stop()
    ws = workspace()
    sidebar(ws)
    if need is not None and not found.can(need):
        st.title(title)
        st.error(f"**{title}** is only for {PERMISSION_TEXT[need]}. You are signed in as "
                 f"{escape_md(found.name)} ({found.role}); ask an admin if you need access.")
        st.stop()
    st.title(title)
    if banner:
        synthetic_banner(ws)
    return ws


def route_through_app() -> None:
    """Until app.py's ``st.navigation`` has run once in this server process, Streamlit runs a ``pages/``
    file by itself (its legacy multipage mode): a deep link that is the server's first request. Leave that
    mode and rerun the same address through app.py's router: the sign-in when signed out, else the page
    with the role's page list (the legacy mode would list every page and no Home)."""
    from streamlit.runtime.pages_manager import PagesManager

    if PagesManager.uses_pages_directory:
        PagesManager.uses_pages_directory = False
        st.rerun()


def sidebar(ws: Workspace) -> None:
    """The sidebar: links to the pages the account may open, the account, sign-out and the workspace."""
    found = account()
    with st.sidebar:
        if found is not None:
            if "_home_page" in st.session_state:  # set by app.py (absent when a page script runs alone)
                st.page_link(st.session_state["_home_page"], label="Home", icon=":material/home:")
            for script, title, icon, permission in PAGES:
                if found.can(permission):
                    st.page_link(script, label=title, icon=icon)
            st.divider()
            st.caption(f"Signed in as **{escape_md(found.name)}** ({found.role})")
            if st.button("Sign out", key="_signout"):
                sign_out()
                st.rerun()
        st.caption(f"Workspace: {escape_md(str(ws.root))}")


def synthetic_banner(ws: Workspace) -> None:
    """A warning banner when the workspace holds SYNTHETIC data."""
    if ws.is_synthetic:
        st.warning(
            "**SYNTHETIC DATA** — this workspace holds phantom wounds generated by `core.phantoms`. "
            "Every number and picture here is synthetic, not clinical.", icon=":material/science:")


#: Characters that start Markdown or HTML anywhere in a line (emphasis, code, links, images, HTML, tables,
#: strikethrough, math, entities, e-mail autolinks), escaped wherever they occur.
_MD_SPECIAL = frozenset("\\`*_{}[]<>#|~$&@")
#: Markdown that only starts at certain places: a list, quote or rule marker at a line's start, a ``www.`` or
#: ``scheme:`` autolink, a ``:shortcode:``, ``:material/icon:`` or ``:colour[text]`` directive.
_MD_PLACED = re.compile(r"(?m)^(\s*)([-+=]|\d+(?=[.)]))|(?i:\b(www)\.)|:(?=[\w\[/])")


def escape_md(text: str | None) -> str:
    """Text from data (names, ids, descriptions, file contents, error messages) shown as itself wherever
    Streamlit renders Markdown (messages, captions, headings, labels): no formatting, link, image, HTML,
    emoji or colour comes from it. Empty for None."""
    if not text:
        return ""
    out = "".join("\\" + ch if ch in _MD_SPECIAL else ch for ch in str(text))

    def placed(m: re.Match) -> str:
        if m.group(2) is not None:  # a line-start marker: "- ", "+ ", "=", "1." → escaped
            return f"{m.group(1)}{m.group(2)}\\" if m.group(2)[0].isdigit() else f"{m.group(1)}\\{m.group(2)}"
        if m.group(3) is not None:
            return f"{m.group(3)}\\."
        return "\\:\u2060"  # a word joiner after the colon: no shortcode or directive starts here

    return _MD_PLACED.sub(placed, out)


def _digest(ws: Workspace, image_id: str) -> str:
    """Content hash of a photo (the store's sha256, updated by every import) plus its mask file's, so
    cached pictures follow a re-import or a new outline rather than the file path."""
    row = ws.store.image(image_id) or {}
    mask = ws.masks_dir / f"{image_id}.png"
    mask_hash = hashlib.sha1(mask.read_bytes()).hexdigest() if mask.exists() else ""
    return f"{row.get('sha256', '')}:{mask_hash}"


@st.cache_data(show_spinner=False, max_entries=512)
def _thumbnail(path: str, size: int, digest: str) -> bytes:
    with Image.open(path) as im:
        im = im.convert("RGB")
        im.thumbnail((size, size))
        buf = io.BytesIO()
        im.save(buf, format="PNG")
    return buf.getvalue()


def photo(ws: Workspace, image_id: str, size: int = 320) -> bytes:
    """PNG bytes of a photo shrunk to ``size`` px on its longer side (cached by content hash)."""
    return _thumbnail(str(ws.image_path(image_id)), size, _digest(ws, image_id))


def _frame(im: Image.Image, width: int, height: int, fmt: str = "PNG") -> bytes:
    im = ImageOps.contain(im.convert("RGB"), (width, height))  # enlarges small photos too
    frame = Image.new("RGB", (width, height), (242, 245, 247))
    frame.paste(im, ((width - im.width) // 2, (height - im.height) // 2))
    buf = io.BytesIO()
    frame.save(buf, format=fmt, **({"quality": 92} if fmt == "JPEG" else {}))
    return buf.getvalue()


@st.cache_data(show_spinner=False, max_entries=512)
def _letterboxed(path: str, width: int, height: int, digest: str) -> bytes:
    with Image.open(path) as im:
        return _frame(im, width, height)


def letterboxed(ws: Workspace, image_id: str, width: int = 720, height: int = 540) -> bytes:
    """The photo fitted into a fixed width×height frame (neutral margins), so that photos of
    different shapes shown side by side line up (cached by content hash)."""
    return _letterboxed(str(ws.image_path(image_id)), width, height, _digest(ws, image_id))


@st.cache_data(show_spinner=False, max_entries=256)
def _outlined(root: str, image_id: str, width: int, height: int, digest: str) -> bytes:
    ws = workspace()
    return _frame(outline_overlay(ws.load_image(image_id), ws.load_mask(image_id)), width, height)


def outline_overlay(image: Image.Image, labels: np.ndarray, border: bool = True) -> Image.Image:
    """The photo with each wound's contour drawn in its colour (a 3-px line; the wound stays visible);
    without ``border`` no line runs along the picture's edge (a crop that cuts a wound)."""
    from scipy import ndimage

    out = np.asarray(image.convert("RGB")).copy()
    width = max(2, round(max(out.shape[:2]) / 300))
    for i in (int(v) for v in np.unique(labels) if v > 0):
        region = labels == i
        edge = region & ~ndimage.binary_erosion(region, iterations=width, border_value=0 if border else 1)
        out[edge] = session.PALETTE[(i - 1) % len(session.PALETTE)]
    return Image.fromarray(out)


def outlined(ws: Workspace, image_id: str, width: int = 720, height: int = 540) -> bytes:
    """:func:`letterboxed` with each outlined wound's contour drawn on the photo."""
    return _outlined(str(ws.root), image_id, width, height, _digest(ws, image_id))


@st.cache_resource(show_spinner=False, max_entries=8)
def _decoded(root: str, image_id: str, digest: str) -> tuple[Image.Image, np.ndarray]:
    """The photo and its label map, decoded once for the crops and zooms cut from them (never modified)."""
    ws = workspace()
    return ws.load_image(image_id), ws.load_mask(image_id)


def _part(image: Image.Image, labels: np.ndarray, box: tuple[int, int, int, int], width: int, height: int,
          outline: bool) -> bytes:
    """JPEG of the part ``box`` of a photo enlarged (or shrunk) into a width×height frame, the wounds'
    contours drawn at the frame's scale (a line of a few screen pixels however far it is enlarged)."""
    part = ImageOps.contain(image.crop(box), (width, height), Image.Resampling.BICUBIC)
    if outline:
        cut = Image.fromarray(np.ascontiguousarray(labels[box[1]:box[3], box[0]:box[2]], dtype=np.int32))
        part = outline_overlay(part, np.asarray(cut.resize(part.size, Image.Resampling.NEAREST)), border=False)
    return _frame(part, width, height, "JPEG")


@st.cache_data(show_spinner=False, max_entries=512)
def _wound_view(root: str, image_id: str, width: int, height: int, crop: bool, outline: bool,
                digest: str) -> tuple[bytes, int]:
    image, labels = _decoded(root, image_id, digest)
    box = session.wound_crop_box(labels, width / height) if crop else None
    count = len(workspace().store.wounds(image_id))
    if box is not None:
        return _part(image, labels, box, width, height, outline), count
    return _frame(outline_overlay(image, labels) if outline else image, width, height, "JPEG"), count


def wound_view(ws: Workspace, image_id: str, width: int, height: int, crop: bool = True,
               outline: bool = True) -> tuple[bytes, int]:
    """(JPEG bytes, number of wounds) of a photo letterboxed into width×height: cropped around its
    outlined wounds (``crop``; the whole photo when none is outlined) and enlarged, so a small wound
    fills about half the picture, their contours drawn (``outline``). Cached by content hash; JPEG
    keeps the bytes sent per question small."""
    return _wound_view(str(ws.root), image_id, width, height, crop, outline, _digest(ws, image_id))


@st.cache_data(show_spinner=False, max_entries=256)
def _zoom_view(root: str, image_id: str, magnification: float, centre: tuple[float, float] | None, width: int,
               height: int, outline: bool, digest: str) -> tuple[bytes, tuple[int, int, int, int]]:
    image, labels = _decoded(root, image_id, digest)
    box = session.zoom_box(image.size, session.wounds_box(labels), magnification, width / height, centre)
    return _part(image, labels, box, width, height, outline), box


def zoom_view(ws: Workspace, image_id: str, magnification: float, centre: tuple[float, float] | None = None,
              width: int = 1280, height: int = 960, outline: bool = True) -> tuple[bytes, tuple[int, int, int, int]]:
    """(JPEG bytes, box shown) of a zoom into a photo (:func:`annotations.accounts.session.zoom_box`: its wounds'
    box at ``magnification`` 1, 2× / 4× closer, the whole photo at 0; around ``centre``, default the
    wounds), enlarged into a width×height frame, contours drawn (``outline``). Cut server-side from the
    photo decoded once; cached by content hash."""
    return _zoom_view(str(ws.root), image_id, magnification, centre, width, height, outline, _digest(ws, image_id))


def data_uri(png: bytes) -> str:
    """A PNG as a ``data:`` URI."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def status_badge(status: str) -> str:
    """Plain-text run status (no emoji: clinical workstations often lack emoji fonts)."""
    return {"running": "● running", "done": "✓ done", "failed": "✗ failed", "stopped": "■ stopped",
            "interrupted": "⚠ interrupted"}.get(status, status)


def category_colours(values: list[str], limit: int = 24) -> tuple[list[str], dict[str, str]]:
    """Map categories to ``limit`` distinct colours (plotly's Dark24): up to ``limit`` categories each
    get their own; beyond that the ``limit - 1`` most frequent keep theirs and the rest become
    ``other`` (grey). Returns the (possibly grouped) values and {category: colour}, legend order."""
    from collections import Counter

    import plotly.express as px

    counts = Counter(values)
    if len(counts) > limit:
        keep = {v for v, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:limit - 1]}
        values = [v if v in keep else "other" for v in values]
    names = sorted(set(values) - {"other"})
    colours = {name: px.colors.qualitative.Dark24[n] for n, name in enumerate(names)}
    if "other" in values:
        colours["other"] = "#9e9e9e"
    return values, colours


_BACKGROUND: set[str] = set()
_BACKGROUND_LOCK = threading.Lock()


def in_background(key: str, fn, *args) -> None:
    """Run ``fn(*args)`` in a daemon thread unless a task with ``key`` is already running in this
    server process (e.g. one UMAP per run, however many browsers ask for it)."""
    with _BACKGROUND_LOCK:
        if key in _BACKGROUND:
            return
        _BACKGROUND.add(key)

    def work() -> None:
        try:
            fn(*args)
        finally:
            with _BACKGROUND_LOCK:
                _BACKGROUND.discard(key)

    threading.Thread(target=work, name=f"triderm-{key}", daemon=True).start()


# -- background jobs ------------------------------------------------------------------------------
def module_available(module: str) -> bool:
    """Whether ``core.<module>`` exists (other parts of the product may land later)."""
    import importlib.util

    try:
        return importlib.util.find_spec(f"core.{module}") is not None
    except (ImportError, ValueError):
        return False


#: the extras a job's extra builds on (``triderm-studio[llm]`` installs ``[ml]`` too)
EXTRA_NEEDS = {"ml": ("ml",), "llm": ("ml", "llm")}


def missing_extra(extra: str) -> str | None:
    """``pip install "triderm-studio[EXTRA]"`` when a module of ``extra`` (:data:`triderm.EXTRA_OF`, with the
    extras it builds on) is not installed on this server (an ``[app]``-only one), else None."""
    import importlib.util

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


def readable_log(log: str) -> tuple[str, str | None]:
    """A job log's tail without its Python traceback, and the failure as one sentence (the exception's last
    line, with the extra to install when it is a missing module of one); (the log, None) when it has none."""
    lines = log.splitlines()
    start = next((n for n, line in enumerate(lines) if line.startswith(("Traceback (most recent call last)",
                                                                          '  File "'))), None)
    if start is None:
        return log, None
    last = next((line.strip() for line in reversed(lines[start:]) if line.strip() and not line.startswith(" ")),
                "")
    missing = re.match(r"(?:ModuleNotFoundError|ImportError): No module named '([\w.]+)'", last)
    hint = install_hint(missing.group(1)) if missing else None
    why = (f"this server lacks the module {missing.group(1)}; install its extra: {hint}" if hint else last
           or "it ended with an error")
    return "\n".join(lines[:start]), f"The job failed: {why}."


def job_panel(ws: Workspace, name: str, module: str, args: list[str], label: str, start: bool = True,
              blocked: str | None = None) -> dict | None:
    """Start / stop / resume controls, status, progress and log tail of one background job
    (``start=False``: the page starts it itself, e.g. from a form's submit button; ``blocked``: why it cannot
    start here, e.g. the install hint of a missing extra: Start and Resume stay, disabled, saying so)."""
    from annotations.infra import jobs

    if not module_available(module):
        st.info(f"`python -m core.{module}` is not available in this installation yet — "
                "this job cannot be started here.", icon="🚧")
        return None
    record = jobs.job(ws, name)
    alive = bool(record and record["alive"])
    c1, c2, c3 = st.columns([1, 1, 4])
    if start and c1.button(f"Start {label}", key=f"start_{name}", type="primary", disabled=alive or bool(blocked),
                           help=blocked):
        try:
            jobs.start_job(ws, name, module, args)
        except ValueError as err:
            st.error(escape_md(str(err)))
        st.rerun()
    if alive:
        if c2.button("Stop", key=f"stop_{name}"):
            jobs.stop_job(ws, name)
            st.rerun()
    elif record is not None and c2.button("Resume", key=f"resume_{name}", disabled=bool(blocked),
                                          help=blocked or "Relaunch the same command; it continues from its cache"):
        jobs.resume_job(ws, name)
        st.rerun()
    if record is not None:
        run = record.get("run")
        state = "running" if alive else (run["status"] if run else "exited")
        if not alive and run is not None and run["status"] == "running":
            state = "exited without finishing (resume to continue)"
        c3.markdown(f"{escape_md(status_badge(state))} · pid {record['pid']} · {escape_md(' '.join(record['cmd'][2:]))}")
        if run is not None:
            st.progress(min(1.0, float(run["progress"] or 0)),
                        text=f"run {run['id']} ({escape_md(run['kind'])}): {escape_md(run['message'] or run['status'])}")
        log, failure = readable_log(jobs.tail_log(ws, name, 12))
        if failure:
            st.error(escape_md(failure))
        if log:
            st.code(log, language=None)
    return record


def any_job_running(ws: Workspace) -> bool:
    """Whether any job of the workspace is still running."""
    from annotations.infra import jobs

    return any(j["alive"] for j in jobs.jobs(ws))


# -- the Report page's cells and rows (plain functions, no Streamlit) -------------------------------------------
REPORT_METRICS = {"balanced": "Balanced %", "micro": "Micro %", "macro_f1": "Macro-F1 %", "kappa": "κ"}


def metric_text(value: float | None, metric: str) -> str:
    """An agreement figure as the report shows it: κ to 3 decimals, the others in % to 1; "–" when missing."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:.3f}" if metric == "kappa" else f"{100 * value:.1f}"


def metric_cell(row: Mapping, metric: str) -> str:
    """A report row's ``metric`` with its 95 % CI in brackets when it has one."""
    lo, hi = (row.get("ci") or {}).get(metric, (None, None))
    ci = f" [{metric_text(lo, metric)}, {metric_text(hi, metric)}]" if lo is not None else ""
    return metric_text(row.get(metric), metric) + ci


def seeds_cell(c: object, seeds: int) -> object:
    """A benchmark cell ``{"mean", "sd", "ci", "n"}`` as mean [± sd] [95% CI], saying over how many seeds
    (``seeds`` when the cell does not say); a cell without sd or ``n`` is one estimate from records pooled
    over the seeds (its table's legend says so) and gets no seed count; no interval where there is none;
    other values as they are."""
    if not isinstance(c, dict):
        return "–" if c is None else c  # no triplets in the dataset: no agreement to show
    ci = c.get("ci")
    interval = f" [{ci[0]:.1f}, {ci[1]:.1f}]" if ci and ci[0] != ci[1] else ""
    if c.get("sd") is None and "n" not in c:
        return f"{c['mean']:.1f}{interval}"
    n = c.get("n", seeds)
    if c.get("sd") is None or n < 2:
        return f"{c['mean']:.1f}{interval} (1 seed)"
    if c["sd"] == 0:
        return f"{c['mean']:.1f}{interval} (same on all {n} seeds)"
    return f"{c['mean']:.1f} ± {c['sd']:.1f}{interval} ({n} seeds)"


def agreement_rows(rows: list[dict]) -> list[dict]:
    """The agreement report's table: one row per run with each metric and its CI."""
    return [{"modality": r.get("modality"), "run": r.get("run_id"), "method": r.get("label"),
             **{label: metric_cell(r, m) for m, label in REPORT_METRICS.items()}, "triplets": r.get("n"),
             "anchors": r.get("n_anchors"), "scored on": r.get("protocol", "all triplets")} for r in rows]


def ablation_rows(rows: list[dict]) -> list[dict]:
    """An ablation table's rows: factor, setting, seeds, balanced and micro % as mean ± sd, the paper's figure."""
    def pm(r: dict, m: str) -> str:
        return f"{100 * (r.get(f'{m}_mean') or 0):.1f} ± {100 * (r.get(f'{m}_sd') or 0):.1f}"

    return [{"factor": r.get("factor"), "setting": r.get("label"), "seeds": r.get("seeds"),
             "balanced % (mean ± sd)": pm(r, "balanced"), "micro % (mean ± sd)": pm(r, "micro"),
             "paper %": r.get("paper")} for r in rows]


def benchmark_rows(summary: dict, paired: bool = False) -> list[dict]:
    """The contrastive benchmark's table: mean ± sd per variant and metric, or with ``paired`` the seed-paired
    difference from ``clip`` (``*`` where its paired t-test has p < 0.05; the majority baseline left out)."""
    if paired:
        return [{"variant": v, **{m: f"{d[0]:+.3f} ± {d[1]:.3f}{'*' if d[2] else ''}"
                                  for m, d in metrics.items() if m != "probe_majority"}}
                for v, metrics in summary.items()]
    return [{"variant": v, **{m: f"{ms[0]:.3f} ± {ms[1]:.3f}" for m, ms in metrics.items()}}
            for v, metrics in summary.items()]


_frozen_at_modules = 0


def freeze_imports() -> None:
    """Move every object alive now into the garbage collector's permanent generation when modules were imported
    since the last call. Streamlit collects the oldest generation after every run, fragments included
    (``gc.collect(2)``); scanning the ~90,000 objects of the imported libraries each time cost 50–90 ms of every
    keypress on the outline page (issue 54). Freezing after a page's first imports leaves only what the runs
    themselves create to be scanned; nothing frozen was garbage (a collection runs first). Only in a served app
    (``streamlit run`` sets ``sys.argv[0]`` to this app's script): a process that runs the pages in-process (a
    test's ``AppTest``) keeps its collector as it is."""
    global _frozen_at_modules
    if Path(sys.argv[0]).name != "app.py" or len(sys.modules) == _frozen_at_modules:
        return
    gc.collect()
    gc.freeze()
    _frozen_at_modules = len(sys.modules)
