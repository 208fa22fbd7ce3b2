"""Revision history: read every recorded change and restore an earlier state.

Every write through the store records a revision (who, when, which row and field, old and new
value); :func:`restore_revision` puts back the value a revision replaced — a description, the
metadata, a wound's exact outline pixels, a deleted wound or an undone judgment — and the
restore itself is recorded (action ``restore``).
"""
from __future__ import annotations

import json
from typing import Any

import numpy as np

from annotations.infra.workspace import Workspace, outline_of, outline_pixels
from annotations.io.readers import DatasetError


def history_lines(ws: Workspace, entity: str | None = None, key: Any = None) -> list[str]:
    """One line per revision, oldest first: ``#id time actor action entity key field: old → new``."""
    return [f"#{r['id']} {r['created']} {r['actor']} {r['action']} {r['entity']} "
            f"{json.dumps(r['key'], sort_keys=True)} {r['field']}: {short(r['old'])} → {short(r['new'])}"
            for r in ws.store.revisions(entity, key)]


def short(value: Any) -> str:
    """A value for one line of history (outlines by size and place)."""
    if isinstance(value, dict) and "png" in value:
        return f"outline {value['area']} px at {value['bbox']}"
    if isinstance(value, dict) and isinstance(value.get("outline"), dict):
        value = {**value, "outline": short(value["outline"])}
    text = json.dumps(value, sort_keys=True, ensure_ascii=False)
    return text if len(text) <= 80 else text[:77] + "..."


def restore_revision(ws: Workspace, revision_id: int, actor: str) -> str:
    """Put back the value revision ``revision_id`` replaced (undo that change); returns a
    one-line account. Raises :class:`DatasetError` when it cannot be restored."""
    store = ws.store
    rev = store.revision(revision_id)
    if rev is None:
        raise DatasetError(f"no revision #{revision_id}")
    entity, key, name, old = rev["entity"], rev["key"], rev["field"], rev["old"]
    with store.restoring():
        if entity == "wounds":
            _restore_wound(ws, key, name, old, actor)
        elif entity == "triplets":
            _restore_triplet(ws, key, old, actor)
        elif entity == "images" and name in ("patient_id", "metadata"):
            img = store.image(key)
            if img is None:
                raise DatasetError(f"revision #{revision_id}: photo {key} no longer exists")
            img[name] = old
            store.upsert_image(key, img["file"], img["sha256"], img["width"], img["height"], img["patient_id"],
                               img["metadata"], actor=actor)
        elif entity == "images" and name == "done":
            store.set_done(key, bool(old), actor=actor)
        elif entity == "patients" and name == "metadata" and rev["action"] != "insert":
            store.upsert_patient(key, old, actor=actor)
        else:
            raise DatasetError(f"revision #{revision_id} ({rev['action']} of {entity} {name}) cannot be "
                               "restored: the photo's bytes are not kept in the history")
    return f"restored {entity} {json.dumps(key, sort_keys=True)} {name} to its state before revision #{revision_id}"


def _restore_wound(ws: Workspace, key: dict, name: str, old: Any, actor: str) -> None:
    store = ws.store
    image_id, index = key["image_id"], int(key["wound_index"])
    current = store.wound(image_id, index)
    if name == "row" and old is None:  # undo an insert: the wound goes
        labels = ws.load_mask(image_id).copy()
        labels[labels == index] = 0
        ws.save_mask(image_id, labels)
        store.delete_wound(image_id, index, actor=actor)
        return
    if name in ("description", "metadata"):
        if current is None:
            raise DatasetError(f"wound {index} of {image_id} no longer exists; restore its deletion first")
        current[name] = old
        store.upsert_wound(image_id, index, current["area"], current["bbox"], current["description"],
                           current["metadata"], actor=actor)
        return
    outline = old["outline"] if name == "row" else old
    if not isinstance(outline, dict) or "png" not in outline:
        raise DatasetError(f"wound {index} of {image_id}: this revision kept no outline pixels")
    if name == "outline" and current is None:
        raise DatasetError(f"wound {index} of {image_id} no longer exists; restore its deletion first")
    if name == "row" and current is not None:
        raise DatasetError(f"wound {index} of {image_id} exists again; its number is taken")
    labels = ws.load_mask(image_id).copy()
    x0, y0, x1, y1 = outline["bbox"]
    crop = np.zeros(labels.shape, dtype=bool)
    crop[y0:y1, x0:x1] = outline_pixels(outline)
    labels[labels == index] = 0
    labels[crop & (labels == 0)] = index  # never over another wound
    value = outline_of(labels, index)
    if value is None:
        raise DatasetError(f"wound {index} of {image_id}: its old pixels now all belong to other wounds")
    ws.save_mask(image_id, labels)
    base = old if name == "row" else current
    assert base is not None  # an outline revision needs the wound to exist (checked above)
    store.upsert_wound(image_id, index, value["area"], value["bbox"], base["description"], base["metadata"],
                       actor=actor, outline=value)


def _restore_triplet(ws: Workspace, key: dict, old: dict | None, actor: str) -> None:
    store = ws.store
    cols = ("source", "anchor", "ref_j", "ref_k", "rep")
    row = store.db.execute("SELECT id FROM triplets WHERE source = ? AND anchor = ? AND ref_j = ? AND ref_k = ? "
                           "AND rep = ?", [key[c] for c in cols]).fetchone()
    if old is None:  # undo an answer
        if row is not None:
            store.delete_triplet(row[0], actor=actor)
        return
    if row is not None:
        store.delete_triplet(row[0], actor=actor)
    store.add_triplet(key["anchor"], key["ref_j"], key["ref_k"], old["choice"], key["source"],
                      latency_ms=old.get("latency_ms"), rep=key["rep"], created=old.get("created"), actor=actor)


def readable(value: Any, limit: int = 120) -> str:
    """A revision's old or new value as a person reads it: ``field: value`` pairs, lists comma-separated,
    nothing as an em dash (no Python dicts or quotes)."""
    if value is None or value == "" or value == {}:
        return "—"
    if isinstance(value, dict):
        text = " · ".join(f"{str(k).replace('_', ' ')}: {readable(v, limit)}" for k, v in value.items()
                          if v not in (None, "", {}, []))
    elif isinstance(value, (list, tuple)):
        text = ", ".join(readable(v, limit) for v in value)
    else:
        text = str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def audit_rows(revisions: list[dict[str, Any]], last: int = 300) -> list[dict[str, Any]]:
    """The audit trail's table: the ``last`` revisions, newest first, each value :func:`readable`."""
    return [{"when": r["created"][:19].replace("T", " "), "account": r["actor"], "entity": r["entity"],
             "row": readable(r["key"]), "field": r["field"], "action": r["action"], "old": readable(r["old"]),
             "new": readable(r["new"])} for r in revisions[-last:][::-1]]
