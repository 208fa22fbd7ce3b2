"""core.segmentation.labelstudio: the segmenter behind Label Studio's ML backend protocol, over HTTP.

Label Studio itself calls it in tests/labelstudio/; here the protocol's answers, the photos it reads
and the ones it refuses, with the default segmenter on the CPU.
"""
from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from shapely.geometry import Polygon

from annotations.infra.workspace import DEFAULT_MIN_WOUND_AREA
from annotations.io.formats import rasterize
from core.segmentation.interactive import wound_components
from core.segmentation.labelstudio import Backend, BackendError, PhotoSource, config_tags, make_server
from core.segmentation.model import load_default

MEDETEC = Path("/work/shared/data/medetec/images/foot-ulcer-0001.png")
CONFIG = ('<View><Image name="img" value="$photo"/><BrushLabels name="b" toName="img"><Label value="Skin"/>'
          '<Label value="Wound"/></BrushLabels><PolygonLabels name="p" toName="img"><Label value="ulcer"/>'
          '</PolygonLabels></View>')


def test_the_labeling_configuration_says_where_outlines_go():
    tags = config_tags(CONFIG)
    assert (tags.image, tags.value, tags.polygon, tags.brush) == ("img", "photo", "p", "b")
    assert (tags.polygon_label, tags.brush_label) == ("ulcer", "Wound")
    brush_only = config_tags('<View><Image name="i" value="$image"/><BrushLabels name="m" toName="i">'
                             '<Label value="a"/></BrushLabels></View>')
    assert (brush_only.polygon, brush_only.brush, brush_only.brush_label) == (None, "m", "a")
    for bad, message in [("", "no labeling configuration"), ("<View", "not XML"),
                         ('<View><Image name="i" value="$image"/><Choices name="c" toName="i"/></View>', "no <Image"),
                         ('<View><Image name="i" value="$image"/><PolygonLabels name="p" toName="i"/></View>',
                          "no <Label>")]:
        with pytest.raises(BackendError, match=message):
            config_tags(bad)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The backend on a free loopback port, photos below a document root (one real photo, or a drawn one)."""
    root = tmp_path_factory.mktemp("root")
    (root / "clinic").mkdir()
    if MEDETEC.is_file():
        Image.open(MEDETEC).save(root / "clinic" / "a.png")
    else:
        photo = np.full((160, 200, 3), (225, 190, 170), np.uint8)
        yy, xx = np.mgrid[:160, :200]
        photo[(xx - 90) ** 2 + (yy - 80) ** 2 < 40 ** 2] = (150, 40, 40)
        Image.fromarray(photo).save(root / "clinic" / "a.png")
    (root.parent / "secret.png").write_bytes((root / "clinic" / "a.png").read_bytes())
    (root / "clinic" / "link.png").symlink_to(root.parent / "secret.png")
    segmenter = load_default("cpu")
    httpd = make_server(Backend(segmenter, DEFAULT_MIN_WOUND_AREA, PhotoSource(root)), "127.0.0.1", 0)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", segmenter, root
    httpd.shutdown()
    httpd.server_close()


def _call(url: str, body: dict | bytes | None = None) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as err:
        return err.code, json.load(err)


def test_health_setup_and_webhook_answer_as_the_protocol_says(server):
    url, _, _ = server
    assert _call(url + "/health") == (200, {"status": "UP", "model_class": "TriDermSegmenter",
                                            "model_version": "triderm-default"})
    assert _call(url + "/setup", {"project": "3.1700000000", "schema": CONFIG}) == (200, {"model_version":
                                                                                          "triderm-default"})
    status, answer = _call(url + "/webhook", {"action": "ANNOTATION_CREATED"})
    assert status == 200 and answer["status"] == "ok"
    assert _call(url + "/setup", {"project": "3.1", "schema": "<View/>"})[0] == 400
    assert _call(url + "/nothing")[0] == 404


def test_predictions_are_the_segmenters_wound_components(server):
    url, segmenter, root = server
    tasks = [{"id": 7, "data": {"photo": "/data/local-files/?d=clinic/a.png"}},
             {"id": 8, "data": {"photo": "/data/local-files/?d=clinic%2Fa.png"}}]
    status, answer = _call(url + "/predict", {"tasks": tasks, "label_config": CONFIG, "project": "3.1"})
    assert status == 200 and len(answer["results"]) == 2 and answer["results"][0] == answer["results"][1]
    prediction = answer["results"][0]
    photo = Image.open(root / "clinic" / "a.png").convert("RGB")
    prob = segmenter.probability(photo)
    masks = wound_components(prob, DEFAULT_MIN_WOUND_AREA, threshold=segmenter.threshold)
    assert masks, "the photo should show a wound"
    assert prediction["model_version"] == "triderm-default"
    assert prediction["score"] == pytest.approx(np.mean([prob[m].mean() for m in masks]), rel=1e-5)
    w, h = photo.size
    for region, mask in zip(prediction["result"], masks, strict=True):
        assert (region["from_name"], region["to_name"], region["type"]) == ("p", "img", "polygonlabels")
        assert region["value"]["polygonlabels"] == ["ulcer"]
        assert (region["original_width"], region["original_height"]) == (w, h)
        points = [(x * w / 100, y * h / 100) for x, y in region["value"]["points"]]
        assert (rasterize(Polygon(points), (h, w)) == mask).all()


@pytest.mark.parametrize(("photo", "message"), [
    ("/data/local-files/?d=../secret.png", "outside the document root"),
    ("/data/local-files/?d=clinic/link.png", "outside the document root"),
    ("/data/local-files/?d=clinic/none.png", "no such photo"),
    ("/data/upload/3/a.png", "give --document-root"),
    ("/data/local-files/?d=clinic/a.txt", "not a photo"),
])
def test_a_photo_it_cannot_read_is_one_error_naming_the_task(server, photo, message):
    url, _, _ = server
    status, answer = _call(url + "/predict", {"tasks": [{"id": 9, "data": {"photo": photo}}], "label_config": CONFIG})
    assert status == 400 and answer["detail"].startswith("task 9: ") and message in answer["detail"]


def test_only_label_studios_own_urls_are_fetched(tmp_path):
    source = PhotoSource(label_studio_url="http://127.0.0.1:9", api_key="abc", timeout=2)
    with pytest.raises(BackendError, match="not a URL of Label Studio"):
        source.load("http://example.org/x.png")
    with pytest.raises(BackendError, match="cannot be reached"):  # port 9 (discard): nothing listens
        source.load("/data/upload/1/x.png")


def test_a_body_that_is_not_a_json_object_is_refused(server):
    url, _, _ = server
    assert _call(url + "/predict", b"[1, 2")[0] == 400
    status, answer = _call(url + "/predict", b"[]")
    assert status == 400 and "JSON object" in answer["detail"]


@pytest.mark.parametrize(("args", "message"), [(["--port", "70000"], "--port must lie between"),
                                               (["--document-root", "/nonexistent/x"], "not a folder")])
def test_the_job_refuses_bad_arguments_with_one_message(args, message, capsys):
    from core.ml_backend import main

    with pytest.raises(SystemExit) as stop:
        main(args)
    assert stop.value.code == 2 and message in capsys.readouterr().err
