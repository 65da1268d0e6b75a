"""What each open Chat page was last shown of a reply's labels, its unsaved note drafts, and one label write at a
time per person, in arrival order (no Gradio, no Store).

Label writes of different people run side by side (no queue for the whole server); one person's clicks are
stored in the order they arrived, so a thumb and its taking back land in that order. A page is a Gradio session
(two tabs are two pages): a click is checked against what *its* page showed, so a click on a view that another
tab or device changed since is refused instead of being applied to the other state.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from contextlib import contextmanager
from typing import Iterator, Optional

MAX_PAGES = 4000  # pages remembered (the oldest are forgotten: a forgotten page's clicks are not checked)


class LabelDesk:
    """Per page: the labels it shows for each reply, and its note drafts; per person: the turn of their writes."""

    def __init__(self, max_pages: int = MAX_PAGES) -> None:
        self._lock = threading.Lock()
        self._turned = threading.Condition(self._lock)
        self._pages: OrderedDict[str, dict] = OrderedDict()
        self._max = max_pages
        self._next: dict[str, int] = {}  # name -> the next ticket to hand out
        self._serving: dict[str, int] = {}  # name -> the ticket whose write runs now

    def _page(self, page: str) -> dict:
        entry = self._pages.pop(page, None) or {"seen": {}, "pending": {}, "drafts": {}}
        self._pages[page] = entry
        while len(self._pages) > self._max:
            self._pages.popitem(last=False)
        return entry

    def show(self, page: Optional[str], reply: Optional[int], name: Optional[str], pending: bool = False,
             **fields) -> None:
        """Remember that ``page`` now shows these label ``fields`` (thumb, score, flags, note) as ``name``'s on
        ``reply`` (a view under another name is forgotten). ``pending``: a re-read on its way to the page, which
        counts once the page says it shows it (``shown``): a click made before that is judged by the old view."""
        if page is None or reply is None:
            return
        with self._lock:
            entry = self._page(page)
            if pending:
                self._merge(entry["pending"], int(reply), name, fields)
                return
            for field in fields:  # a newer view of these fields than any re-read still on its way
                entry["pending"].get(int(reply), (None, {}))[1].pop(field, None)
            self._merge(entry["seen"], int(reply), name, fields)

    @staticmethod
    def _merge(seen: dict, reply: int, name: Optional[str], fields: dict) -> None:
        old = seen.get(reply)
        view = dict(old[1]) if old is not None and old[0] == name else {}
        seen[reply] = (name, {**view, **fields})

    def shown(self, page: Optional[str]) -> None:
        """The page shows the re-read it was sent: its view is now that one."""
        if page is None:
            return
        with self._lock:
            entry = self._page(page)
            for reply, (name, fields) in entry["pending"].items():
                self._merge(entry["seen"], reply, name, fields)
            entry["pending"].clear()

    def seen(self, page: Optional[str], reply: int, name: Optional[str]) -> Optional[dict]:
        """What ``page`` was last shown of ``name``'s labels on ``reply`` (field -> value); None when never shown."""
        if page is None:
            return None
        with self._lock:
            entry = self._pages.get(page, {}).get("seen", {}).get(int(reply))
        return dict(entry[1]) if entry is not None and entry[0] == name else None

    def point(self, page: Optional[str], reply: Optional[int]) -> None:
        """The page's panel now labels ``reply`` (None: the reply being written): a re-read sent for another reply
        before this is out of date and must not move the panel back."""
        if page is None:
            return
        with self._lock:
            self._page(page)["panel"] = None if reply is None else int(reply)

    def moved_from(self, page: Optional[str], reply: int) -> bool:
        """True when the page's panel was pointed at another reply than ``reply`` (never pointed: False)."""
        pointed = self.pointed(page)
        return pointed is not None and pointed != int(reply)

    def pointed(self, page: Optional[str]) -> Optional[int]:
        """The reply the page's panel was last pointed at (None: never, or the reply being written)."""
        return self.panel_reply(page, None)

    def panel_reply(self, page: Optional[str], shown: Optional[int]) -> Optional[int]:
        """The reply the page's panel labels, as the server last pointed it (None: the reply being written);
        ``shown``, what the page says it shows, for a page never pointed (or forgotten). The page's own value can
        be one step behind: its updates and the events they trigger reach the server in no fixed order."""
        if page is None:
            return shown
        with self._lock:
            entry = self._pages.get(page)
            return entry["panel"] if entry is not None and "panel" in entry else shown

    def keep_draft(self, page: Optional[str], reply: Optional[int], text: Optional[str]) -> None:
        """Keep a note typed for ``reply`` and not saved (an empty text drops the draft)."""
        if page is None or reply is None:
            return
        with self._lock:
            drafts = self._page(page)["drafts"]
            if (text or "").strip():
                drafts[int(reply)] = text
            else:
                drafts.pop(int(reply), None)

    def draft(self, page: Optional[str], reply: Optional[int]) -> Optional[str]:
        """The note typed for ``reply`` on ``page`` and not saved, or None."""
        if page is None or reply is None:
            return None
        with self._lock:
            return self._pages.get(page, {}).get("drafts", {}).get(int(reply))

    @contextmanager
    def turn(self, name: str) -> Iterator[None]:
        """Hold ``name``'s turn: their writes run one at a time in the order they asked (others' run meanwhile)."""
        with self._turned:
            ticket = self._next.get(name, 0)
            self._next[name] = ticket + 1
            self._serving.setdefault(name, ticket)
            while self._serving[name] != ticket:
                self._turned.wait()
        try:
            yield
        finally:
            with self._turned:
                self._serving[name] = ticket + 1
                if self._serving[name] == self._next[name]:  # nobody waits: forget the name
                    del self._serving[name], self._next[name]
                self._turned.notify_all()
