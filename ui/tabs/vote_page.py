"""What the Vote tab does in the browser: input is ignored until a new pair has been read, and its layout rules.

A vote's answer brings the next pair within a fraction of a second, so a double click, a double tap or a key pressed
twice would vote on a pair nobody read. The page takes no vote or skip from the moment one is sent until the next
pair has been painted and on screen for ``queue.read_ms`` (mouse, touch and keys alike: the keys press the buttons,
and every press is a click event this guard sees first). The buttons' row says whether it takes input
(``data-ready``, dimmed while not) and counts the presses it ignored (``data-ignored``), with a line saying so.
"""
from __future__ import annotations

# Runs once per page. ``window.rlhfVoteShown`` is called after every answer that shows a pair (vote, skip, Refresh,
# tab opened, agent changed): two animation frames later the pair is painted, and READ_MS later it takes input.
GUARD = """() => {
  if (window.__rlhfVoteGuard) return;
  window.__rlhfVoteGuard = true;
  const READ_MS = __READ_MS__;
  const INPUTS = "#vote-a, #vote-b, #vote-tie, #vote-both_bad, #vote-skip";
  let until = 0, shownAt = 0;  // input is taken from performance.now() >= until (Infinity: a vote is on its way)
  const row = () => document.getElementById("vote-buttons");
  const mark = (ready) => { const r = row(); if (r) r.dataset.ready = ready ? "1" : "0"; };
  const say = (text) => {
    const r = row();
    if (!r) return;
    let line = document.getElementById("vote-ignored");
    if (!line) {
      line = document.createElement("div");
      line.id = "vote-ignored";
      line.setAttribute("role", "status");
      r.insertAdjacentElement("afterend", line);
    }
    line.textContent = text;
  };
  window.rlhfVoteShown = () => {
    const stamp = ++shownAt;
    until = Infinity;
    mark(false);
    requestAnimationFrame(() => requestAnimationFrame(() => {
      if (stamp !== shownAt) return;
      until = performance.now() + READ_MS;
      setTimeout(() => { if (stamp === shownAt) { mark(true); say(""); } }, READ_MS);
    }));
  };
  window.addEventListener("click", (event) => {
    const button = event.target instanceof Element ? event.target.closest(INPUTS) : null;
    if (button === null || button.disabled) return;
    if (performance.now() < until) {  // a second press: the pair on screen now was not read yet
      event.preventDefault();
      event.stopImmediatePropagation();
      const r = row();
      r.dataset.ignored = String(Number(r.dataset.ignored || "0") + 1);
      say("Not counted: a new pair just appeared. Read it first, then vote.");
      return;
    }
    const stamp = ++shownAt;
    until = Infinity;  // this vote's answer brings the next pair
    mark(false);
    // No answer at all (the server went away): take input again rather than lock the page for good.
    setTimeout(() => { if (stamp === shownAt) { until = 0; mark(true); } }, 30000);
  }, true);
  if (navigator.maxTouchPoints > 0 || "ontouchstart" in window) document.body.classList.add("rlhf-touch");
  window.addEventListener("touchstart", () => document.body.classList.add("rlhf-touch"), {capture: true, once: true});
}"""

SHOWN = "() => { window.rlhfVoteShown?.(); }"

# Tap targets of at least 44 px; on a phone the buttons stay on screen (stuck to the bottom edge while the replies
# scroll under them), five in two rows; no keyboard hint on a touch screen; no share or clear icons on judged text.
CSS = """
#vote-buttons button { min-height: 44px; }
#vote-buttons[data-ready="0"] button { opacity: 0.6; }
#vote-ignored { font-size: 0.9em; color: var(--body-text-color-subdued); min-height: 1.2em; }
#vote-context .icon-button-wrapper, #vote-reply-a .icon-button-wrapper, #vote-reply-b .icon-button-wrapper {
  display: none !important; }
body.rlhf-touch #vote-keys, body.rlhf-touch #arena-keys { display: none !important; }
@media (hover: none) and (pointer: coarse) { #vote-keys, #arena-keys { display: none !important; } }
@media (max-width: 640px) {
  #vote-buttons { position: sticky; bottom: 0; z-index: 20; background: var(--background-fill-primary);
    padding: 6px 0; gap: 6px; flex-wrap: wrap; box-shadow: 0 -2px 6px rgba(0, 0, 0, 0.12); }
  #vote-buttons > button { flex: 1 1 30% !important; min-width: 0 !important; }
}
"""


def guard_js(read_ms: int) -> str:
    """The page's guard with the read time filled in."""
    return GUARD.replace("__READ_MS__", str(int(read_ms)))
