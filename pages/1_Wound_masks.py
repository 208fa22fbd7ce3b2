"""Wound masks: outline each wound on the photo (zoom, vertex editing, undo), describe it.

A worklist beside the editor walks the photos (all, not outlined, with suggestions waiting, not marked
done, mine) with keyboard shortcuts; the photo on screen is kept in the address (``?photo=…``), so a
reload stays on it, and a photo is marked done in the store. The photo's part of the page is a Streamlit
fragment (:func:`app.outline.photo_area`): moving to another photo reruns only it, not the header and sidebar.
Deleting a wound asks first and can be undone (:func:`annotations.accounts.session.undo_delete`). Messages show
beside the photo, so at 1366×768 the photo and every message are in view. Without torch (an ``[app]``-only
server) the model's controls stay in place, disabled, their help naming the extra to install.

The label mask is the stored truth: the editor gets polygons derived from it and every saved
outline is rasterised back into it. Suggestions (the segmentation model) and click-to-outline
proposals become outlines only when the clinician accepts them. A photo an admin marked for second
reading is outlined blind into the annotator's own layer (annotations.followup.readings), apart from the truth.
"""

from __future__ import annotations

import streamlit as st

from annotations.followup import readings
from app import extras, navigation, outline

ws = navigation.page("Wound masks", need="annotate", compact=True)  # photo and tools in view at 1366×768
if not ws.store.images():
    st.info("No photos yet. Import a dataset folder or build the demo on the Home page.")
    st.stop()
outline.photo_area(ws, set(readings.marked(ws)), extras.extra_missing("torch"))
