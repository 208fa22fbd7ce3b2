"""Streamlit AppTest for every page (no browser), plus the page helpers they rely on."""
from __future__ import annotations

import base64
import io
import json
import time
from collections.abc import Callable
from datetime import date
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from streamlit.testing.v1 import AppTest

from annotations.accounts import accounts, session
from annotations.followup import followup
from annotations.infra import jobs
from annotations.infra.workspace import Workspace

REPO = Path(__file__).resolve().parents[2]
APP = str(REPO / "app.py")
PAGES = {
    "masks": "pages/1_Wound_masks.py",
    "triplets": "pages/2_Triplets.py",
    "llm": "pages/3_LLM_oracle.py",
    "train": "pages/4_Train.py",
    "explore": "pages/5_Explore.py",
    "report": "pages/6_Report.py",
    "review": "pages/7_Review.py",
    "accounts": "pages/8_Accounts.py",
}
PASSWORD = "correct horse battery"


def account(name: str = "Tess", role: str = "admin") -> accounts.Account:
    """The account ``name`` of the test's workspace ($TRIDERM_WORKSPACE), created when missing."""
    store = Workspace(None).store
    return accounts.get(store, name) or accounts.add_account(store, name, role, PASSWORD, "test")


def signed_in(at: AppTest, found: accounts.Account) -> AppTest:
    """``at`` with ``found`` signed in, as the sign-in form leaves the session (account and token)."""
    ws = Workspace(None)
    at.session_state["account"] = found
    at.session_state["_cookie"] = accounts.issue_token(ws.store, accounts.secret_key(ws.root), found)
    return at


def app(name: str | None = None, annotator: str | None = "Tess", timeout: float = 60, role: str = "admin") -> AppTest:
    """The app signed in as ``annotator`` (an account with ``role``), switched to page ``name``."""
    at = AppTest.from_file(APP, default_timeout=timeout)
    if annotator:
        signed_in(at, account(annotator, role))
    at.run()
    if name:
        at.switch_page(PAGES[name]).run()
    assert not at.exception, at.exception
    return at


def texts(at: AppTest) -> str:
    """Every text the page shows: markdown, captions, alerts, headings and progress-bar texts."""
    parts = [e.value for kind in ("markdown", "caption", "info", "success", "warning", "error", "title",
                                  "subheader", "header") for e in getattr(at, kind)]
    return "\n".join([*(str(p) for p in parts), *(p.proto.text for p in at.get("progress"))])


def add_test_embedding(ws: Workspace, with_attention: bool = False) -> int:
    """A TEST-ONLY vision run with random image/wound embeddings (and, optionally, attention extras)."""
    from core.runtime import save_embeddings

    ids = [im["image_id"] for im in ws.store.images()]
    keys = [(w["image_id"], w["wound_index"]) for w in ws.store.wounds()]
    rng = np.random.default_rng(1)
    run_id = ws.store.start_run("vision-baseline", {"modality": "vision", "test_only": True}, name="TEST-ONLY")
    wound_emb = rng.normal(size=(len(keys), 6))
    image_emb = np.stack([wound_emb[[n for n, k in enumerate(keys) if k[0] == i]].mean(0) for i in ids])
    extra = {}
    if with_attention:  # one token per wound at grid cell (row, col) = (1, 2) of a 4×4 grid, weight 1
        extra = {"token_wound": np.arange(len(keys)), "token_pos": np.tile([1, 2], (len(keys), 1)),
                 "token_weight": np.ones(len(keys), dtype=np.float32), "grid": np.array([4, 4])}
    save_embeddings(ws, run_id, ids, image_emb=image_emb, wound_keys=keys, wound_emb=wound_emb, **extra)
    ws.store.finish_run(run_id)
    return run_id


# -- home and the gate --------------------------------------------------------------------------
def sign_in(at: AppTest, name: str, password: str) -> AppTest:
    at.text_input[0].input(name)
    at.text_input[1].input(password)
    return at.button[0].click().run()


def test_home_sign_in_and_overview(ws):
    account("Dr Who", "annotator")
    at = app(annotator=None)
    assert "Sign in" in texts(at) and not at.metric
    sign_in(at, "  dr WHO ", PASSWORD)  # names ignore case and extra spaces
    assert at.session_state["account"].name == "Dr Who"
    assert "Dr Who" in ws.store.annotators()
    assert "Signed in as" in texts(at)
    assert {m.label: m.value for m in at.metric}["Photos"] == "53"
    assert "SYNTHETIC DATA" in texts(at)
    assert "Build demo" not in [b.label for b in at.button]  # annotators do not import or build the demo


def test_home_and_train_show_why_a_run_failed(ws):
    """A job's failure reason (annotations.store.runs.recording) is in the Home page's latest runs and, for a run
    that reported losses, in the Train page's loss table."""
    from annotations.store import runs

    reason = "FloatingPointError: non-finite training loss: [nan]"
    with (pytest.raises(FloatingPointError),
          runs.recording(ws, runs.VISION_FINETUNE, {"modality": "vision"}) as rec):
        ws.store.update_run(rec.id, progress=0.5, metrics={"loss": [3.0, 2.5]})
        raise FloatingPointError("non-finite training loss: [nan]")
    for page in (None, "train"):
        table = next(d.value for d in app(page, timeout=180).dataframe if "message" in d.value.columns)
        row = table[table["run"] == rec.id].iloc[0]
        assert "failed" in row["status"] and row["message"] == reason, page


def test_wrong_password_then_lock_out(ws):
    account("Dr Who", "annotator")
    at = app(annotator=None)
    sign_in(at, "Nobody", PASSWORD)
    assert any("Unknown account or wrong password" in e.value for e in at.error)
    for n in range(accounts.MAX_FAILED):
        sign_in(at, "Dr Who", "wrong password")
        assert [e.value for e in at.error] == [accounts.REFUSED]  # one answer: no name is revealed
    sign_in(at, "Dr Who", PASSWORD)  # the right password is refused while locked
    assert [e.value for e in at.error] == [accounts.REFUSED] and "account" not in at.session_state
    assert next(r for r in accounts.list_accounts(ws.store) if r["name"] == "Dr Who")["locked_until"]


def test_an_empty_session_key_stops_the_app_with_the_reason(ws):
    (ws.root / ".session_key").write_text("")  # left by a crash or a full disk at first use
    at = app(annotator=None)
    assert any("cannot start" in e.value and "Delete the file" in e.value for e in at.error)
    assert not at.text_input  # no sign-in form: nothing is signed with an empty key


def test_sign_out_revokes_the_session_everywhere(ws):
    account("Dr Who", "admin")
    here = sign_in(app(annotator=None), "Dr Who", PASSWORD)
    token = here.session_state["_cookie"]  # what a thief could copy from this browser
    elsewhere = app("accounts", annotator="Dr Who")  # the same account in another browser
    assert elsewhere.session_state["account"].name == "Dr Who"
    here.button(key="_signout").click().run()
    assert "account" not in here.session_state
    with pytest.raises(accounts.AuthError, match="no longer valid"):
        accounts.account_from_token(ws.store, accounts.secret_key(ws.root), token)
    elsewhere.run()  # the page's address now shows the sign-in, with the reason
    assert "account" not in elsewhere.session_state and not elsewhere.dataframe and elsewhere.text_input
    assert any("no longer valid" in e.value for e in [*elsewhere.error, *elsewhere.warning])


def test_signed_out_every_page_address_holds_the_sign_in_and_after_sign_in_the_page(ws):
    """A deep link: signed out, each page's address is routed to the sign-in (no "Page not found", no page
    script); signing in reruns that address, which then holds the page file. (AppTest runs a ``pages/``
    file directly on switch_page, so the router's registry is checked here; the browser test
    tests/browser/test_browser_accounts.py follows a deep link end to end.)"""
    account("Dr Who", "annotator")
    at = AppTest.from_file(APP, default_timeout=60).run()
    assert not at.exception and at.text_input and not at.metric  # the sign-in form
    signed_out = {info["url_pathname"]: (h, info["script_path"]) for h, info in at._registered_pages.items()}
    addresses = {Path(p).stem.split("_", 1)[1] for p in PAGES.values()}  # Streamlit's address of pages/N_Name.py
    assert addresses <= set(signed_out)
    assert all(signed_out[a][1] == "" for a in addresses)  # the sign-in, a callable: no page file runs
    sign_in(at, "Dr Who", PASSWORD)
    signed_in = {info["url_pathname"]: (h, info["script_path"]) for h, info in at._registered_pages.items()}
    for name, path in PAGES.items():
        address = Path(path).stem.split("_", 1)[1]
        assert signed_in[address] == (signed_out[address][0], str(REPO / path)), name  # the same hash: the page


def test_every_page_needs_an_account_and_the_right_role(ws):
    at = AppTest.from_file(APP, default_timeout=60).run()
    assert not at.metric and "Workspace" not in texts(at)
    for path in PAGES.values():  # even a page script run directly stops at the gate
        page = AppTest.from_file(str(REPO / path), default_timeout=60).run()
        assert any("Sign in" in e.value for e in page.error), path
        assert not page.dataframe and not page.metric and not page.button, path
    closed = {"annotator": ["llm", "train", "explore", "report", "review", "accounts"],
              "viewer": ["masks", "triplets", "llm", "train", "review", "accounts"],
              "researcher": ["masks", "triplets", "review", "accounts"]}
    for role, names in closed.items():
        for name in names:
            at = app(name, annotator=f"Dr {role}", role=role)
            assert any("is only for" in e.value and f"({role})" in e.value for e in at.error), (role, name)
            assert not at.dataframe and not at.get("plotly_chart") and not at.get("vega_lite_chart"), (role, name)


# -- annotation pages -----------------------------------------------------------------------------
def test_wound_masks_page_edits_and_deletes(ws):
    at = app("masks")
    photo = ws.store.images()[0]["image_id"]
    wounds = ws.store.wounds(photo)
    assert len(at.text_area) == len(wounds)
    at.text_area[0].input("New description <b>not html</b>").run()
    at.text_input(key=f"meta_anatomical_site_{photo}_{wounds[0]['wound_index']}").input("left shin").run()
    saved = ws.store.wounds(photo)[0]
    assert saved["description"] == "New description <b>not html</b>"
    assert saved["metadata"]["anatomical_site"] == "left shin"
    index = wounds[0]["wound_index"]
    at.button(key=f"del_{photo}_{index}").click().run()
    at.button(key="mask_del_yes").click().run()  # a deletion is confirmed first
    assert index not in {w["wound_index"] for w in ws.store.wounds(photo)}
    assert not (ws.load_mask(photo) == index).any()


def test_wound_masks_editor_gets_a_jpeg_photo_and_the_stored_outlines_after_each_change(ws, monkeypatch):
    """The editor's photo is a JPEG of the photo's size (issue 54: a fraction of a PNG's bytes); its outlines are
    cached per photo (and prepared for the worklist's next photo) yet follow a deletion and its undo."""
    import components.outline_editor as editor

    drawn: list[dict] = []

    def record(**kwargs) -> None:
        drawn.append(kwargs)

    def wound_outlines() -> dict:
        return {s["index"]: json.loads(json.dumps(s["polys"])) for s in drawn[-1]["shapes"] if s["kind"] == "wound"}

    monkeypatch.setattr(editor, "outline_editor", record)
    at = app("masks")
    photo = ws.store.images()[0]["image_id"]
    row = ws.store.image(photo)
    head, data = drawn[-1]["image"].split(",", 1)
    assert head == "data:image/jpeg;base64"
    with Image.open(io.BytesIO(base64.b64decode(data))) as sent:
        assert (sent.format, sent.size) == ("JPEG", (row["width"], row["height"])) == ("JPEG", drawn[-1]["size"])
    stored = json.loads(json.dumps(session.label_polygons(ws.load_mask(photo))))
    assert wound_outlines() == {int(i): p for i, p in stored.items()} and stored
    at.button(key="mask_next").click().run()
    assert drawn[-1]["image_key"] != drawn[0]["image_key"]
    at.button(key="mask_prev").click().run()  # back on a photo whose outlines are cached
    index = min(wound_outlines())
    at.button(key=f"del_{photo}_{index}").click().run()
    at.button(key="mask_del_yes").click().run()
    assert index not in wound_outlines() and set(wound_outlines()) == {w["wound_index"] for w in ws.store.wounds(photo)}
    at.button(key="mask_undo_btn").click().run()
    assert wound_outlines() == {int(i): p for i, p in stored.items()}


def test_wound_masks_without_a_trained_model_suggest_from_the_default_one(ws):
    at = app("masks", annotator="Ann", role="annotator")
    assert at.radio(key="mask_click_engine").options[0] == "Wound model"
    next(b for b in at.button if b.label == "Suggest outlines").click().run()
    assert not at.error
    assert any("the default wound model (no training on this workspace yet)" in m.value.lower()
               for m in [*at.success, *at.info, *at.markdown, *at.caption])
    photo = ws.store.images()[0]["image_id"]
    index = ws.store.wounds(photo)[0]["wound_index"]
    at.text_input(key=f"meta_duration_weeks_{photo}_{index}").input("6").run()  # every wound has the field
    assert next(w for w in ws.store.wounds(photo) if w["wound_index"] == index)["metadata"]["duration_weeks"] == 6


def test_add_wound_from_outline(ws):
    photo = ws.store.images()[1]["image_id"]
    h, w = ws.load_mask(photo).shape
    before = {x["wound_index"] for x in ws.store.wounds(photo)}
    region = session.rasterise_outlines([[(20.5, 20.5), (80.5, 20.5), (80.5, 60.5), (20.5, 60.5)]], (h, w))
    labels = ws.load_mask(photo)
    free = region & (labels == 0)
    index = session.add_wound(ws, photo, region, description="drawn")
    assert index == max(before, default=0) + 1
    wound = next(x for x in ws.store.wounds(photo) if x["wound_index"] == index)
    assert wound["area"] == int(free.sum()) == int((ws.load_mask(photo) == index).sum())
    assert wound["description"] == "drawn" and wound["bbox"][0] >= 20 and wound["bbox"][2] <= 81


def test_triplets_page_answer_undo_and_reliability(ws):
    at = app("triplets")
    source = "expert:Tess"
    assert len(ws.store.triplets(source=source)) == 0
    at.button(key="btn_left").click().run()
    at.button(key="btn_skip").click().run()
    rows = ws.store.triplets(source=source)
    assert [r["choice"] for r in rows] == ["j", "skip"] and all(r["latency_ms"] >= 0 for r in rows)
    (bar,) = at.get("progress")  # AppTest.progress only exists in newer Streamlit
    assert bar.proto.text == "Tess: 2 of 100 triplets (0 planned repeats, 1 skipped)" and bar.proto.value == 2
    at.button(key="btn_undo").click().run()
    assert [r["choice"] for r in ws.store.triplets(source=source)] == ["j"]
    (bar,) = at.get("progress")  # AppTest.progress only exists in newer Streamlit
    assert bar.proto.text == "Tess: 1 of 100 triplets (0 planned repeats, 0 skipped)" and bar.proto.value == 1
    assert "Cohen" not in texts(at) and "consistency" not in texts(at).lower()  # annotators never see agreement
    changes = [(r["action"], r["actor"]) for r in ws.store.revisions("triplets") if r["actor"] != "import"]
    assert changes == [("insert", "Tess"), ("insert", "Tess"), ("delete", "Tess")]


def test_triplets_undo_survives_a_reload_and_the_view_keys_switch_crop_and_outlines(ws):
    at = app("triplets")
    asked = at.session_state["question"]
    at.button(key="btn_right").click().run()
    reloaded = app("triplets")  # a new browser session: nothing of the old one's state
    assert not reloaded.button(key="btn_undo").disabled
    reloaded.button(key="btn_undo").click().run()
    assert ws.store.triplets(source="expert:Tess") == []
    back = reloaded.session_state["question"]  # the undone triplet is asked again
    assert (back.anchor, back.ref_j, back.ref_k) == (asked.anchor, asked.ref_j, asked.ref_k)
    assert reloaded.button(key="btn_undo").disabled
    assert "cropped around the outlined wounds" in texts(reloaded)
    reloaded.button(key="btn_whole").click().run()
    assert "Shown: the whole photo" in texts(reloaded) and reloaded.button(key="btn_whole").label == "Wound crop"
    reloaded.button(key="btn_outline").click().run()
    assert reloaded.button(key="btn_outline").label == "Outlines on" and not reloaded.session_state["outlines"]


def test_wound_crop_box_holds_every_wound_at_the_frame_aspect():
    labels = np.zeros((300, 400), dtype=np.int32)
    assert session.wound_crop_box(labels) is None
    labels[100:120, 50:70] = 1
    labels[140:150, 110:130] = 2
    left, top, right, bottom = session.wound_crop_box(labels)
    assert (left, top) <= (50, 100) and right >= 130 and bottom >= 150  # both wounds inside
    assert abs((right - left) / (bottom - top) - 4 / 3) < 0.02 and right - left < 200  # far smaller than the photo
    assert left >= 0 and top >= 0 and right <= 400 and bottom <= 300
    labels[:, 10:390] = 3  # a wound as tall as the photo: the whole photo
    assert session.wound_crop_box(labels) == (0, 0, 400, 300)


def test_two_windows_answering_the_same_triplet_store_it_once(ws):
    first, second = app("triplets", role="annotator"), app("triplets", role="annotator")
    second.session_state["question"] = first.session_state["question"]  # both windows hold one question
    second.run()
    first.button(key="btn_left").click().run()
    second.button(key="btn_right").click().run()
    assert [r["choice"] for r in ws.store.triplets(source="expert:Tess")] == ["j"]
    assert any("already answered under your account" in w.value for w in second.warning)
    assert second.session_state["question"] != first.session_state["question"]  # moved on to another one


def test_review_excludes_an_annotator_from_every_metric(ws):
    for n, row in enumerate(ws.store.expert_triplets()[:6]):  # a practice account answering like the expert
        ws.store.add_triplet(row["anchor"], row["ref_j"], row["ref_k"], row["choice"] if n % 2 else "k",
                             "expert:Practice")
    before = len(ws.store.expert_triplets())
    at = app("review")
    assert "Practice" in at.dataframe[0].value["annotator"].tolist()
    at.selectbox(key="review_who").select("Practice").run()
    at.text_input(key="review_reason").input("practice account").run()
    at.button(key="review_exclude").click().run()
    assert len(ws.store.expert_triplets()) == before - 6  # left out of every metric ...
    assert len(ws.store.expert_triplets(include_excluded=True)) == before  # ... and kept
    assert ws.store.revisions("exclusions")[-1]["actor"] == "Tess"
    table = at.dataframe[0].value.set_index("annotator")
    assert not table.loc["Practice", "in evaluation"]
    audit = next(d.value for d in at.dataframe if "new" in d.value.columns)  # the audit trail, human-readable
    cells = [str(v) for v in [*audit["old"], *audit["new"], *audit["row"]]]
    assert not [c for c in cells if c.startswith(("{", "[", "(")) or c == "None"], cells[:5]


# -- model pages -----------------------------------------------------------------------------------
def test_llm_page(ws):
    at = app("llm")
    body = texts(at)
    if jobs_available("llm_triplets"):
        assert any(b.label.startswith("Start LLM run") for b in at.button)
    else:
        assert "not available in this installation yet" in body
    assert "LLM triplets in the store" in body
    models = {t.label: t.value for t in at.text_input}
    assert models["Model"] == "smollm2-135m-instruct" and "gpt-oss:120b" not in models.values()  # local chosen
    at.selectbox[0].select("ollama").run()
    assert {t.label: t.value for t in at.text_input}["Model (ollama)"] == "gpt-oss:120b"


def test_llm_page_without_the_llm_extra_keeps_its_controls_disabled_and_a_dead_job_shows_no_traceback(ws, monkeypatch):
    """Issue 54: on a server without the [llm] extra (simulated: a module of the extra that is not installed) the
    page's controls stay, disabled, naming the extra; a job that died shows one sentence, not a traceback."""
    import triderm

    monkeypatch.setitem(triderm.EXTRA_OF, "triderm_test_absent_module", "llm")  # what find_spec cannot find
    log = jobs.jobs_dir(ws) / "llm-triplets.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("loading the oracle\nTraceback (most recent call last):\n  File \"/srv/core/text/llm.py\", "
                   "line 1, in <module>\n    import torch\nModuleNotFoundError: No module named 'torch'\n")
    (jobs.jobs_dir(ws) / "llm-triplets.json").write_text(json.dumps({
        "name": "llm-triplets", "module": "llm_triplets", "args": [], "pid": 2 ** 22 + 7, "create_time": 0.0,
        "host": jobs.hostname(), "started": time.time(), "cmd": ["python", "-m", "core.llm_triplets"],
        "log": str(log)}))
    at = app("llm")
    warned = " ".join(w.value for w in at.warning)
    assert 'pip install "triderm-studio[llm]"' in warned
    start = next(b for b in at.button if b.label == "Start LLM run")
    assert start.disabled and 'pip install "triderm-studio[llm]"' in start.help
    assert next(s for s in at.selectbox if s.label == "Oracle").disabled
    assert next(t for t in at.text_input if t.label == "Budget").disabled
    shown = texts(at) + " ".join(c.value for c in at.code)
    assert "Traceback" not in shown and 'File "' not in shown
    failed = " ".join(e.value for e in at.error).replace("\\", "")
    assert "The job failed: this server lacks the module torch" in failed and "triderm-studio[ml]" in failed


def jobs_available(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(f"core.{module}") is not None


def test_train_page_shows_loss_curves(ws):
    run_id = ws.store.start_run("vision-triderm", {"modality": "vision"})
    ws.store.update_run(run_id, progress=0.5, metrics={"loss": [3.0, 2.0, 1.5]})
    at = app("train")
    assert "Loss curves" in texts(at)
    assert len(at.get("plotly_chart")) == 1
    labels = [b.label for b in at.button]
    assert {"Start training", "Start evaluation", "Start benchmark"} <= set(labels)


def test_train_page_advises_outlining_more_photos_before_retraining_the_segmenter(ws, monkeypatch):
    from app import jobs
    if not jobs.module_available("train_segmenter"):
        pytest.skip("the segmenter's tab needs the [ml] extra")
    outlined = ws.store.counts()["images_with_wounds"]
    assert "outlined photos. On other clinics'" not in texts(app("train"))  # the demo has enough
    monkeypatch.setattr("app.train.ADVISED_OUTLINES", outlined + 1)
    assert f"This workspace has {outlined} outlined photos." in texts(app("train"))


def test_train_page_retrains_the_segmenter_with_the_parts_chosen(ws):
    """Issue 48: the segmenter tab starts ``core.train_segmenter`` with ``--tune`` as chosen (the head by default,
    every trained part on request); its choices are the job's."""
    from annotations.infra import jobs as records
    from app import jobs
    from app.train import TUNE_LABELS
    from core.segmentation.defaults import FINE_TUNE, TUNED_PARTS

    if not jobs.module_available("train_segmenter"):
        pytest.skip("the segmenter's tab needs the [ml] extra")
    assert set(TUNE_LABELS) == set(TUNED_PARTS) and next(iter(TUNE_LABELS)) == FINE_TUNE
    at = app("train")
    radio = next(r for r in at.radio if r.label == "What retraining changes")
    assert radio.value == FINE_TUNE
    radio.set_value("all").run()
    next(b for b in at.button if b.label == "Start segmenter retraining").click().run()
    assert not at.exception, at.exception
    record = records.job(ws, "train-segmenter")
    try:
        assert record["module"] == "train_segmenter" and record["args"] == ["--tune", "all"]
    finally:
        records.stop_job(ws, "train-segmenter")


def test_train_page_embeds_with_a_shared_model_named_by_folder_or_hub(ws, tmp_path):
    """Issue 33 §4: the app loads an exported model by folder or hf-hub name (``core.embed --model``)."""
    from annotations.infra import jobs

    at = app("train")
    assert "Start embedding with the shared model" not in [b.label for b in at.button]  # nothing named yet
    folder = tmp_path / "no-such-model"
    at.text_input(key="shared_model").input(f" {folder} ").run()
    assert not at.exception, at.exception
    next(b for b in at.button if b.label == "Start embedding with the shared model").click().run()
    record = jobs.job(ws, "embed-shared-model")
    assert record["module"] == "embed" and record["args"][-2:] == ["--model", str(folder)]
    jobs.stop_job(ws, "embed-shared-model")


def test_train_page_starts_the_vision_job_in_the_mode_chosen(ws):
    """Issue 30 §5: the vision job's default is ``--mode auto``, which the job resolves by its own rule (the
    page sends none of the options, which the job would check against the mode it chooses); a mode chosen on the
    page is the job's, sent with only the options that mode reads."""
    from annotations.infra import jobs
    from core.vision.triderm_config import MODE_OPTIONS, FineTuneConfig

    at = app("train")
    mode = next(r for r in at.radio if r.label == "Mode")
    assert mode.value == "auto" and list(mode.options) == ["auto", "frozen", "self-supervised", "supervised",
                                                           "fine-tune"]
    for choice, cv in (("auto", []), ("frozen", []), ("supervised", ["--cv", "2"]), ("fine-tune", ["--cv", "2"])):
        next(r for r in at.radio if r.label == "Mode").set_value(choice).run()
        next(b for b in at.button if b.label == "Start training").click().run()
        assert not at.exception, at.exception
        args = jobs.job(ws, "train-triderm")["args"]
        assert args[args.index("--mode") + 1] == choice and (args[-2:] == cv if cv else "--cv" not in args)
        # issue 51: only the options the mode reads, each at that mode's own default unless changed
        sent = dict(zip(args[args.index("--mode") + 2::2], args[args.index("--mode") + 3::2]))
        assert {k[2:].replace("-", "_") for k in sent} <= MODE_OPTIONS[choice], (choice, sent)
        if choice == "fine-tune":
            assert (float(sent["--lr"]), int(sent["--steps"])) == (FineTuneConfig().lr, FineTuneConfig().steps)
        assert bool(sent) == (choice != "auto")  # auto: nothing, the mode it chooses trains with its defaults
        jobs.stop_job(ws, "train-triderm")


def test_train_page_describes_each_mode_in_the_jobs_own_words(ws):
    """Issue 54: the page's text for a mode is the job's own description (core.vision.recipe.MODES), so what the
    page says ``auto`` does is what ``python -m core.train_triderm --mode auto`` does."""
    from core.vision.recipe import MODES

    at = app("train")
    for mode in ("auto", "fine-tune", "frozen"):
        next(r for r in at.radio if r.label == "Mode").set_value(mode).run()
        assert f"{mode}: {MODES[mode]}." in texts(at).replace("\\", "").replace("**", "")
    assert "metric heads learnt from the expert's triplets when the workspace has them" not in texts(at)


def test_train_page_without_the_ml_extra_keeps_its_controls_disabled_naming_it(ws, monkeypatch):
    """Issue 54: on a server without the [ml] extra (simulated: a module of the extra that is not installed) every
    training control stays in place, disabled, and the page names the extra to install."""
    import triderm

    monkeypatch.setitem(triderm.EXTRA_OF, "triderm_test_absent_module", "ml")
    at = app("train")
    assert 'pip install "triderm-studio[ml]"' in " ".join(e.value for e in at.error)
    assert next(r for r in at.radio if r.label == "Mode").disabled
    starts = [b for b in at.button if b.label.startswith("Start ")]
    assert {"Start training", "Start evaluation", "Start benchmark"} <= {b.label for b in starts}
    assert all(b.disabled and 'triderm-studio[ml]' in b.help for b in starts)


def test_report_page_empty_then_filled(ws):
    at = app("report")
    assert "No evaluation report yet" in texts(at)
    from core.eval.report import run_report

    add_test_embedding(ws)
    run_report(ws, n_boot=20)
    at = app("report")
    assert len(at.dataframe) >= 1
    assert {b.label for b in at.get("download_button")} >= {"Download report.csv", "Download report.md"}


def test_report_page_states_the_verdict_first_on_common_triplets(ws):
    """Issue 54: the workspace's result first, in words, with the two runs on the same held-out triplets, the next
    step, and bars on an axis from 0 % beside chance (TEST-ONLY runs)."""
    from core.eval.report import run_report
    from core.runtime import save_embeddings

    base = add_test_embedding(ws)
    ids = [im["image_id"] for im in ws.store.images()]
    expert = [t for t in ws.store.expert_triplets() if t["choice"] in ("j", "k")]
    strict = [[t["anchor"], *((t["ref_j"], t["ref_k"]) if t["choice"] == "j" else (t["ref_k"], t["ref_j"])), 1, 1]
              for t in expert[::3]]
    trained = ws.store.start_run("vision-finetune", {"modality": "vision", "supervise": "triplets",
                                                     "test_only": True}, name="TEST-ONLY")
    save_embeddings(ws, trained, ids, image_emb=np.random.default_rng(2).normal(size=(len(ids), 4)))
    ws.store.finish_run(trained, metrics={"cv": {"protocol": "strict", "balanced": 1.0, "ci": [1.0, 1.0],
                                                 "n": len(strict), "n_anchors": 1, "per_triplet": strict}})
    found = run_report(ws, n_boot=50)["verdict"]
    at = app("report")
    subheaders = [h.value for h in at.subheader]
    assert subheaders[0] == "Verdict" and subheaders.index("Verdict") < subheaders.index(
        "Agreement with the expert's triplets")
    body = texts(at).replace("\\", "")  # unescaped Markdown
    assert f"The trained embedding (run #{trained}, vision-finetune) agrees with the expert" in body
    assert f"the untrained one (run #{base}, vision-baseline)" in body and f"on these {found['n']} triplets" in body
    assert "Next step:" in body and f"Both runs on the same {found['n']} held-out triplets" in body
    for chart in at.get("plotly_chart"):
        spec = json.loads(chart.proto.spec)
        assert spec["layout"]["xaxis"]["range"] == [0, 100]
        assert any(s.get("x0") == 50 for s in spec["layout"]["shapes"])


def shown_value(element):
    """An element's value, or None (no value, or a widget the floor Streamlit's AppTest keeps no state for)."""
    try:
        return getattr(element, "value", None)
    except KeyError:
        return None


def test_report_page_shows_the_real_vision_benchmark_and_learning_curve(ws, tmp_path, monkeypatch):
    assert "No real-data vision benchmark yet" in texts(app("report"))
    monkeypatch.setenv("TRIDERM_RESULTS_DIR", str(tmp_path))
    cell = {"mean": 61.9, "sd": 0.4, "ci": [60.9, 62.9]}  # TEST-ONLY numbers: the page shows what the file says
    (tmp_path / "real_vision.json").write_text(json.dumps({
        "title": "Real wounds: TEST", "seeds": [0, 1, 2], "date": "2026-11-23T00:00:00", "command": "python -m x",
        "tables": [{"caption": "agreement", "columns": ["row", "balanced %", "seconds / seed", "peak RSS MB"],
                    "rows": [["frozen TEST row", cell, 1.0, 100],
                             ["a long TEST row label that must not be cut: deterministic", {**cell, "sd": 0.0,
                              "ci": [61.9, 61.9]}, 1.0, 100],
                             ["one-seed TEST row", {"mean": 72.5, "sd": None, "ci": None, "n": 1}, 1.0, 100]]},
                   {"caption": "curve", "columns": ["method", "training triplets", "balanced %"],
                    "rows": [["linear metric", 50, cell], ["linear metric", 500, {**cell, "mean": 70.0}]]}],
        "claims": [{"claim": "TEST claim", "holds": False, "p": 0.3, "test": "paired t-test"}], "notes": ["TEST note"]}))
    at = app("report")
    body = texts(at)
    assert "Real wounds: TEST" in body and "TEST claim: **does not hold**" in body
    shown = next(d for d in at.dataframe if "peak RSS MB" in d.value.columns).value["balanced %"].tolist()
    assert shown == ["61.9 ± 0.4 [60.9, 62.9] (3 seeds)", "61.9 (same on all 3 seeds)", "72.5 (1 seed)"]  # no ± 0.0
    assert "seeds 0, 1, 2" in body and "Data: REAL wound photos" in body
    assert len(at.get("plotly_chart")) >= 1
    # the workspace's own result first, under the SYNTHETIC banner; the real-data benchmark last, collapsed, in an
    # expander that says it is not this workspace's data
    shown_in_order = [t for e in walk(at.main) if isinstance(t := shown_value(e), str)]
    synthetic = [n for n, text in enumerate(shown_in_order) if "SYNTHETIC DATA" in text]
    real = shown_in_order.index("Real wounds: vision benchmark")
    assert synthetic and max(synthetic) < shown_in_order.index("Verdict") < real
    assert shown_in_order.index("Agreement with the expert's triplets") < real
    (expander,) = [e for e in at.expander if "not this workspace's data" in e.label]
    assert "Real wounds: vision benchmark" in [shown_value(e) for e in walk(expander)]
    assert not expander.proto.expanded


def walk(node):
    """Every element under ``node`` of an AppTest tree, in page order."""
    for child in getattr(node, "children", {}).values():
        yield child
        yield from walk(child)


def test_report_page_shows_the_contrastive_benchmark(ws):
    from core.experiments.contrastive import METRICS, OUT_DIR, paired_vs_baseline, summarise, write_outputs

    assert "No contrastive-objective benchmark yet" in texts(app("report"))
    rng = np.random.default_rng(0)  # TEST-ONLY numbers: the page renders whatever the benchmark wrote
    cells = {v: [{**dict(zip(METRICS, rng.uniform(size=len(METRICS)))), "seed": s} for s in range(3)]
             for v in ("clip", "siglip")}
    out = ws.runs_dir / OUT_DIR
    out.mkdir(parents=True)
    write_outputs(out, summarise(cells), {"flip": "TEST-ONLY reason"}, {"seeds": 3, "n_heldout": 36.0},
                  synthetic=True, paired=paired_vs_baseline(cells))
    at = app("report")
    frame, paired = at.dataframe[-2].value, at.dataframe[-1].value
    assert list(frame["variant"]) == ["clip", "siglip"] and "±" in frame.loc[0, "i2t_R@1"]
    assert list(paired["variant"]) == ["siglip"] and "probe_majority" not in paired.columns
    assert "flip skipped: TEST-ONLY reason" in texts(at) and "K / held-out wounds" in texts(at)
    assert len(at.get("plotly_chart")) >= 1
    assert {b.label for b in at.get("download_button")} >= {"Download benchmark table.csv",
                                                             "Download benchmark table.md"}


@pytest.mark.slow
def test_explore_page_umap_retrieval_attention(ws):
    at = app("explore")
    assert "No finished embedding run yet" in texts(at)
    add_test_embedding(ws, with_attention=True)
    at = app("explore", timeout=300)
    assert len(at.get("vega_lite_chart")) == 1
    body = texts(at)
    assert "Most similar" in body and "Most dissimilar" in body and "Token maps" in body
    assert "No concepts run yet" in body and "core.train_concepts --objective make" in body
    captions = [c for im in at.image for c in im.captions]
    assert any("d = " in c for c in captions)  # retrieval thumbnails with distances
    assert any(c.endswith(" (the photo)") for c in captions)  # the token maps (from the run's attention)
    assert "out of date" not in body and at.slider(key="explore_attention_opacity").value == 0.6
    photo = ws.store.images()[0]["image_id"]
    session.delete_wound(ws, photo, ws.store.wounds(photo)[0]["wound_index"], actor="Tess")  # after the run
    at = app("explore", timeout=300)
    assert "This run is out of date" in texts(at)


@pytest.mark.slow
def test_explore_page_draws_a_wound_track_path(ws):
    by_patient: dict[str, list[str]] = {}
    for i in ws.store.images():
        if ws.store.wounds(i["image_id"]):
            by_patient.setdefault(i["patient_id"], []).append(i["image_id"])
    patient, photos = max(by_patient.items(), key=lambda kv: len(kv[1]))
    photos = photos[:4]
    for n, image_id in enumerate(reversed(photos)):  # visit order is not the photo order
        followup.set_visit_date(ws.store, image_id, f"2024-0{n + 1}-01")
        followup.set_track(ws.store, image_id, ws.store.wounds(image_id)[0]["wound_index"], f"{patient}-T1")
    add_test_embedding(ws)
    at = app("explore", timeout=300)
    at.selectbox(key="explore_track").select(f"{patient}-T1").run()
    assert not at.exception, at.exception
    spec = json.loads(at.get("vega_lite_chart")[0].proto.spec)
    (path,) = [layer["data"]["values"] for layer in spec["layer"] if layer["mark"]["type"] == "line"]
    assert len(photos) >= 2 and [v["visit"] for v in path] == [n + 1 for n in range(len(photos))]
    assert {v["track"] for v in path} == {f"{patient}-T1"}
    assert [v["date"] for v in path] == [f"2024-0{n + 1}-01" for n in range(len(photos))]


@pytest.mark.slow
def test_explore_page_concepts_top_table_and_heatmap(ws):
    from core.train_concepts import main as train_concepts

    assert train_concepts(["--workspace", str(ws.root), "--objective", "clip", "--epochs", "1", "--crop-size", "64"]) == 0
    (run,) = ws.store.runs(kind="concepts")
    assert run["status"] == "done" and len(run["metrics"]["epoch_seconds"]) == 1  # each epoch timed (benchmarks.gpu)
    photo = ws.store.wounds()[0]["image_id"]
    at = signed_in(AppTest.from_file(APP, default_timeout=300), account())
    at.run()
    at.switch_page(PAGES["explore"]).run()
    assert not at.exception, at.exception
    at.selectbox(key="explore_photo").select(photo).run()
    assert not at.exception, at.exception
    assert "Wound concepts" in texts(at) and "No concepts run yet" not in texts(at)
    assert at.selectbox(key="explore_concepts_run").value == run["id"]
    n_wounds = len([w for w in ws.store.wounds(photo) if w["description"].strip()])
    tables = [d.value for d in at.dataframe if "fused" in d.value.columns]
    assert len(tables) == n_wounds >= 1
    assert all(len(t) == 5 and t["fused"].is_monotonic_decreasing and t["fused"].between(0, 1).all() for t in tables)
    heat = [im for im in at.image if any(" · wound " in c and "SYNTHETIC" in c for c in im.captions)]
    assert len(heat) == n_wounds
    index = ws.store.wounds(photo)[0]["wound_index"]
    picker = at.selectbox(key=f"explore_concept_{run['id']}_{photo}_{index}")
    picker.select_index(0 if picker.index else 1).run()  # another concept's heatmap
    assert not at.exception, at.exception


# -- jobs ----------------------------------------------------------------------------------------
def wait_for(condition: Callable[[], bool], what: str, timeout: float = 600.0) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` after a generous ``timeout`` (seconds)
    that only a hung job reaches, however loaded the machine."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)


def test_job_runs_detached_logs_and_stops(ws, tmp_path):
    out = tmp_path / "ph"
    rec = jobs.start_job(ws, "phantoms-small", "phantoms",
                         ["--out", str(out), "--photos", "6", "--patients", "2", "--wounds", "6", "--triplets", "5"],
                         pass_workspace=False)
    assert rec["alive"] and rec["pid"] > 0
    with pytest.raises(ValueError, match="still running"):
        jobs.start_job(ws, "phantoms-small", "phantoms", ["--out", str(out)], pass_workspace=False)
    wait_for(lambda: not jobs.job(ws, "phantoms-small")["alive"], "the phantoms-small job to finish")
    assert (out / "wounds.csv").exists()
    assert "core.phantoms" in jobs.tail_log(ws, "phantoms-small")
    big = jobs.start_job(ws, "phantoms-big", "phantoms", ["--out", str(tmp_path / "big"), "--photos", "200",
                                                          "--wounds", "400", "--patients", "50"],
                         pass_workspace=False)
    assert jobs.stop_job(ws, "phantoms-big")
    assert not jobs.process_alive(big["pid"], big["create_time"])
    again = jobs.resume_job(ws, "phantoms-big")  # resume = the same command relaunched
    assert again["cmd"] == big["cmd"] and again["pid"] != big["pid"] and jobs.job(ws, "phantoms-big")["alive"]
    jobs.stop_job(ws, "phantoms-big")
    assert [j["name"] for j in jobs.jobs(ws)] == ["phantoms-big", "phantoms-small"]


def test_session_rules(monkeypatch):
    monkeypatch.delenv("TRIDERM_WORKSPACE", raising=False)
    x, y = Path("/tmp/x").resolve(), Path("/tmp/y").resolve()
    assert session.workspace_root(["--workspace", "/tmp/x"], {}) == x
    assert session.workspace_root(["app.py", "--workspace=/tmp/x"], {}) == x
    assert session.workspace_root([], {"TRIDERM_WORKSPACE": "/tmp/y"}) == y
    assert session.workspace_root(["--workspace", "/tmp/x"], {"TRIDERM_WORKSPACE": "/tmp/y"}) == x  # argv wins
    assert session.workspace_root([], {}) == (Path.cwd() / "workspace").resolve()


def test_home_imports_a_dataset_folder(demo_dataset, tmp_path, monkeypatch):
    monkeypatch.setenv("TRIDERM_WORKSPACE", str(tmp_path / "empty"))
    at = app()
    assert "This workspace is empty" in texts(at)
    at.text_input(key="import_folder").input(str(tmp_path / "missing"))  # a form: submitted with the button
    at.button[[b.label for b in at.button].index("Import")].click().run()
    assert any("Nothing imported" in e.value for e in at.error)
    at.text_input(key="import_folder").input(str(demo_dataset))
    at.date_input(key="import_visit_date").set_value(date(2024, 5, 6))  # the visit date, asked at import
    at.button[[b.label for b in at.button].index("Import")].click().run()
    assert any("Imported 53 photos" in s.value and "53 new photos dated 2024-05-06" in s.value for s in at.success)
    # the overview, drawn after the import, counts the new photos; the message is above it, shown once
    assert "This workspace is empty" not in texts(at)
    assert {m.label: m.value for m in at.metric}["Photos"] == "53"
    order = [getattr(e, "value", None) for e in walk(at.main)]
    done = next(n for n, v in enumerate(order) if isinstance(v, str) and v.startswith("Imported 53 photos"))
    assert done < next(n for n, e in enumerate(walk(at.main)) if type(e).__name__ == "Metric")  # above the counts
    assert "expert triplets: 513 (no target set for this workspace)" in texts(at)  # no goal until an admin sets one
    at.number_input(key="study_target").set_value(600).run()
    assert "expert triplets: 513 / 600" in texts(at) and "Imported 53 photos" not in texts(at)
    store = Workspace(tmp_path / "empty").store
    assert session.study_target(Workspace(tmp_path / "empty")) == 600
    assert store.counts()["images"] == 53
    assert {i["metadata"].get("visit_date") for i in store.images()} == {"2024-05-06"}


def test_category_colours_distinct_up_to_24_then_other():
    from app import explore

    values = [f"site {n}" for n in range(24)]
    grouped, colours = explore.category_colours(values)
    assert grouped == values and len(set(colours.values())) == 24
    many = values + ["site 0"] * 3 + [f"rare {n}" for n in range(5)]
    grouped, colours = explore.category_colours(many)
    assert len(colours) == 24 and "other" in colours and len(set(colours.values())) == 24
    assert grouped.count("other") == 6 and "site 0" in colours  # the most frequent keep their colour


def test_admin_sets_the_ollama_allow_list_and_a_bad_host_changes_nothing(ws):
    at = app("accounts")
    area = next(t for t in at.text_area if t.label == "Allowed hosts")
    area.input("gpu-a:11434\nhttp://user:pw@evil:80")
    next(b for b in at.button if b.label == "Save hosts").click().run()
    assert any("no credentials" in e.value for e in at.error)
    assert ws.store.get_meta("ollama_hosts") is None
    area = next(t for t in at.text_area if t.label == "Allowed hosts")
    area.input("gpu-a:11434\nhttps://gpu-b")
    next(b for b in at.button if b.label == "Save hosts").click().run()
    assert ws.store.get_meta("ollama_hosts") == ["gpu-a:11434", "https://gpu-b"]


def test_report_cells_and_rows_are_plain_functions():
    """The Report page's tables come from app.report's UI-free helpers (TEST-ONLY numbers)."""
    from app import report

    row = {"modality": "vision", "run_id": 3, "label": "m", "balanced": 0.6125, "kappa": 0.2, "n": 10, "n_anchors": 4,
           "ci": {"balanced": [0.5, 0.7]}}
    (shown,) = report.agreement_rows([row])
    assert shown["Balanced %"] == "61.3 [50.0, 70.0]" and shown["κ"] == "0.200" and shown["Micro %"] == "–"
    assert shown["scored on"] == "all triplets" and shown["run"] == 3
    assert report.seeds_cell({"mean": 61.9, "sd": 0.4, "ci": [60.9, 62.9]}, 3) == "61.9 ± 0.4 [60.9, 62.9] (3 seeds)"
    assert report.seeds_cell({"mean": 61.9, "sd": 0.0, "ci": [61.9, 61.9]}, 3) == "61.9 (same on all 3 seeds)"
    assert report.seeds_cell({"mean": 72.5, "sd": None, "n": 1}, 3) == "72.5 (1 seed)"
    # records pooled over the seeds (real_vision): one estimate with its CI, no seed count
    assert report.seeds_cell({"mean": 60.0, "sd": None, "ci": [55.9, 63.6]}, 3) == "60.0 [55.9, 63.6]"
    assert report.seeds_cell(None, 3) == "–" and report.seeds_cell(1.5, 3) == 1.5
    (abl,) = report.ablation_rows([{"factor": "f", "label": "s", "seeds": 2, "balanced_mean": 0.6, "balanced_sd": 0.05,
                                "micro_mean": None, "paper": 70}])
    assert abl["balanced % (mean ± sd)"] == "60.0 ± 5.0" and abl["micro % (mean ± sd)"] == "0.0 ± 0.0"
    summary = {"siglip": {"i2t_R@1": (0.5, 0.1), "probe_majority": (0.3, 0.0)}}
    assert report.benchmark_rows(summary) == [{"variant": "siglip", "i2t_R@1": "0.500 ± 0.100", "probe_majority": "0.300 ± 0.000"}]
    paired = {"siglip": {"i2t_R@1": (0.05, 0.01, True), "probe_majority": (0.0, 0.0, False)}}
    assert report.benchmark_rows(paired, paired=True) == [{"variant": "siglip", "i2t_R@1": "+0.050 ± 0.010*"}]


def add_finetune_run(ws: Workspace, maps: bool) -> int:
    """A TEST-ONLY ``vision-finetune`` run (random embedding) with, when ``maps``, stored token maps (random,
    each photo's summing to 1) as the training job writes them."""
    from core.runtime import save_embeddings

    ids = [im["image_id"] for im in ws.store.images()]
    rng = np.random.default_rng(3)
    run_id = ws.store.start_run("vision-finetune", {"modality": "vision", "test_only": True}, name="TEST-ONLY")
    save_embeddings(ws, run_id, ids, image_emb=rng.normal(size=(len(ids), 4)))
    if maps:
        heat = rng.random((len(ids), 14, 14)).astype(np.float32)
        path = ws.run_dir(run_id) / "token_maps.npz"
        np.savez_compressed(path, image_ids=np.asarray(ids), maps=heat / heat.sum(axis=(1, 2), keepdims=True),
                            grid=np.array([14, 14]), kind=np.array("contribution"))
        ws.store.update_run(run_id, artifacts={"token_maps": str(path.relative_to(ws.root))})
    ws.store.finish_run(run_id)
    return run_id


@pytest.mark.slow
def test_explore_page_opens_on_the_newest_trained_run_and_reads_its_stored_token_maps(ws, monkeypatch):
    """Issue 54: with a fine-tuned run and a newer frozen baseline (as ``make demo`` leaves them) Explore opens on
    the fine-tuned run and shows the token maps its job stored — the query photo's and its nearest photos', each
    enlarged on a click — computing none (TEST-ONLY runs)."""
    import core.eval.explore
    import core.vision.inference
    import core.vision.token_maps

    def never(*args, **kwargs):
        raise AssertionError("the page computed token maps instead of reading the stored ones")

    for module, name in ((core.vision.token_maps, "compute_token_maps"), (core.vision.token_maps, "contribution_maps"),
                         (core.eval.explore, "attention_maps"), (core.vision.inference.TunedModel, "load")):
        monkeypatch.setattr(module, name, never)
    tuned = add_finetune_run(ws, maps=True)
    add_test_embedding(ws)  # a vision-baseline run, newer
    at = app("explore", timeout=300)
    assert at.selectbox(key="explore_run").value == tuned
    assert "Token maps" in texts(at) and "share of the photo's embedding" in texts(at)
    query = at.selectbox(key="explore_photo").value
    maps = [im for im in at.image if any(c.endswith((" (the photo)", " · similar")) for c in im.captions)]
    assert len(maps) == 4 and maps[0].captions[0] == f"{query} (the photo)"
    enlarge = [b for b in at.button if b.label == "Enlarge"]
    assert len(enlarge) == 4
    enlarge[0].click().run()
    assert not at.exception, at.exception
    assert sum(c == f"{query} (the photo)" for im in at.image for c in im.captions) == 2  # the tile and the dialog


@pytest.mark.slow
def test_explore_page_says_how_to_make_the_maps_of_an_older_run(ws):
    """A fine-tune run trained before runs stored their maps: the page says so, with the command and (an admin) the
    button that starts it — no traceback, no computation on the visit; a baseline says why it has none."""
    tuned = add_finetune_run(ws, maps=False)
    baseline = add_test_embedding(ws)
    at = app("explore", timeout=300)
    assert at.selectbox(key="explore_run").value == tuned
    assert f"Run {tuned} was trained before runs stored their token maps" in texts(at)
    assert any(f"python -m core.token_maps {tuned} --workspace {ws.root}" in c.value for c in at.code)
    assert any(b.label == "Start making the token maps" for b in at.button)
    at.selectbox(key="explore_run").select(baseline).run()
    assert not at.exception and "it learns no attention" in texts(at)
