"""CSV cells a spreadsheet will not run as formulas (OWASP "CSV injection"), losslessly.

A text cell whose first character after any leading ``'`` is one of ``= + - @``, tab or carriage
return (:data:`TRIGGERS`) is written with one more ``'`` in front (:func:`neutralise`): Excel,
LibreOffice and Google Sheets show it as text instead of evaluating it. A number (``-3.5``, or text
that reads as a plain number) is written as it is. Import removes exactly that one ``'``
(:func:`restore`), so import → export → import gives back the same values.
"""
from __future__ import annotations

import re
from typing import Any

#: First characters a spreadsheet reads as the start of a formula (or a DDE call).
TRIGGERS = ("=", "+", "-", "@", "\t", "\r")
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def _starts_with_trigger(text: str) -> bool:
    return text.lstrip("'").startswith(TRIGGERS)


def neutralise(value: Any) -> Any:
    """``value`` as a spreadsheet-safe CSV cell: text that could start a formula gets a leading ``'``;
    numbers, plain-number text and anything else are returned unchanged."""
    if isinstance(value, str) and _starts_with_trigger(value) and not _NUMBER.fullmatch(value):
        return "'" + value
    return value


def restore(text: str) -> str:
    """The value :func:`neutralise` wrote as ``text`` (one leading ``'`` removed where it added one)."""
    return text[1:] if text.startswith("'") and _starts_with_trigger(text) else text


def safe_row(row: dict[str, Any]) -> dict[str, Any]:
    """Every cell of a ``csv.DictWriter`` row neutralised."""
    return {k: neutralise(v) for k, v in row.items()}
