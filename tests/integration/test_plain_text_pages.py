"""Text from data drawn on the app's charts (AppTest): it reaches the chart as the text it is."""
from __future__ import annotations

import json

from annotations.followup import followup
from tests.integration.test_app_pages import add_test_embedding, app


def test_the_explore_map_draws_text_from_data_as_text(ws):
    """Vega-Lite draws text marks and tooltips as text (no HTML is read): a track id holding a link reaches the
    map unchanged, not escaped twice (the browser test checks what is drawn)."""
    track = "<a href='http://evil.example/'>T1</a>"
    photos = [i["image_id"] for i in ws.store.images() if ws.store.wounds(i["image_id"])]
    patient = ws.store.image(photos[0])["patient_id"]
    photos = [p for p in photos if ws.store.image(p)["patient_id"] == patient][:2]
    for n, image_id in enumerate(photos):
        followup.set_visit_date(ws.store, image_id, f"2024-0{n + 1}-01")
        followup.set_track(ws.store, image_id, ws.store.wounds(image_id)[0]["wound_index"], track)
    add_test_embedding(ws)
    at = app("explore", timeout=300)
    at.selectbox(key="explore_track").select(track).run()
    assert not at.exception, at.exception
    spec = json.loads(at.get("vega_lite_chart")[0].proto.spec)
    tracks = {v["track"] for layer in spec["layer"] if layer["mark"]["type"] == "line" for v in layer["data"]["values"]}
    assert tracks == {track}
    assert all(layer["mark"]["type"] in ("point", "line", "text") for layer in spec["layer"])
