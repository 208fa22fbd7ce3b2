"""A torch-free annotation server: the annotation pages and ``python -m annotations`` never import the
``[ml]`` extra, and a page that needs it names the extra to install (scripts/app_smoke.py, which CI
also runs in a fresh venv holding only the wheel with ``[app]``)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_annotation_pages_run_without_the_ml_extra_and_an_ml_page_names_it():
    out = subprocess.run([sys.executable, "scripts/app_smoke.py", "--block-ml"], cwd=REPO, capture_output=True,
                         text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    for page in ("Home", "pages/1_Wound_masks.py", "pages/2_Triplets.py", "pages/7_Review.py", "pages/8_Accounts.py",
                 "pages/9_Follow_up.py"):
        assert f"ok   {page}\n" in out.stdout
    assert "ok   no module of the [ml]/[llm] extras imported" in out.stdout
    assert "ok   pages/4_Train.py names the extra to install" in out.stdout


def test_annotations_help_imports_no_torch():
    code = ("import sys\nfrom annotations.__main__ import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n"
            "    pass\nprint('torch' in sys.modules, 'streamlit' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "usage: python -m annotations" in out.stdout
    assert out.stdout.rstrip().endswith("False False")


def test_the_missing_extra_guard_stays_out_of_the_way_outside_a_page():
    """Outside a Streamlit run (a job, a library probing an optional module) a missing module is just missing."""
    from app import extras

    assert extras.MissingExtra().find_spec("torch") is None
    assert extras.MissingExtra().find_spec("not_an_extra_module") is None
    assert sum(isinstance(f, extras.MissingExtra) for f in sys.meta_path) == 1


FREEZE_PROBE = """
import gc, sys, types, weakref
from pathlib import Path
from app import navigation

class Cycle:
    def __init__(self):
        self.me = self

before = gc.get_freeze_count()
navigation.freeze_imports()  # this process is not a served app.py
assert gc.get_freeze_count() == before, "froze outside a served app"
sys.argv = [str(Path("/srv/triderm/app.py"))]
garbage = Cycle()
ref = weakref.ref(garbage)
del garbage  # unreachable, held only by its own cycle
navigation.freeze_imports()
frozen = gc.get_freeze_count()
assert frozen > before and ref() is None, "garbage frozen, or nothing frozen"
alive = [[] for _ in range(100)]  # objects a page's run keeps: a second freeze would take them
navigation.freeze_imports()  # nothing imported since: nothing more frozen
assert gc.get_freeze_count() == frozen, "froze again with no new import"
sys.modules["_freeze_probe"] = types.ModuleType("_freeze_probe")  # a new import
navigation.freeze_imports()
assert gc.get_freeze_count() > frozen, "a new import was not frozen"
print("ok")
"""


def test_freeze_imports_freezes_once_per_new_import_and_never_freezes_garbage():
    """Issue 54: Streamlit's ``gc.collect(2)`` after every run scanned the imported libraries' objects each
    keypress; :func:`app.navigation.freeze_imports` moves them to the permanent generation after new imports only,
    and only in a served app (never in a process that runs the pages in-process, as the app tests do).
    In a fresh interpreter: inside the test suite another test's thread (a Streamlit or Playwright one) may
    import a module between two calls, which is a new import (CI saw 2 more objects frozen)."""
    out = subprocess.run([sys.executable, "-c", FREEZE_PROBE], cwd=REPO, capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stdout + out.stderr[-3000:]


PRELOAD_PROBE = """
import sys, threading
from pathlib import Path
from app import navigation
navigation.PRELOAD = ("_probe_missing_extra", "json.tool")  # an absent module is passed over, the next imported
navigation.preload()  # not a served app: nothing starts
assert not any(t.name == "triderm-preload" for t in threading.enumerate()) and "json.tool" not in sys.modules
sys.argv = [str(Path("/srv/triderm/app.py"))]
navigation.preload()
navigation.preload()  # once per process
threads = [t for t in threading.enumerate() if t.name == "triderm-preload"]
assert len(threads) <= 1, threads
for t in threads:
    t.join(60)
assert "json.tool" in sys.modules, "the preload did not import"
print("ok")
"""


def test_preload_imports_the_slow_page_modules_once_in_a_served_app():
    """Issue 54: a served app imports :data:`app.navigation.PRELOAD` (Explore's modules) in the background after
    sign-in, once, so a page's first visit does not wait for them; a module an [app]-only server lacks is passed
    over (its page names the extra); a process running pages in-process (the app tests) preloads nothing."""
    out = subprocess.run([sys.executable, "-c", PRELOAD_PROBE], cwd=REPO, capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stdout + out.stderr[-3000:]
