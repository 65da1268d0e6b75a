"""What the Vote tab does in the browser: a vote's next pair takes no input until it was read, and its layout rules.

A vote's answer brings the next pair within a fraction of a second, so a double click, a double tap or a key pressed
twice would vote on a pair nobody read. The page takes no vote or skip from the moment one is sent until the pair
its answer brings has been painted and on screen for ``queue.read_ms`` (mouse, touch and keys alike: the keys press
the buttons, and every press is a click event this guard sees first). A pair shown by opening the tab, Refresh or
another agent takes input at once (no vote was on its way). The buttons' row says whether it takes input
(``data-ready``, dimmed while not) and counts the presses it ignored (``data-ignored``), with a line saying so.
"""
from __future__ import annotations

# Runs once per page. ``window.rlhfVoteShown(afterVote)`` is called after every answer that shows a pair: two
# animation frames later the pair is painted, and (after a vote or skip) READ_MS later it takes input.
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
  window.rlhfVoteShown = (afterVote) => {
    if (!afterVote && until !== Infinity) return;  // nothing on its way: the pair on screen takes input as it is
    const stamp = ++shownAt;
    const wait = afterVote ? READ_MS : 0;
    until = Infinity;
    mark(false);
    requestAnimationFrame(() => requestAnimationFrame(() => {
      if (stamp !== shownAt) return;
      until = performance.now() + wait;
      setTimeout(() => { if (stamp === shownAt) { mark(true); say(""); } }, wait);
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
  const touched = () => document.body.classList.add("rlhf-touch");
  window.addEventListener("touchstart", touched, {capture: true, once: true});
}"""

SHOWN = "() => { window.rlhfVoteShown?.(true); }"  # after a vote or skip
LOADED = "() => { window.rlhfVoteShown?.(false); }"  # after the tab opened, Refresh, another agent

# Tap targets of at least 44 px; on a phone the buttons stay on screen (stuck to the bottom edge while the replies
# scroll under them), five in two rows, under a context and replies that fit above them; no keyboard hint on a touch screen; no share or clear icons on judged text.
CSS = """
#vote-buttons button { min-height: 44px; }
#vote-buttons[data-ready="0"] button { opacity: 0.6; }
#vote-ignored { font-size: 0.9em; color: var(--body-text-color-subdued); min-height: 1.2em; }
#vote-context .icon-button-wrapper, #vote-reply-a .icon-button-wrapper, #vote-reply-b .icon-button-wrapper {
  display: none !important; }
body.rlhf-touch #vote-keys, body.rlhf-touch #arena-keys { display: none !important; }
@media (hover: none) and (pointer: coarse) { #vote-keys, #arena-keys { display: none !important; } }
@media (max-width: 640px) {
  /* "clip" cuts overflow like Gradio's "hidden" without making the page's frame a scroll box, which would keep
     the bar from sticking to the screen */
  .gradio-container { overflow: clip !important; }
  #vote-bar { position: sticky; bottom: 0; z-index: 20; background: var(--background-fill-primary);
    padding: 6px 0 4px; gap: 4px; box-shadow: 0 -2px 6px rgba(0, 0, 0, 0.12); }
  #vote-buttons { display: grid !important; grid-template-columns: repeat(6, 1fr); gap: 6px; }
  #vote-buttons > button { min-width: 0 !important; grid-column: span 2; padding-left: 4px; padding-right: 4px; }
  #vote-buttons > #vote-a, #vote-buttons > #vote-b { grid-column: span 3; }
  #vote-status { font-size: 0.9em; }
  /* context and replies collapsed to a readable height: all three fit above the bar on a 390x844 screen */
  #vote-context { height: 120px !important; }
  #vote-reply-a, #vote-reply-b { height: 200px !important; }
}
"""


def guard_js(read_ms: int) -> str:
    """The page's guard with the read time filled in."""
    return GUARD.replace("__READ_MS__", str(int(read_ms)))
