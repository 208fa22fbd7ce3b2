"""Text shown as itself: data escaped for Streamlit's Markdown, and the plain-text run status."""

from __future__ import annotations

import re

#: Characters that start Markdown or HTML anywhere in a line (emphasis, code, links, images, HTML, tables,
#: strikethrough, math, entities, e-mail autolinks), escaped wherever they occur.
_MD_SPECIAL = frozenset("\\`*_{}[]<>#|~$&@")
#: Markdown that only starts at certain places: a list, quote or rule marker at a line's start, a ``www.`` or
#: ``scheme:`` autolink, a ``:shortcode:``, ``:material/icon:`` or ``:colour[text]`` directive.
_MD_PLACED = re.compile(r"(?m)^(\s*)([-+=]|\d+(?=[.)]))|(?i:\b(www)\.)|:(?=[\w\[/])")


def escape_md(text: str | None) -> str:
    """Text from data (names, ids, descriptions, file contents, error messages) shown as itself wherever
    Streamlit renders Markdown (messages, captions, headings, labels): no formatting, link, image, HTML,
    emoji or colour comes from it. Empty for None."""
    if not text:
        return ""
    out = "".join("\\" + ch if ch in _MD_SPECIAL else ch for ch in str(text))

    def placed(m: re.Match) -> str:
        if m.group(2) is not None:  # a line-start marker: "- ", "+ ", "=", "1." → escaped
            return f"{m.group(1)}{m.group(2)}\\" if m.group(2)[0].isdigit() else f"{m.group(1)}\\{m.group(2)}"
        if m.group(3) is not None:
            return f"{m.group(3)}\\."
        return "\\:\u2060"  # a word joiner after the colon: no shortcode or directive starts here

    return _MD_PLACED.sub(placed, out)



def status_badge(status: str) -> str:
    """Plain-text run status (no emoji: clinical workstations often lack emoji fonts)."""
    return {"running": "● running", "done": "✓ done", "failed": "✗ failed", "stopped": "■ stopped",
            "interrupted": "⚠ interrupted"}.get(status, status)
