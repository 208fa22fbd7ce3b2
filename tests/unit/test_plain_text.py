"""Text from data rendered as itself: :func:`app.markup.escape_md` leaves nothing a Markdown renderer would
turn into a link, an image, HTML, formatting, an emoji or a colour, and the reader still sees the text."""
from __future__ import annotations

import html
import re

import pytest
from markdown_it import MarkdownIt

from app import markup

PAYLOADS = [
    "![x](http://127.0.0.2/x.png)",
    "[link](http://evil)",
    "<img src=http://127.0.0.2/y.png onerror=alert(1)>",
    ":red[x] :smile: :material/home:",
    "http://127.0.0.2/z.png and www.evil.example and mail@evil.example",
    "**bold** _it_ `code` ~~gone~~ $x^2$ &lt;b&gt;",
    "# heading\n- item\n+ item\n1. first\n2) second\n> quote\n---\n| a | b |\n|---|---|",
    "leg-01: size 2.5 cm (left), 03:20",
]


def render(text: str) -> str:
    """``text`` as CommonMark with tables and strikethrough renders it (Streamlit renders GFM)."""
    return MarkdownIt("commonmark").enable(["table", "strikethrough"]).render(text)


@pytest.mark.parametrize("text", PAYLOADS)
def test_escaped_text_renders_as_one_plain_paragraph_of_the_same_text(text):
    out = render(markup.escape_md(text))
    assert set(re.findall(r"<(\w+)", out)) == {"p"}  # no link, image, HTML, heading, list, table, emphasis
    shown = html.unescape(re.sub(r"<[^>]+>", "", out)).replace("\u2060", "").strip()
    assert shown.split() == text.split()  # the words as typed (line breaks inside a paragraph aside)


def test_escaped_text_starts_no_shortcode_directive_or_autolink():
    out = markup.escape_md(PAYLOADS[3] + " " + PAYLOADS[4])
    assert not re.search(r":[\w-]+:|:\w+\[|https?://|\bwww\.|\w@\w", out)


def test_plain_text_is_left_readable_and_empty_stays_empty():
    assert markup.escape_md("Not saved: Ann changed leg-01.") == "Not saved: Ann changed leg-01."
    assert markup.escape_md(None) == markup.escape_md("") == ""
