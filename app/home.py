"""The Home page (sign-in, workspace overview, upload, import / demo for admins) and the sign-in gate that
app.py's router shows at every address until someone signs in."""

from __future__ import annotations

import inspect
import tempfile
from datetime import date
from pathlib import Path

import pandas as pd
import streamlit as st

from annotations.accounts import accounts, session
from annotations.accounts.accounts import AuthError
from annotations.followup import followup
from annotations.followup.measure import ARUCO_DICTIONARIES, MarkerSpec
from annotations.io import upload
from annotations.io.dataset import import_dataset
from annotations.io.readers import HEIC_SUFFIXES, IMAGE_SUFFIXES, DatasetError
from app import auth, markup, navigation


def sign_in_form() -> None:
    """The sign-in form (or, with no account yet, how to create the first admin on the server)."""
    store = auth.workspace().store
    notice = st.session_state.pop("_auth_notice", None)
    if notice:
        st.warning(markup.escape_md(notice))
    if not accounts.has_accounts(store):
        st.info("No account exists in this workspace yet. Create the first admin on the server:\n\n"
                "`python -m annotations users add --role admin NAME`")
    providers = auth.oidc_providers()
    if providers:
        for provider in providers:
            if st.button(f"Sign in with {provider or 'your organisation'}", key=f"oidc_{provider}"):
                st.login(provider) if provider else st.login()
    with st.form("sign_in", border=True):
        st.subheader("Sign in")
        name = st.text_input("Account name", autocomplete="username")
        password = st.text_input("Password", type="password", autocomplete="current-password")
        if st.form_submit_button("Sign in", type="primary"):
            try:
                found = accounts.authenticate(store, name, password)
            except AuthError as err:
                st.error(markup.escape_md(str(err)))
                return
            auth.sign_in(found)
            st.rerun()


def overview_section(ws) -> None:
    """The workspace overview: counts, progress toward the targets, annotators and the latest runs."""
    info = session.overview(ws)
    st.subheader(f"Workspace · {markup.escape_md(ws.dataset_name)}")
    if info["images"] == 0:
        st.info("This workspace is empty. Upload photos, import a dataset folder or build the synthetic demo below.")
        return
    cols = st.columns(6)
    cols[0].metric("Photos", info["images"])
    cols[1].metric("Patients", info["patients"])
    cols[2].metric("Wounds outlined", info["wounds"])
    cols[3].metric("Descriptions", info["described_wounds"])
    cols[4].metric("Expert triplets", info["expert_triplets"])
    cols[5].metric("LLM triplets", info["llm_triplets"])
    st.markdown("**Progress toward targets**")
    for label, (done, goal) in info["progress"].items():
        if goal is None:  # a study goal the workspace has not set: the count alone
            st.caption(f"{label}: {done:,} (no target set for this workspace)")
            continue
        frac = min(1.0, done / goal) if goal else 0.0
        st.progress(frac, text=f"{label}: {done:,} / {goal:,}")
    if auth.account().can("manage"):
        goal = st.columns(3)[0].number_input("Study target: expert triplets (0: none)", min_value=0, max_value=1_000_000,
                               value=session.study_target(ws) or 0, step=50, key="study_target",
                               help="The number of expert judgments this study aims for (stored in the workspace)")
        if goal != (session.study_target(ws) or 0):
            session.set_study_target(ws, int(goal))
            st.rerun()
    if info["annotators"]:
        st.caption("Annotators: " + ", ".join(markup.escape_md(a) for a in info["annotators"]))
    runs = ws.store.runs()[:8]
    st.markdown("**Latest runs**")
    if runs:
        st.dataframe(pd.DataFrame([{
            "run": r["id"], "kind": r["kind"], "name": r["name"] or "", "status": markup.status_badge(r["status"]),
            "progress": float(r["progress"] or 0), "started": str(r["created"])[:16].replace("T", " "),
            "message": r["message"] or "",
        } for r in runs]), hide_index=True, width="stretch",
            column_config={"progress": st.column_config.ProgressColumn("progress", min_value=0, max_value=1)})
    else:
        st.caption("No runs yet — start one on the LLM oracle or Train page.")


def upload_section(ws) -> None:
    """Upload a visit's photos from this computer (admins and annotators): the photos, the patient, the
    visit date and the calibration marker; all stored or, on any error, none (annotations.io.upload)."""
    with st.expander("Upload photos", expanded=ws.store.counts()["images"] == 0):
        st.caption(f"JPEG, PNG or TIFF photos of one patient's visit, several at once (drag and drop), up to "
                   f"{upload.MAX_PHOTO_MB} MB a photo and {upload.MAX_PHOTOS} an upload. Each is checked as an import "
                   "checks it and stored upright, without its EXIF (GPS, dates, serial numbers); one bad file "
                   "stores none. A file's name without its type becomes the photo's id (letters, digits, _ . -). "
                   "HEIC photos (iPhone) are not read: save them as JPEG (Settings › Camera › Formats › Most "
                   "Compatible).")
        refusal = upload.refusal(ws, auth.account())
        if refusal:
            st.caption(markup.escape_md(refusal))
            return
        marker = followup.workspace_marker(ws)
        with st.form("upload_form", border=False):  # choosing never reruns: the files go in with the button
            files = st.file_uploader("Photos", type=[s.lstrip(".") for s in (*IMAGE_SUFFIXES, *HEIC_SUFFIXES)],
                                     accept_multiple_files=True, max_upload_size=upload.MAX_PHOTO_MB,
                                     key=f"upload_files_{st.session_state.get('_upload_round', 0)}")
            left, right = st.columns(2)
            patient = left.selectbox("Patient", [p["patient_id"] for p in ws.store.patients()], index=None,
                                     accept_new_options=True, key="upload_patient",
                                     placeholder="A known patient, or type a new id",
                                     help="A known patient's photos are a new visit: on the Follow-up page their "
                                          "outlined wounds wait to be linked to the patient's tracks")
            visit = right.date_input("Visit date", value=date.today(), max_value=date.today(), key="upload_visit_date")
            if marker is None:
                shown = st.checkbox("The photos show a printed calibration marker (sizes in cm² on the Follow-up "
                                    "page)", key="upload_has_marker")
                c1, c2, c3 = st.columns(3)
                default = MarkerSpec()
                dictionary = c1.selectbox("Marker dictionary", ARUCO_DICTIONARIES,
                                          index=ARUCO_DICTIONARIES.index(default.dictionary), key="upload_marker_dict")
                marker_id = c2.number_input("Marker id", min_value=0, value=default.marker_id, step=1,
                                            key="upload_marker_id")
                side = c3.number_input("Marker side (cm)", min_value=0.5, max_value=20.0, value=default.side_cm,
                                       key="upload_marker_side")
            else:
                st.caption(f"Calibration marker: the workspace's, {marker.dictionary} id {marker.marker_id}, "
                           f"{marker.side_cm:g} cm (every photo is searched for it).")
            submitted = st.form_submit_button("Upload the visit", type="primary")
        if submitted:
            given = ({"dictionary": dictionary, "id": int(marker_id), "side_cm": float(side)}
                     if marker is None and shown else None)
            try:
                added = upload.upload_photos(ws, [(f.name, f.getvalue()) for f in files or []], patient, visit,
                                             given, account=auth.account())
            except (DatasetError, AuthError) as err:
                st.error(f"Nothing uploaded: {markup.escape_md(str(err))}")
                return
            st.session_state["_upload_round"] = st.session_state.get("_upload_round", 0) + 1  # empties the chooser
            done(markup.escape_md(upload_message(added)), outline=True)


def upload_message(added: dict) -> str:
    """What an upload added, and where its photos go next."""
    known = "a new patient" if added["new_patient"] else "a known patient"
    if added["earlier_visits"]:
        known += "; earlier visits " + ", ".join(added["earlier_visits"])
    if added["tracks"]:
        known += "; tracks " + ", ".join(added["tracks"])
    return (f"Uploaded {len(added['images'])} photo(s) of patient {added['patient']} dated {added['visit_date']} "
            f"({known}). Next: outline their wounds on the Wound masks page; the Follow-up page then links them "
            "to the patient's tracks.")


def data_section(ws) -> None:
    """Import a dataset folder or build the SYNTHETIC demo (for accounts that manage the workspace)."""
    with st.expander("Import a dataset folder or build the demo", expanded=ws.store.counts()["images"] == 0):
        left, right = st.columns(2)
        with left:
            st.markdown("**Import a dataset folder** (`images/`, `masks/`, `wounds.csv`, optional CSVs)")
            with st.form("import_form", border=False):  # typing never reruns: sidebar links always navigate
                folder = st.text_input("Dataset folder on the server", key="import_folder")
                visit = st.date_input("Visit date of the new photos (where images.csv gives none)", value=None,
                                      max_value=date.today(), key="import_visit_date",
                                      help="Follow-up: the day these photos were taken; leave empty if unknown")
                submitted = st.form_submit_button("Import")
            if submitted and not folder.strip():
                st.error("Enter the dataset folder to import.")
            elif submitted:
                try:
                    summary = followup.import_visit(ws, Path(folder).expanduser(), visit)
                except DatasetError as err:
                    st.error(f"Nothing imported: {markup.escape_md(str(err))}")
                else:
                    done(f"Imported {summary['images']} photos, {summary['wounds']} wounds, "
                         f"{summary['new_triplets']} new triplets"
                         + (f"; {summary['dated']} new photos dated {visit.isoformat()}." if visit else "."))
        with right:
            st.markdown("**Build the synthetic demo** (phantom wounds, labelled SYNTHETIC everywhere)")
            refusal = demo_refusal(ws)
            if refusal:
                st.caption(markup.escape_md(refusal))
            photos = st.number_input("Photos", min_value=6, max_value=200, value=53)
            if st.button("Build demo", disabled=refusal is not None):
                from core.phantoms import build

                with st.spinner("Rendering phantom photos…"), tempfile.TemporaryDirectory() as tmp:
                    out = Path(tmp) / "demo"
                    n = int(photos)
                    full = {k: p.default for k, p in inspect.signature(build).parameters.items()}
                    scale = n / full["photos"]  # the default demo's proportions, at n photos
                    build(out, seed=0, photos=n, patients=max(1, round(full["patients"] * scale)),
                          wounds=max(n, round(full["wounds"] * scale)),
                          triplets=min(max(1, round(full["triplets"] * scale)), n * (n - 1) * (n - 2) // 2))
                    try:
                        summary = import_dataset(ws, out)
                    except DatasetError as err:
                        st.error(f"Nothing imported: {markup.escape_md(str(err))}")
                        return
                done(f"Demo imported: {summary['images']} synthetic photos, {summary['wounds']} wounds, "
                     f"{summary['new_triplets']} triplets.")


def done(message: str, outline: bool = False) -> None:
    """Keep ``message`` for the top of the page and rerun, so the overview above counts what was just added
    (``outline``: with a link to the Wound masks page)."""
    st.session_state["_home_done"] = (message, outline)
    st.rerun()


def done_notice() -> None:
    """The message of the import, upload or demo just finished, at the top of the page (shown once)."""
    if kept := st.session_state.pop("_home_done", None):
        message, outline = kept
        st.success(message, icon=":material/check_circle:")
        if outline:
            st.page_link("pages/1_Wound_masks.py", label="Outline the wounds: Wound masks", icon=":material/draw:")


def demo_refusal(ws) -> str | None:
    """Why the synthetic demo may not be built into this workspace (None: it may) — the import's own
    kind guard, so the button and ``python -m annotations import`` apply one rule."""
    from annotations.io.dataset import check_kind

    try:
        check_kind(ws, synthetic=True)
    except DatasetError as err:
        return str(err)
    return None


def home() -> None:
    """The home page of a signed-in account."""
    ws = navigation.page("TriDerm Studio")
    found = auth.account()
    st.caption("Collect expert wound-similarity judgments, learn image and text embeddings, explore them.")
    st.success(f"Signed in as **{markup.escape_md(found.name)}** ({found.role}). Use the pages on the left.")
    done_notice()
    overview_section(ws)
    if found.can(upload.PERMISSION):
        upload_section(ws)
    if found.can("manage"):
        data_section(ws)


def gate() -> None:
    """The sign-in page shown at every address until someone signs in."""
    st.title("TriDerm Studio")
    auth.sync_cookie()
    st.caption("Access is restricted to personal accounts.")
    sign_in_form()
