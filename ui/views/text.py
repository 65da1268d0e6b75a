"""What every page shows the same way: a table cell (a dash when missing), a version's name, a time, and chat text
shown exactly as typed."""
from __future__ import annotations

import math
import re
from typing import Any, Optional

from storage import Policy

DASH = "–"


def missing(value: Any) -> bool:
    """True for None, NaN and non-numbers that the tables show as a dash."""
    if value is None or isinstance(value, bool):
        return True
    try:
        return math.isnan(float(value))
    except (TypeError, ValueError):
        return True


def fmt(value: Any, digits: int = 2, percent: bool = False) -> str:
    """A number for a table cell; a dash when it is missing."""
    if missing(value):
        return DASH
    value = float(value)
    return f"{value * 100:.{digits}f}%" if percent else f"{value:.{digits}f}"


def version_label(policy: Policy) -> str:
    """Short name of a version: ``v3``, or ``v0 · base`` for the base model."""
    return f"v{policy.version}" + (" · base" if policy.is_base else "")


def status_label(policy: Policy) -> str:
    """Version name with its status, for dropdowns and reveals."""
    return f"{version_label(policy)} ({policy.status})"


def short_time(stamp: Optional[str]) -> str:
    """ISO UTC timestamp as ``YYYY-MM-DD HH:MM``."""
    return stamp[:16].replace("T", " ") if stamp else DASH


# The Chatbot renders Markdown and (sanitized) HTML: a reply that writes <b> or <script> would lose those
# characters on screen, and the rater would judge something else than what was said. Markdown cannot be
# trusted to say where code starts (a fence needs a line start, a span matching backtick runs, an
# indented block four spaces), and inside code an escape shows as "&lt;" while outside it raw HTML
# renders. So nothing is left to Markdown: every character that opens raw HTML, an entity, code
# (backtick, tilde, deep indentation), a link or image ([) or a backslash escape becomes an entity, the
# same way everywhere. Emphasis, lists, headings and block quotes (> stays) still format the text.
_INERT = str.maketrans({"&": "&amp;", "<": "&lt;", "`": "&#96;", "~": "&#126;", "[": "&#91;", "\\": "&#92;"})
_INDENT = re.compile(r"^[ \t]+", re.M)


def _keep_indent(match: re.Match) -> str:
    width = len(match.group(0).expandtabs(4))
    return "&nbsp;" * width if width >= 4 else match.group(0)  # 4+ columns would open a code block


def literal_html(text: str) -> str:
    """Chat text for a Markdown view that shows HTML, code fences and links exactly as typed."""
    return _INDENT.sub(_keep_indent, text.translate(_INERT))


def literal_chat(messages: list[dict]) -> list[dict]:
    """Chatbot messages with ``literal_html`` applied to each content."""
    return [{**m, "content": literal_html(m["content"])} for m in messages]
