"""Triplet judgments, asking whether the query photo is more like the left or the right reference.

Made for judging wounds: the three photos fill a 1366-px screen (sidebar collapsed, narrow
margins), each cropped around its outlined wounds (the whole photo one key away, outlines on/off by
key; a small wound fills about half its picture); any photo opens in a zoom (button or key) fitted to its
wounds, 2× / 4× closer or the whole photo, with pan buttons; descriptions are optional. The answer loop is a
fragment: an answer reruns only the loop, and the next triplet is drawn and its pictures rendered
while the annotator looks at the current one, so the next photos appear at once. Undo takes back the
newest answer stored in the last hour, from the store itself, so it survives a page reload.
Annotators see their own progress only — agreement scores are for admins (Review page), since
showing them to the people being measured biases them.
"""

from __future__ import annotations

import streamlit as st

from app import auth, navigation, triplets

ws = navigation.page("Triplet judgments", need="annotate", compact=True)
st.html(triplets.ZOOM_CSS)
name = auth.annotator()
sched = triplets.scheduler(ws, name)
state = st.session_state
state.setdefault("pending", [])  # questions put aside by an undo
state.setdefault("whole_photo", False)
state.setdefault("outlines", True)
triplets.answer_loop(triplets.Judging(ws, name, auth.actor(), sched))
