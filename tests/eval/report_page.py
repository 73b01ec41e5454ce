"""Checks of a report page's HTML that every report test can apply: every table under a heading of its own, and no
Markdown backticks in the text a reader sees."""

from __future__ import annotations

import re
from html.parser import HTMLParser

HEADINGS = {"h1", "h2", "h3", "h4"}


class PageText(HTMLParser):
    """The visible text (not <style> or <script>), and each table's heading: the last heading before it, or None
    where another table came after that heading."""

    def __init__(self) -> None:
        super().__init__()
        self.text: list[str] = []
        self.table_headings: list[str | None] = []
        self._skip = 0
        self._heading: str | None = None
        self._last: str | None = None  # the latest heading not yet used by a table

    def handle_starttag(self, tag, attrs):
        if tag in ("style", "script"):
            self._skip += 1
        elif tag in HEADINGS:
            self._heading = ""
        elif tag == "table":
            self.table_headings.append(self._last)
            self._last = None

    def handle_endtag(self, tag):
        if tag in ("style", "script"):
            self._skip -= 1
        elif tag in HEADINGS and self._heading is not None:
            self._last, self._heading = self._heading.strip(), None

    def handle_data(self, data):
        if self._skip:
            return
        self.text.append(data)
        if self._heading is not None:
            self._heading += data


def check_page(page: str) -> PageText:
    """Parse ``page`` and assert the two rules; returns the parse for further checks."""
    p = PageText()
    p.feed(page)
    text = " ".join(p.text)
    assert "`" not in text, re.findall(r".{0,60}`.{0,60}", text)[:3]
    assert p.table_headings and all(p.table_headings), p.table_headings
    return p
