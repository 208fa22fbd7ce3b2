"""Against the real Label Studio: TriDerm's outlines there and back, and TriDerm's suggestions inside it.

Label Studio runs from its own venv (``make labelstudio-venv``; path ``$TRIDERM_LABEL_STUDIO_VENV``, default
``.venv-labelstudio``), on the loopback with a temporary data dir; ``tests/labelstudio/ls_driver.py`` drives
it through ``label-studio-sdk`` in that venv. Skipped, with the reason, when the venv is absent.

1. Round trip: a workspace (Medetec photos when /work/shared/data/medetec is there, and a drawn photo
   whose wounds have a hole, two parts, labels and descriptions) → ``annotations export --format labelstudio``
   → imported with its predictions → each submitted as an annotation → the API's JSON export →
   ``annotations convert`` → the same wounds (count, ids, indices, descriptions) and areas (0.5 %); every
   brush region decoded by the SDK's own decoder has the wound's area.
2. ML backend: ``triderm ml-backend`` connected to a project; Label Studio retrieves its predictions (the
   backend fetching the photos from Label Studio with a personal access token, exchanged for an access
   token); accepted and exported, they convert to the default segmenter's wound components.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from annotations.__main__ import main as annotations_main
from annotations.infra.workspace import Workspace
from annotations.io.dataset import import_dataset

pytestmark = [pytest.mark.labelstudio, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("TRIDERM_LABEL_STUDIO_VENV", REPO / ".venv-labelstudio"))
MEDETEC = Path("/work/shared/data/medetec")
MEDETEC_PHOTOS = 6  # the first, by name
TOKEN = "triderm0test0token0123456789"
#: seconds for Label Studio's first start (its database migrations): 90–150 s on 2 cores, over 300 s under heavy load
START_TIMEOUT = 900
AREA_TOLERANCE = 0.005
#: a clinic's own labeling configuration: polygons only, the wound label among others
POLYGONS = ('<View><Image name="photo" value="$image"/><PolygonLabels name="region" toName="photo">'
            '<Label value="Skin"/><Label value="Wound"/></PolygonLabels></View>')


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(url: str, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    """Wait until ``url`` answers 200; fail with the log's tail when the process ends or time runs out."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if proc.poll() is not None:
            pytest.fail(f"{url}: the server exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(1)
    pytest.fail(f"{url}: no answer within {timeout} s:\n{log.read_text()[-3000:]}")


def _stop(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Workspace:
    """Medetec photos (when present) and a drawn photo: a disc with a hole (brush), two squares that are one
    wound (brush), an L-shape (polygon); labels and descriptions."""
    root = tmp_path_factory.mktemp("ls-ws")
    ws = Workspace(root / "ws")
    if MEDETEC.is_dir():
        real = root / "medetec"
        for sub in ("images", "masks"):
            (real / sub).mkdir(parents=True)
            for name in sorted(p.name for p in (MEDETEC / "images").glob("*.png"))[:MEDETEC_PHOTOS]:
                shutil.copyfile(MEDETEC / sub / name, real / sub / name)
        import_dataset(ws, real)
    drawn = root / "drawn"
    (drawn / "images").mkdir(parents=True)
    (drawn / "masks").mkdir()
    labels = np.zeros((90, 120), np.uint8)
    yy, xx = np.mgrid[:90, :120]
    r2 = (xx - 30) ** 2 + (yy - 30) ** 2
    labels[(r2 <= 400) & (r2 > 36)] = 1
    labels[60:80, 70:80] = 2
    labels[75:80, 80:110] = 2
    labels[10:20, 80:90] = labels[30:40, 100:110] = 3
    photo = np.full((90, 120, 3), (220, 185, 165), np.uint8)
    photo[labels > 0] = (150, 50, 45)
    Image.fromarray(photo).save(drawn / "images" / "drawn.png")
    Image.fromarray(labels).save(drawn / "masks" / "drawn.png")
    (drawn / "wounds.csv").write_text("image_id,wound_index,description,label\ndrawn,1,ring ulcer,ulcer\n"
                                      "drawn,2,\"L, shaped\",scar\ndrawn,3,two parts,ulcer\n")
    (drawn / "dataset.json").write_text(json.dumps({"name": "drawn", "mask_format": "label"}))
    import_dataset(ws, drawn)
    return ws


@pytest.fixture(scope="module")
def label_studio(workspace, tmp_path_factory):
    """The URL of a Label Studio server on a free loopback port."""
    if not (VENV / "bin" / "label-studio").is_file():
        pytest.skip(f"no Label Studio venv at {VENV} (make labelstudio-venv, or set TRIDERM_LABEL_STUDIO_VENV)")
    data = tmp_path_factory.mktemp("ls-data")
    port = _free_port()
    env = {**os.environ, "LABEL_STUDIO_BASE_DATA_DIR": str(data), "LABEL_STUDIO_LOCAL_FILES_SERVING_ENABLED": "true",
           "LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT": str(workspace.root),
           # the ML backend listens on the loopback, which Label Studio refuses unless told (its webhook check too)
           "LABEL_STUDIO_ML_BLOCK_LOCAL_IP": "false", "LABEL_STUDIO_SSRF_PROTECTION_ENABLED": "false",
           # nothing leaves the machine: no error reports, analytics or version check
           "LABEL_STUDIO_SENTRY_DSN": "", "LABEL_STUDIO_FRONTEND_SENTRY_DSN": "",
           "LABEL_STUDIO_COLLECT_ANALYTICS": "false", "LABEL_STUDIO_LATEST_VERSION_CHECK": "false"}
    log = data / "label-studio.log"
    with log.open("w") as out:
        proc = subprocess.Popen([str(VENV / "bin" / "label-studio"), "start", "--no-browser", "--internal-host",
                                 "127.0.0.1", "--port", str(port), "--username", "test@triderm.invalid",
                                 "--password", "triderm-test", "--user-token", TOKEN, "--enable-legacy-api-token"],
                                env=env, cwd=data, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait(f"http://127.0.0.1:{port}/health", proc, log, START_TIMEOUT)
        yield f"http://127.0.0.1:{port}"
    finally:
        _stop(proc)


def _drive(label_studio: str, workspace: Workspace, tmp: Path, title: str, tasks: list[dict],
           config: str, ml_backend: str | None = None) -> dict:
    """ls_driver.py in Label Studio's venv: project, tasks, (ML backend,) annotations, export."""
    spec = {"url": label_studio, "token": TOKEN, "title": title, "label_config": config,
            "photos": str(workspace.images_dir), "tasks": tasks, "ml_backend": ml_backend}
    (tmp / "spec.json").write_text(json.dumps(spec))
    out = subprocess.run([str(VENV / "bin" / "python"), str(Path(__file__).with_name("ls_driver.py")),
                          str(tmp / "spec.json"), str(tmp / "out.json")], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads((tmp / "out.json").read_text())


def _convert(result: list[dict], tmp: Path, workspace: Workspace) -> Path:
    (tmp / "result.json").write_text(json.dumps(result))
    assert annotations_main(["convert", "--from", "labelstudio", str(tmp / "result.json"), str(tmp / "back"),
                             "--images", str(workspace.images_dir), "--min-area", "1"]) == 0
    return tmp / "back"


def test_outlines_go_to_label_studio_and_come_back(label_studio, workspace, tmp_path, capsys):
    assert annotations_main(["export", str(tmp_path / "ls"), "--format", "labelstudio",
                             "--workspace", str(workspace.root)]) == 0
    tasks = json.loads((tmp_path / "ls" / "tasks.json").read_text())
    kinds = {r["type"] for t in tasks for p in t.get("predictions", []) for r in p["result"]}
    assert kinds == {"polygonlabels", "brushlabels"}
    got = _drive(label_studio, workspace, tmp_path, "TriDerm round trip", tasks,
                 (tmp_path / "ls" / "label_config.xml").read_text())
    assert len(got["export"]) == len(tasks) and all(len(t["annotations"]) == 1 for t in got["export"])
    capsys.readouterr()
    back = _convert(got["export"], tmp_path, workspace)
    summary = json.loads(capsys.readouterr().out)
    wounds = workspace.store.wounds()
    assert (summary["images"], summary["wounds"]) == (len(workspace.store.images()), len(wounds))
    rows = (back / "wounds.csv").read_text().splitlines()
    assert len(rows) == len(wounds) + 1 and 'drawn,2,"L, shaped",scar' in rows and "drawn,3,two parts,ulcer" in rows
    for w in wounds:
        area = int((np.array(Image.open(back / "masks" / f"{w['image_id']}.png")) == w["wound_index"]).sum())
        assert abs(area - w["area"]) <= AREA_TOLERANCE * w["area"], (w["image_id"], w["wound_index"], area, w["area"])
    drawn = next(t["id"] for t in got["export"] if t["data"]["triderm_image_id"] == "drawn")
    assert got["brush_areas"] == {f"{drawn}/wound-{i}": workspace.store.wounds("drawn")[i - 1]["area"] for i in (1, 3)}


def test_label_studio_retrieves_triderm_suggestions(label_studio, workspace, tmp_path, capsys):
    from core.segmentation.interactive import wound_components
    from core.segmentation.model import load_default

    request = urllib.request.Request(f"{label_studio}/api/token/", b"", {"Authorization": f"Token {TOKEN}"})
    with urllib.request.urlopen(request, timeout=30) as response:  # a personal access token (a JWT)
        personal = json.load(response)["token"]
    port = _free_port()
    log = tmp_path / "ml-backend.log"
    env = {**os.environ, "LABEL_STUDIO_API_KEY": personal, "PYTHONPATH": os.pathsep.join([str(REPO), *sys.path])}
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "triderm", "ml-backend", "--port", str(port), "--device", "cpu",
                                 "--label-studio-url", label_studio], env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait(f"http://127.0.0.1:{port}/health", proc, log, 120)
        images = workspace.store.images()[:3]
        tasks = [{"data": {"image": f"/data/local-files/?d=images/{img['file']}", "triderm_image_id": img["image_id"]}}
                 for img in images]
        got = _drive(label_studio, workspace, tmp_path, "TriDerm suggestions", tasks, POLYGONS,
                     ml_backend=f"http://127.0.0.1:{port}")
    finally:
        _stop(proc)
    assert got["ml_backend"] == "CO", log.read_text()[-3000:]  # connected: /health and /setup answered
    segmenter = load_default("cpu")
    expected = {img["image_id"]: wound_components(segmenter.probability(workspace.load_image(img["image_id"])),
                                                  workspace.min_wound_area, threshold=segmenter.threshold)
                for img in images}
    assert sum(map(len, expected.values())) > 0
    for task, predictions in zip(got["export"], got["predictions"], strict=True):
        masks = expected[task["data"]["triderm_image_id"]]
        assert [(p["model_version"], len(p["result"])) for p in predictions] == [("triderm-default", len(masks))]
        assert all(r["type"] == "polygonlabels" and r["value"]["polygonlabels"] == ["Wound"]
                   for r in predictions[0]["result"])
    capsys.readouterr()
    back = _convert(got["export"], tmp_path, workspace)
    for image_id, masks in expected.items():
        labels = np.array(Image.open(back / "masks" / f"{image_id}.png")) if masks else np.zeros(1)
        for k, mask in enumerate(masks, start=1):
            assert abs(int((labels == k).sum()) - int(mask.sum())) <= AREA_TOLERANCE * mask.sum(), (image_id, k)
