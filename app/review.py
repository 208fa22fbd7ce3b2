"""The Review page's logic: one function per tab (:func:`main` draws them; pages/7_Review.py starts the page and
calls it)."""

from __future__ import annotations

import math

import pandas as pd
import streamlit as st

from annotations.accounts import accounts
from annotations.followup import readings
from annotations.infra.workspace import Workspace
from annotations.scheduling import consistency
from annotations.scheduling.consistency import rounded as num
from annotations.store.history import audit_rows
from app import images, markup


def annotators_tab(ws: Workspace, actor: str, all_rows: list[dict], kept: list[dict],
                   excluded_names: dict[str, dict]) -> None:
    """Per annotator: progress, self-consistency and role, with exclusion controls."""
    progress = consistency.progress(all_rows)
    names = sorted(set(progress) | set(excluded_names), key=str.lower)
    if not names:
        st.info("No expert judgment yet.")
        return
    roles = {a["name"]: a["role"] for a in accounts.list_accounts(ws.store)}
    st.dataframe(pd.DataFrame(consistency.annotator_rows(names, progress, consistency.self_consistency(kept), roles,
                                                         excluded_names)), hide_index=True, width="stretch")
    st.markdown("**Exclude an annotator from evaluation** (e.g. a test or practice account)")
    who = st.selectbox("Annotator", names, key="review_who")
    if who in excluded_names:
        c1, c2 = st.columns([5, 1], vertical_alignment="bottom")
        c1.caption(f"Excluded by {markup.escape_md(excluded_names[who]['actor'])}: "
                   f"{markup.escape_md(excluded_names[who]['reason']) or 'no reason given'}")
        if c2.button("Include again", key="review_include"):
            accounts.include(ws.store, "annotator", who, actor)
            st.rerun()
    else:  # a form: typing the reason never reruns the page, so the sidebar links always navigate
        with st.form("review_exclude_form", border=False):
            c1, c2 = st.columns([5, 1], vertical_alignment="bottom")
            reason = c1.text_input("Reason", key="review_reason", placeholder="practice account")
            if c2.form_submit_button("Exclude", type="primary", key="review_exclude"):
                accounts.exclude(ws.store, "annotator", who, reason, actor)
                st.rerun()


def kappa_table(col, kept: list[dict]) -> None:
    """Cohen's κ between each pair of annotators on their shared triplets, in column ``col``."""
    kappa = consistency.inter_annotator_kappa(kept)
    mean = kappa["mean_kappa"]
    col.markdown("**Triplets: Cohen's κ between annotators on shared triplets** (first showing, skips left "
                 "out)" + ("" if math.isnan(mean) else f" — mean κ = {mean:.3f}"))
    if kappa["pairs"]:
        col.dataframe(pd.DataFrame([{"annotator A": p["a"], "annotator B": p["b"], "shared": p["n"],
                                     "agreement": num(p["agreement"]), "κ": num(p["kappa"])}
                                    for p in kappa["pairs"]]), hide_index=True, width="stretch")
    else:
        col.caption("No triplet has been answered by two annotators (in evaluation) yet.")


def dice_table(col, outline: dict) -> None:
    """The Dice between each pair of annotators on photos both outlined, in column ``col``."""
    col.markdown("**Outlines: Dice between annotators on photos read by both** (wound union per photo)"
                 + ("" if math.isnan(outline["mean"]) else f" — mean Dice = {outline['mean']:.3f}"))
    if outline["pairs"]:
        col.dataframe(pd.DataFrame([{"annotator A": p["a"], "annotator B": p["b"], "photos": p["n"],
                                     "mean Dice": num(p["mean"]), "lowest Dice": num(p["min"])}
                                    for p in outline["pairs"]]), hide_index=True, width="stretch")
    else:
        col.caption("No photo has two second readings (in evaluation) yet: mark photos for second reading "
                    "in the Second reading tab.")


def readings_per_photo(ws: Workspace, photos: list[dict]) -> None:
    """Outline agreement per photo and, for the photo picked, its stored outline beside every reading."""
    st.markdown("**Outline agreement per photo** (Dice of each pair of readers; *vs stored*: each reading "
                "against the photo's stored outline)")
    st.dataframe(pd.DataFrame(readings.photo_rows(photos)), hide_index=True, width="stretch")
    worst = sorted(photos, key=lambda ph: ph["mean"])
    look = st.selectbox("Look at the readings of", range(len(worst)), key="reading_look",
                        format_func=lambda n: f"{worst[n]['image_id']} (mean Dice {worst[n]['mean']:.3f})")
    shown = worst[look]
    photo = ws.load_image(shown["image_id"])
    layers = [("stored outline", ws.load_mask(shown["image_id"]))]
    layers += [(name, readings.load_layer(ws, shown["image_id"], name)) for name in shown["readers"]]
    for col, (name, labels) in zip(st.columns(len(layers)), layers):
        col.image(images.outline_overlay(photo, labels), caption=markup.escape_md(name), width="stretch")


def agreement_tab(ws: Workspace, kept: list[dict], excluded_names: dict[str, dict]) -> None:
    """Inter-annotator agreement (triplet κ, outline Dice) and self-consistency on repeats."""
    kappa_col, dice_col = st.columns(2, gap="large")
    kappa_table(kappa_col, kept)
    outline = readings.agreement(ws, exclude=set(excluded_names))
    dice_table(dice_col, outline)
    if outline["photos"]:
        readings_per_photo(ws, outline["photos"])
    st.markdown("**Self-consistency on planned repeats**")
    sc = consistency.self_consistency(kept)
    if sc:
        st.dataframe(pd.DataFrame([{"annotator": a, "repeats": v["n"], "same answer": v["agree"],
                                    "consistency": num(v["rate"])} for a, v in sorted(sc.items())]),
                     hide_index=True, width="stretch")


def divided_triplet(ws: Workspace, actor: str, d: dict, excluded_names: dict[str, dict],
                    excluded_ids: dict[int, dict]) -> None:
    """One triplet answered differently: its three photos and each annotator's answer, with (un)exclude buttons."""
    cols = st.columns(3)
    for col, image_id, role in zip(cols, (d["refs"][0], d["anchor"], d["refs"][1]), ("A", "Query", "B")):
        col.image(images.outlined(ws, image_id, 480, 360), caption=f"{role} · {markup.escape_md(image_id)}", width="stretch")
    for name, (row_id, chosen) in sorted(d["answers"].items()):
        c1, c2 = st.columns([4, 1], vertical_alignment="center")
        side = "A" if chosen == d["refs"][0] else "B"
        mark = " · **excluded**" if row_id in excluded_ids or name in excluded_names else ""
        c1.markdown(f"{markup.escape_md(name)} chose **{side}** ({markup.escape_md(chosen)}) — judgment {row_id}{mark}")
        if row_id in excluded_ids:
            if c2.button("Include", key=f"inc_{row_id}"):
                accounts.include(ws.store, "triplet", row_id, actor)
                st.rerun()
        elif c2.button("Exclude", key=f"exc_{row_id}"):
            accounts.exclude(ws.store, "triplet", row_id, "excluded on the Review page", actor)
            st.rerun()


def disagreements_tab(ws: Workspace, actor: str, all_rows: list[dict], excluded_names: dict[str, dict],
                      excluded_ids: dict[int, dict]) -> None:
    """The shared triplets answered differently (the most divided first, one opened for review) and the single
    judgments excluded so far."""
    divided = consistency.disagreements(all_rows)
    if not divided:
        st.info("No shared triplet was answered differently.")
    else:
        st.caption(f"{len(divided)} shared triplets answered differently, the most divided first.")
        labels = [f"{d['anchor']} vs {d['refs'][0]} / {d['refs'][1]} ({len(d['answers'])} annotators)"
                  for d in divided]
        pick = st.selectbox("Triplet", range(len(divided)), format_func=labels.__getitem__, key="review_pick")
        divided_triplet(ws, actor, divided[pick], excluded_names, excluded_ids)
    if excluded_ids:
        st.markdown("**Single judgments excluded**")
        st.dataframe(pd.DataFrame([{"judgment": i, "by": e["actor"], "reason": e["reason"], "when": e["created"][:16]}
                                   for i, e in sorted(excluded_ids.items())]), hide_index=True, width="stretch")


def second_reading_tab(ws: Workspace, actor: str, excluded_names: dict[str, dict]) -> None:
    """Mark or unmark photos for independent second readings of their outlines."""
    st.caption("Photos marked here are outlined again, independently, by each annotator who opens them: every "
               "reading is stored as that annotator's own layer beside the stored outline, which it never changes. "
               "Readers see only their own outline; agreement (Agreement tab) is shown to admins only. Unmarking "
               "closes a photo's reading: its readings are kept and still count.")
    photo_ids = [im["image_id"] for im in ws.store.images()]
    now_marked = readings.marked(ws)
    if "reading_photos" not in st.session_state:  # the form is (re)created: it shows the stored marks
        st.session_state["reading_shown"] = now_marked
    shown = st.session_state["reading_shown"]  # the marks the form showed: what a save changes
    with st.form("reading_form", border=False):
        chosen = st.multiselect("Photos for second reading", photo_ids, default=now_marked, key="reading_photos")
        if st.form_submit_button("Save marks", type="primary", key="reading_save"):
            # only the marks changed in this form: another admin's marks made meanwhile stay
            for image_id in sorted(set(chosen) - set(shown) - set(now_marked)):
                readings.mark(ws, image_id, actor)
            for image_id in sorted((set(shown) - set(chosen)) & set(now_marked)):
                readings.unmark(ws, image_id, actor)
            st.session_state.pop("reading_photos", None)  # the form shows the stored marks again
            st.rerun()
    done = readings.readings(ws)
    left_out = {n.casefold() for n in excluded_names}
    if done:
        st.dataframe(pd.DataFrame([{"photo": r["image_id"], "reader": r["reader"], "wounds": r["wounds"],
                                    "wound pixels": r["area"], "updated": r["updated"][:16].replace("T", " "),
                                    "open": r["image_id"] in now_marked,
                                    "in evaluation": r["reader"].casefold() not in left_out} for r in done]),
                     hide_index=True, width="stretch")
    else:
        st.caption("No second reading stored yet.")


def audit_tab(ws: Workspace) -> None:
    """The store's change log, filterable by account."""
    rows = audit_rows(ws.store.revisions())
    if not rows:
        st.caption("No change recorded yet.")
        return
    frame = pd.DataFrame(rows)
    who = st.multiselect("Accounts", sorted(frame["account"].unique()), key="audit_who")
    st.dataframe(frame[frame["account"].isin(who)] if who else frame, hide_index=True, width="stretch")


def main(ws: Workspace, actor: str) -> None:
    """The Review page's tabs over every stored expert judgment (excluded ones marked)."""
    all_rows = ws.store.expert_triplets(include_excluded=True)
    kept = ws.store.expert_triplets()  # what every metric (here, in core.eval and in the jobs) uses
    excluded_names = {e["target"]: e for e in accounts.exclusions(ws.store) if e["kind"] == "annotator"}
    excluded_ids = {int(e["target"]): e for e in accounts.exclusions(ws.store) if e["kind"] == "triplet"}
    st.caption(f"{len(all_rows)} expert judgments stored; {len(kept)} count in evaluation "
               f"({len(all_rows) - len(kept)} excluded: kept in the store, marked, left out of every metric).")
    tabs = st.tabs(["Annotators", "Agreement", "Disagreements", "Second reading", "Audit trail"])
    with tabs[0]:
        annotators_tab(ws, actor, all_rows, kept, excluded_names)
    with tabs[1]:
        agreement_tab(ws, kept, excluded_names)
    with tabs[2]:
        disagreements_tab(ws, actor, all_rows, excluded_names, excluded_ids)
    with tabs[3]:
        second_reading_tab(ws, actor, excluded_names)
    with tabs[4]:
        audit_tab(ws)
