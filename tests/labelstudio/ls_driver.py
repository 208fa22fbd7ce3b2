"""Drives a running Label Studio through its SDK (``label-studio-sdk``); runs in Label Studio's own venv.

    python ls_driver.py SPEC.json OUT.json

SPEC: ``{"url", "token", "title", "label_config", "photos", "tasks", "ml_backend": URL or null}``. It
creates a project whose local-files storage is the folder ``photos`` (Label Studio serves
``/data/local-files/?d=…`` only below such a storage), imports the tasks (with their predictions), with
``ml_backend`` connects that ML backend and
has Label Studio retrieve its predictions for every task; then submits each task's predictions as an
annotation (as a person accepting them would), exports the project through the API (JSON, all tasks)
and decodes every brush region with the SDK's own decoder. OUT: ``{"export": …, "predictions":
[[prediction, …] per task], "ml_backend": the backend's state, "brush_areas": {"<task>/<region id>": pixels}}``.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from label_studio_sdk import LabelStudio
from label_studio_sdk.converter.brush import decode_rle

TIMEOUT = 120.0  # seconds for each API call (prediction retrieval runs the model on every task)


def main(spec_path: str, out_path: str) -> int:
    """Run SPEC against Label Studio, write OUT; returns the exit status."""
    spec = json.loads(Path(spec_path).read_text())
    client = LabelStudio(base_url=spec["url"], api_key=spec["token"], timeout=TIMEOUT)
    project = client.projects.create(title=spec["title"], label_config=spec["label_config"])
    client.import_storage.local.create(project=project.id, path=spec["photos"], title="photos", use_blob_urls=True)
    client.projects.import_tasks(project.id, request=spec["tasks"], return_task_ids=True)
    tasks = sorted(client.tasks.list(project=project.id), key=lambda t: t.id)
    state = None
    if spec.get("ml_backend"):
        backend = client.ml.create(project=project.id, url=spec["ml_backend"], title="TriDerm", timeout=TIMEOUT)
        state = client.ml.get(backend.id).state
        client.actions.create(id="retrieve_tasks_predictions", project=project.id,
                              selected_items={"all": True, "excluded": []})
    predictions = []
    for task in tasks:
        listed = sorted(client.predictions.list(task=task.id), key=lambda p: p.id)
        predictions.append([p.model_dump() for p in listed])
        for p in listed:
            client.annotations.create(task.id, result=p.result, project=project.id)
    export = json.loads(b"".join(client.projects.exports.download_sync(project.id, export_type="JSON",
                                                                        download_all_tasks=True)))
    export.sort(key=lambda t: t["id"])
    brush = {f"{t['id']}/{r.get('id')}": int((decode_rle(r["value"]["rle"])[3::4] >= 128).sum())
             for t in export for a in t["annotations"] for r in a["result"] if r["type"] == "brushlabels"}
    Path(out_path).write_text(json.dumps({"export": export, "predictions": predictions, "ml_backend": state,
                                          "brush_areas": brush}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
