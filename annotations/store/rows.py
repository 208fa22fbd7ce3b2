"""The row values the store's queries share: timestamps, natural keys and the JSON columns.

Below :mod:`annotations.store.store` and the query modules it composes (:mod:`~annotations.store.run_records`,
:mod:`~annotations.store.revisions`, :mod:`~annotations.store.readings`, :mod:`~annotations.store.erasure`,
:mod:`~annotations.store.accounts`, :mod:`~annotations.store.leases`), so that none of them imports another.
"""
from __future__ import annotations

import json
import sqlite3
from datetime import datetime, timezone
from typing import Any

_JSON_COLUMNS = ("metadata", "bbox", "config", "metrics", "artifacts")

#: Any error of the store's database (a locked or full disk, a file that is not a store), for callers
#: outside the store layer that report it without importing sqlite3
StoreError = sqlite3.Error
#: The store's operational errors (database locked, disk full), a kind of :data:`StoreError`
StoreOperationalError = sqlite3.OperationalError

#: Actor of writes made by code that names nobody (scripts, tests); people and jobs pass their own.
SYSTEM_ACTOR = "system"


def now() -> str:
    """UTC timestamp in ISO 8601 with milliseconds."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def _decode(row: dict[str, Any]) -> dict[str, Any]:
    for col in _JSON_COLUMNS:
        if col in row and isinstance(row[col], str):
            row[col] = json.loads(row[col])
    return row


def where_equal(**columns: Any) -> tuple[str, list[Any]]:
    """`` WHERE a = ? AND b = ?`` for the columns given a value (not None) and their arguments; ``("", [])`` for none."""
    given = {name: value for name, value in columns.items() if value is not None}
    return (" WHERE " + " AND ".join(f"{name} = ?" for name in given) if given else ""), list(given.values())


def key_json(key: Any) -> str:
    """The canonical JSON of a row's natural key, as stored in ``revisions.key``."""
    return json.dumps(key, sort_keys=True, default=_json_default)


def wound_key(image_id: str, wound_index: int) -> dict[str, Any]:
    """The revision key of a wound."""
    return {"image_id": image_id, "wound_index": int(wound_index)}


def triplet_key(row: dict[str, Any]) -> dict[str, Any]:
    """The revision key of a judgment: source, anchor, references and repeat number."""
    return {k: row[k] for k in ("source", "anchor", "ref_j", "ref_k")} | {"rep": int(row["rep"])}


def image_file_value(file: str, sha256: str, width: int, height: int) -> dict[str, Any]:
    """An image's file as one revision/merge value."""
    return {"file": file, "sha256": sha256, "width": int(width), "height": int(height)}


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=_json_default)


def _dumps(value: Any) -> str:
    return json.dumps(value if value is not None else {}, sort_keys=True, default=_json_default)


def _json_default(value: Any) -> Any:
    if hasattr(value, "tolist"):  # numpy scalars and arrays
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
