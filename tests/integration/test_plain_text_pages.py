"""Text from data drawn by plotly on the app's pages (AppTest): HTML in it reaches the chart escaped."""
from __future__ import annotations

import json

from annotations.followup import followup
from tests.integration.test_app_pages import add_test_embedding, app


def test_the_explore_map_draws_text_from_data_as_text(ws):
    """plotly reads HTML in trace names and point texts: a track id holding a link reaches it escaped."""
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
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)  # (its JSON writes "<" as \\u003c)
    assert "evil.example" in json.dumps(spec) and "<a href" not in json.dumps(spec)
    assert any(t.get("name") == "track &lt;a href=&#x27;http://evil.example/&#x27;&gt;T1&lt;/a&gt;" for t in spec["data"])
