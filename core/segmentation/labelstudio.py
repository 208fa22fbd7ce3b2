"""A wound segmenter as a Label Studio ML backend: Label Studio's HTTP protocol, on the standard library.

The protocol is the one of ``label_studio_ml/api.py`` (github.com/HumanSignal/label-studio-ml-backend),
as Label Studio's ``ml/api_connector.py`` calls it:

- ``GET /health`` (and ``GET /``) → ``{"status": "UP", "model_class": …}``;
- ``POST /setup`` ``{"project", "schema": label config, …}`` → ``{"model_version": …}``;
- ``POST /predict`` ``{"tasks": [...], "label_config": …, "project", "params"}`` →
  ``{"results": [{"result": [...], "score", "model_version"}, …]}``, one prediction per task, in order;
- ``POST /webhook`` (Label Studio's annotation events): acknowledged; training happens in TriDerm
  (``python -m core.train_segmenter``), not from Label Studio.

Each wound component of the segmenter (:func:`~core.segmentation.interactive.wound_components`: probability
≥ its threshold, holes filled, at least the minimum wound area) is one region: a ``polygonlabels``
polygon (its exact pixel outline) when the labeling configuration has a ``PolygonLabels`` tag on the
photo's ``Image`` (and the outline is one ring), else a ``brushlabels`` brush; its label the tag's ``wound``
label (any case), else its first; its ``score`` the mean probability inside it (the task's, the mean over its regions).

A task's photo (the ``Image`` tag's ``$value`` in ``data``) is read as import reads it
(:func:`annotations.io.readers.load_photo`): a local-files URL (``/data/local-files/?d=path``) from below
``document_root`` (a path leading outside it is refused), or, without one, from Label Studio; any other
URL of Label Studio's (relative, or on ``label_studio_url``'s origin) is fetched with the API key (a
legacy token, or a personal access token exchanged at ``/api/token/refresh``), without following
redirects, within :data:`FETCH_TIMEOUT` seconds; other URLs are refused. A request that cannot be served
(no usable tag, an unreadable photo) is one error naming the task and the reason, and no prediction is made.
"""
from __future__ import annotations

import json
import logging
import tempfile
import threading
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urljoin, urlsplit

import numpy as np
from PIL import Image

from annotations.io.formats import labelstudio_region
from annotations.io.readers import IMAGE_SUFFIXES, MAX_FILE_BYTES, DatasetError, load_photo
from core.segmentation.interactive import wound_components
from core.segmentation.model import Segmenter

log = logging.getLogger(__name__)

#: Seconds allowed for each request to Label Studio (connecting and each read).
FETCH_TIMEOUT = 30.0
#: Largest request body read from Label Studio, in bytes.
MAX_BODY = 64 << 20
LOCAL_FILES = "/data/local-files/"
MODEL_CLASS = "TriDermSegmenter"


class BackendError(ValueError):
    """A request the backend cannot serve: answered 400 with this message."""


@dataclass(frozen=True)
class Tags:
    """Where predictions go in a labeling configuration: the ``Image`` tag, its task data key, the
    ``PolygonLabels``/``BrushLabels`` tags on it (either may be None) and the label each gives."""

    image: str
    value: str
    polygon: str | None
    brush: str | None
    polygon_label: str = ""
    brush_label: str = ""


def config_tags(config: Any) -> Tags:
    """The tags of a Label Studio labeling configuration (XML) that wound outlines go to."""
    if not isinstance(config, str) or not config.strip():
        raise BackendError("no labeling configuration (label_config / schema) in the request")
    try:
        root = ET.fromstring(config)
    except ET.ParseError as err:
        raise BackendError(f"the labeling configuration is not XML ({err})") from None
    for image in root.iter("Image"):
        name, value = image.get("name"), image.get("value", "")
        controls = {el.tag: el for el in root.iter() if el.tag in ("PolygonLabels", "BrushLabels")
                    and el.get("toName") == name and el.get("name")}
        if not name or not value.startswith("$") or not controls:
            continue
        labels = {tag: [str(lab.get("value")) for lab in el.iter("Label") if lab.get("value")]
                  for tag, el in controls.items()}
        empty = [controls[tag].get("name") for tag, values in labels.items() if not values]
        if empty:
            raise BackendError(f"the labeling configuration's tag {empty[0]!r} on Image {name!r} has no <Label>")
        label = {tag: next((v for v in values if v.lower() == "wound"), values[0]) for tag, values in labels.items()}
        polygon, brush = controls.get("PolygonLabels"), controls.get("BrushLabels")
        return Tags(name, value[1:], polygon.get("name") if polygon is not None else None,
                    brush.get("name") if brush is not None else None,
                    label.get("PolygonLabels", ""), label.get("BrushLabels", ""))
    raise BackendError("the labeling configuration has no <Image value=\"$…\"> with a PolygonLabels or BrushLabels "
                       "tag on it (toName)")


class PhotoSource:
    """Reads a task's photo from its URL (see the module's docstring)."""

    def __init__(self, document_root: Path | None = None, label_studio_url: str | None = None,
                 api_key: str | None = None, timeout: float = FETCH_TIMEOUT) -> None:
        self.root = Path(document_root).resolve() if document_root is not None else None
        self.base = label_studio_url.rstrip("/") + "/" if label_studio_url else None
        self.api_key = api_key
        self.timeout = timeout
        self._opener = urllib.request.build_opener(_NoRedirect)

    def load(self, url: str) -> Image.Image:
        """The photo ``url`` names, upright and 8-bit; a BackendError says why it cannot be read."""
        parts = urlsplit(url)
        local = parse_qs(parts.query).get("d") if parts.path == LOCAL_FILES and not parts.scheme else None
        if local and self.root is not None:
            path = (self.root / local[0].lstrip("/")).resolve()  # parse_qs has URL-decoded it
            if not path.is_relative_to(self.root):
                raise BackendError(f"{url!r:.200}: leads outside the document root {self.root}; refused")
            return _photo(path, url)
        if self.base is None:
            raise BackendError(f"{url!r:.200}: give --document-root (local files) or --label-studio-url to read it")
        full = urljoin(self.base, url)
        if urlsplit(full)[:2] != urlsplit(self.base)[:2]:
            raise BackendError(f"{url!r:.200}: not a URL of Label Studio ({self.base}); only its files are read")
        suffix = Path(local[0] if local else unquote(urlsplit(full).path)).suffix.lower()
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"photo{suffix}"
            path.write_bytes(self._fetch(full))
            return _photo(path, url)

    def _headers(self) -> dict[str, str]:
        """Label Studio's authorization: ``Token`` for a legacy token; a personal access token (a JWT)
        is exchanged for an access token first."""
        if not self.api_key:
            return {}
        if self.api_key.count(".") != 2:
            return {"Authorization": f"Token {self.api_key}"}
        body = json.dumps({"refresh": self.api_key}).encode()
        request = urllib.request.Request(urljoin(str(self.base), "api/token/refresh"), body,
                                         {"Content-Type": "application/json"})
        access = json.loads(self._read(request)).get("access")
        if not isinstance(access, str):
            raise BackendError("Label Studio gave no access token for the API key (api/token/refresh)")
        return {"Authorization": f"Bearer {access}"}

    def _fetch(self, url: str) -> bytes:
        return self._read(urllib.request.Request(url, headers=self._headers()))

    def _read(self, request: urllib.request.Request) -> bytes:
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                data = response.read(MAX_FILE_BYTES + 1)
        except urllib.error.HTTPError as err:
            raise BackendError(f"{request.full_url}: Label Studio answered {err.code} {err.reason}") from None
        except (urllib.error.URLError, OSError) as err:  # TimeoutError is an OSError
            reason = getattr(err, "reason", err)
            raise BackendError(f"{request.full_url}: Label Studio cannot be reached ({reason})") from None
        if len(data) > MAX_FILE_BYTES:
            raise BackendError(f"{request.full_url}: more than {MAX_FILE_BYTES:,} bytes")
        return data


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Redirects are errors: the API key is never sent on to another address."""

    def redirect_request(self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any,
                         newurl: str) -> None:
        raise urllib.error.HTTPError(req.full_url, code, f"redirect to {newurl} not followed", headers, fp)


def _photo(path: Path, url: str) -> Image.Image:
    if path.suffix.lower() not in IMAGE_SUFFIXES:
        raise BackendError(f"{url!r:.200}: not a photo ({', '.join(IMAGE_SUFFIXES)})")
    if not path.is_file():
        raise BackendError(f"{url!r:.200}: no such photo ({path})")
    try:
        return load_photo(path)
    except DatasetError as err:
        raise BackendError(f"{url!r:.200}: {err}") from None


class Backend:
    """The segmenter's suggestions in Label Studio's prediction format."""

    def __init__(self, segmenter: Segmenter, min_area: int, photos: PhotoSource) -> None:
        self.segmenter = segmenter
        self.min_area = min_area
        self.photos = photos
        self.model_version = "triderm-" + segmenter.source.replace(" ", "-")
        self._lock = threading.Lock()  # one photo through the network at a time (its cache is not thread-safe)

    def setup(self, body: dict[str, Any]) -> dict[str, Any]:
        """``/setup``: the configuration is checked, the model version returned."""
        config_tags(body.get("schema"))
        return {"model_version": self.model_version}

    def predict(self, body: dict[str, Any]) -> dict[str, Any]:
        """``/predict``: one prediction per task, in the tasks' order."""
        tags = config_tags(body.get("label_config"))
        tasks = body.get("tasks")
        if not isinstance(tasks, list):
            raise BackendError("the request has no list of tasks")
        return {"results": [self.predict_task(task, tags) for task in tasks]}

    def predict_task(self, task: Any, tags: Tags) -> dict[str, Any]:
        """The wound regions of one task's photo."""
        data = task.get("data") if isinstance(task, dict) else None
        url = data.get(tags.value) if isinstance(data, dict) else None
        where = f"task {task.get('id', '?') if isinstance(task, dict) else '?'}"
        if not isinstance(url, str):
            raise BackendError(f"{where}: data has no photo URL {tags.value!r} (the Image tag's value)")
        try:
            photo = self.photos.load(url)
        except BackendError as err:
            raise BackendError(f"{where}: {err}") from None
        with self._lock:
            prob = self.segmenter.probability(photo)
        masks = wound_components(prob, self.min_area, threshold=self.segmenter.threshold)
        scores = [float(prob[m].mean()) for m in masks]
        try:
            regions = [{**labelstudio_region(m, tags.polygon_label, tags.polygon, tags.brush, tags.image), "score": s}
                       for m, s in zip(masks, scores)]
        except ValueError as err:
            raise BackendError(f"{where}: {err}") from None
        for region in regions:
            if region["type"] == "brushlabels":
                region["value"]["brushlabels"] = [tags.brush_label]
        return {"result": regions, "score": float(np.mean(scores)) if scores else 0.0,
                "model_version": self.model_version}


def make_server(backend: Backend, host: str = "127.0.0.1", port: int = 9090) -> ThreadingHTTPServer:
    """An HTTP server answering Label Studio's ML backend protocol for ``backend`` (not yet serving)."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s %s", self.address_string(), format % args)

        def _send(self, status: int, payload: dict[str, Any]) -> None:
            body = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if urlsplit(self.path).path in ("/", "/health"):
                self._send(200, {"status": "UP", "model_class": MODEL_CLASS, "model_version": backend.model_version})
            else:
                self._send(404, {"status": 404, "detail": f"no {self.path}"})

        def do_POST(self) -> None:
            route = {"/setup": backend.setup, "/predict": backend.predict, "/webhook": _webhook}.get(
                urlsplit(self.path).path)
            if route is None:
                self._send(404, {"status": 404, "detail": f"no {self.path}"})
                return
            try:
                self._send(200, route(self._body()))
            except BackendError as err:
                log.warning("%s: %s", self.path, err)
                self._send(400, {"status": 400, "detail": str(err)})
            except Exception as err:  # the protocol's answer to any failure: 500 with the reason
                log.exception("%s failed", self.path)
                self._send(500, {"status": 500, "detail": f"{type(err).__name__}: {err}"})

        def _body(self) -> dict[str, Any]:
            try:
                length = int(self.headers.get("Content-Length", "0"))
            except ValueError:
                raise BackendError("Content-Length is not a number") from None
            if not 0 <= length <= MAX_BODY:
                raise BackendError(f"the request body must hold 0 to {MAX_BODY:,} bytes, not {length:,}")
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except (ValueError, RecursionError) as err:
                raise BackendError(f"the request body is not JSON ({err})") from None
            if not isinstance(body, dict):
                raise BackendError("the request body must be a JSON object")
            return body

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server


def _webhook(body: dict[str, Any]) -> dict[str, Any]:
    """Label Studio's events (annotation created, start training …): acknowledged, not acted on."""
    return {"status": "ok", "detail": f"{body.get('action', 'event')} ignored: TriDerm trains its segmenter "
                                      "itself (python -m core.train_segmenter)"}
