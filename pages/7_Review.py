"""Review (admins): each annotator's progress and reliability, agreement between annotators,
disagreements to look at, exclusion of test/practice annotators or single judgments from every
metric, and the audit trail of who changed what."""

from __future__ import annotations

import math

import pandas as pd
import streamlit as st

import app_common as ac
from annotations import accounts, consistency

ws = ac.page("Review", need="manage")
actor = ac.actor()
store = ws.store


def num(value: float, digits: int = 3) -> float | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else round(value, digits)


all_rows = store.expert_triplets(include_excluded=True)
kept = store.expert_triplets()  # what every metric (here, in core.eval and in the jobs) uses
excluded_names = {e["target"]: e for e in accounts.exclusions(store) if e["kind"] == "annotator"}
excluded_ids = {int(e["target"]): e for e in accounts.exclusions(store) if e["kind"] == "triplet"}
roles = {a["name"]: a["role"] for a in accounts.list_accounts(store)}
st.caption(f"{len(all_rows)} expert judgments stored; {len(kept)} count in evaluation "
           f"({len(all_rows) - len(kept)} excluded: kept in the store, marked, left out of every metric).")

annotators_tab, agreement_tab, disagreement_tab, outlines_tab, audit_tab = st.tabs(
    ["Annotators", "Agreement", "Disagreements", "Outline agreement", "Audit trail"])

with annotators_tab:
    progress = consistency.progress(all_rows)
    consistent = consistency.self_consistency(kept)
    names = sorted(set(progress) | set(excluded_names), key=str.lower)
    if not names:
        st.info("No expert judgment yet.")
    else:
        st.dataframe(pd.DataFrame([{
            "annotator": n, "account": roles.get(n, "no account (free-text name)"),
            "judgments": progress.get(n, {}).get("answered", 0), "skips": progress.get(n, {}).get("skips", 0),
            "planned repeats": progress.get(n, {}).get("repeats", 0),
            "self-consistency": num(consistent.get(n, {}).get("rate", math.nan)),
            "median seconds": num(progress.get(n, {}).get("median_ms", math.nan) / 1000, 1),
            "last answer": str(progress.get(n, {}).get("last", ""))[:16].replace("T", " "),
            "in evaluation": n not in excluded_names,
        } for n in names]), hide_index=True, width="stretch")
        st.markdown("**Exclude an annotator from evaluation** (e.g. a test or practice account)")
        c1, c2, c3 = st.columns([2, 3, 1], vertical_alignment="bottom")
        who = c1.selectbox("Annotator", names, key="review_who")
        if who in excluded_names:
            c2.caption(f"Excluded by {ac.escape_md(excluded_names[who]['actor'])}: "
                       f"{ac.escape_md(excluded_names[who]['reason']) or 'no reason given'}")
            if c3.button("Include again", key="review_include"):
                accounts.include(store, "annotator", who, actor)
                st.rerun()
        else:
            reason = c2.text_input("Reason", key="review_reason", placeholder="practice account")
            if c3.button("Exclude", key="review_exclude", type="primary"):
                accounts.exclude(store, "annotator", who, reason, actor)
                st.rerun()

with agreement_tab:
    kappa = consistency.inter_annotator_kappa(kept)
    mean = kappa["mean_kappa"]
    st.markdown("**Cohen's κ between annotators on shared triplets** (first showing, skips left out)"
                + ("" if math.isnan(mean) else f" — mean κ = {mean:.3f}"))
    if kappa["pairs"]:
        st.dataframe(pd.DataFrame([{"annotator A": p["a"], "annotator B": p["b"], "shared": p["n"],
                                    "agreement": num(p["agreement"]), "κ": num(p["kappa"])}
                                   for p in kappa["pairs"]]), hide_index=True, width="stretch")
    else:
        st.caption("No triplet has been answered by two annotators (in evaluation) yet.")
    st.markdown("**Self-consistency on planned repeats**")
    sc = consistency.self_consistency(kept)
    if sc:
        st.dataframe(pd.DataFrame([{"annotator": a, "repeats": v["n"], "same answer": v["agree"],
                                    "consistency": num(v["rate"])} for a, v in sorted(sc.items())]),
                     hide_index=True, width="stretch")

with disagreement_tab:
    divided = consistency.disagreements(all_rows)
    if not divided:
        st.info("No shared triplet was answered differently.")
    else:
        st.caption(f"{len(divided)} shared triplets answered differently, the most divided first.")
        labels = [f"{d['anchor']} vs {d['refs'][0]} / {d['refs'][1]} ({len(d['answers'])} annotators)"
                  for d in divided]
        pick = st.selectbox("Triplet", range(len(divided)), format_func=labels.__getitem__, key="review_pick")
        d = divided[pick]
        cols = st.columns(3)
        for col, image_id, role in zip(cols, (d["refs"][0], d["anchor"], d["refs"][1]), ("A", "Query", "B")):
            col.image(ac.outlined(ws, image_id, 480, 360), caption=f"{role} · {image_id}", width="stretch")
        for name, (row_id, chosen) in sorted(d["answers"].items()):
            c1, c2 = st.columns([4, 1], vertical_alignment="center")
            side = "A" if chosen == d["refs"][0] else "B"
            mark = " · **excluded**" if row_id in excluded_ids or name in excluded_names else ""
            c1.markdown(f"{ac.escape_md(name)} chose **{side}** ({chosen}) — judgment {row_id}{mark}")
            if row_id in excluded_ids:
                if c2.button("Include", key=f"inc_{row_id}"):
                    accounts.include(store, "triplet", row_id, actor)
                    st.rerun()
            elif c2.button("Exclude", key=f"exc_{row_id}"):
                accounts.exclude(store, "triplet", row_id, "excluded on the Review page", actor)
                st.rerun()
    if excluded_ids:
        st.markdown("**Single judgments excluded**")
        st.dataframe(pd.DataFrame([{"judgment": i, "by": e["actor"], "reason": e["reason"], "when": e["created"][:16]}
                                   for i, e in sorted(excluded_ids.items())]), hide_index=True, width="stretch")

with outlines_tab:
    st.caption("Outline agreement (Dice) needs several annotators' outlines of one photo. This workspace keeps one "
               "label map per photo (the latest outline is the truth; earlier ones are in the audit trail), so "
               "there is no pair of outlines to compare yet.")

with audit_tab:
    changes = store.revisions()[-300:][::-1]
    if not changes:
        st.caption("No change recorded yet.")
    else:
        frame = pd.DataFrame([{"when": r["created"][:19].replace("T", " "), "account": r["actor"],
                               "entity": r["entity"], "row": str(r["key"]), "field": r["field"],
                               "action": r["action"], "old": str(r["old"])[:80], "new": str(r["new"])[:80]}
                              for r in changes])
        who = st.multiselect("Accounts", sorted(frame["account"].unique()), key="audit_who")
        st.dataframe(frame[frame["account"].isin(who)] if who else frame, hide_index=True, width="stretch")
