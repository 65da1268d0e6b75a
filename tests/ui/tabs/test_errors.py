"""One error path for the Gradio handlers (ui.tabs.errors): every tab words a Store error the same way, an unexpected
error shows one short line and never a traceback, and no tab module catches the Store's errors by hand."""
from __future__ import annotations

import ast
import logging
import re
import warnings
from pathlib import Path

import gradio as gr
import pytest

from rlhf.serving.policy_server import Busy
from storage import Conflict, NotFound, StoreError
from ui.permissions import Forbidden
from ui.services import bind
from ui.tabs import agents, arena, chat, chat_labels, dashboard, data, decisions, errors, training, vote

TABS = Path(errors.__file__).parent
GEN = (8, 0.0, 1.0, "")  # max tokens, temperature, top_p, seed


def first(gen):
    return next(iter(gen))


# (name, call, where the status line is in the outputs, whether a toast is shown)
CASES = [
    ("agents.save_agent", lambda s: agents.save_agent(s, "nope", "nope", "x", "", None, None, None), 1, True),
    ("arena.play_round", lambda s: first(arena.play_round(s, "hi", arena.empty_state(), "nope", "alice")), 4, True),
    ("arena.submit_vote", lambda s: arena.submit_vote(s, "a", {"pair_id": "nope"}, "alice"), 2, True),
    ("chat.send_message", lambda s: first(chat.send_message(s, "hi", chat.empty_state(), "nope", "active", "alice",
                                                            *GEN)), 3, True),
    ("chat.open_conversation", lambda s: chat.open_conversation(s, 9999, chat.empty_state(), "assistant", "alice",
                                                                None, "", "", 0), 3, False),
    ("chat_labels.like_reply", lambda s: chat_labels.like_reply(
        s, {"ids": [None]}, "alice", None, "", "", 0, gr.LikeData(None, {"index": 0, "value": "", "liked": True})),
     chat_labels.N_PANEL, True),
    ("dashboard.promote_version", lambda s: dashboard.promote_version(s, 9999, None), None, True),
    ("dashboard.ask", lambda s: dashboard.ask(s, "promote", "assistant", 9999), -1, False),
    ("data.revoke_token", lambda s: data.revoke_token(s, 9999), None, True),
    ("data.ask_exclude", lambda s: data.ask_exclude(s, "nope", "alice"), -1, False),
    ("decisions.refresh_panel", lambda s: decisions.refresh_panel(s, "nope"), 0, False),
    ("decisions.retrain_without", lambda s: decisions.retrain_without(s, 9999, None), None, False),
    ("training.ask_retrain", lambda s: training.ask_retrain(s, "nope"), 2, False),
    ("training.cancel", lambda s: training.cancel(s, 9999), None, False),
    ("vote.load_next", lambda s: vote.load_next(s, {}, "nope", "alice"), 4, True),
]


@pytest.fixture
def seen(monkeypatch):
    """Every (error, text) the one mapping function was asked for."""
    calls = []
    real = errors.error_text

    def spy(exc, also=()):
        calls.append((exc, real(exc, also)))
        return calls[-1][1]

    monkeypatch.setattr(errors, "error_text", spy)
    return calls


def run(call, services):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = call(services)
    return out, [str(w.message) for w in caught if issubclass(w.category, UserWarning)]


@pytest.mark.parametrize("name,call,where,toast", CASES, ids=[c[0] for c in CASES])
def test_every_handler_words_a_store_error_the_same_way(services, seen, name, call, where, toast):
    out, toasts = run(call, services)
    status = out if where is None else out[where]
    (exc, text), = seen
    assert isinstance(exc, StoreError) and text == str(exc)
    assert status.strip() == f"⚠️ {text}" or status.startswith(f"⚠️ {text} ")  # a handler may add what to do next
    assert toasts == ([text] if toast else [])


def test_an_unexpected_error_shows_one_short_line_and_logs_the_traceback(services, monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise RuntimeError("internal detail\nTraceback (most recent call last): ...")

    monkeypatch.setattr(services.store, "get_agent", broken)
    short = "⚠️ " + errors.UNEXPECTED.format(name="RuntimeError")
    with caplog.at_level(logging.ERROR, logger=errors.__name__):
        outputs = [data.ask_exclude(services, "assistant", "alice")[-1],
                   first(chat.send_message(services, "hi", chat.empty_state(), "assistant", "active", "alice",
                                           *GEN))[3],
                   vote.load_next(services, {}, "assistant", "alice")[4].split(" Nothing to vote on")[0],
                   agents.save_agent(services, "assistant", "assistant", "x", "", None, None, None)[1]]
    assert outputs == [short] * 4 and len(short) < 100
    assert all("Traceback" not in o and "internal detail" not in o for o in outputs)
    assert len(caplog.records) == 4 and all(r.exc_info and r.exc_info[0] is RuntimeError for r in caplog.records)


def test_the_decorator_maps_plain_and_streaming_handlers_and_keeps_what_gradio_reads():
    @errors.handles_errors(lambda status: ("box", status), warn=False, also=(ValueError,))
    def plain(services, n, request: gr.Request = None):
        if n == 1:
            raise NotFound("agent 'x' not found")
        if n == 2:
            raise ValueError("not a number")
        if n == 3:
            raise KeyError("deep")
        return "ok", "fine"

    @errors.handles_errors()
    def stream(services, n):
        yield "first"
        raise Busy(3.0) if n else Forbidden("admins only")

    assert plain(None, 0) == ("ok", "fine")
    assert plain(None, 1) == ("box", "⚠️ agent 'x' not found")
    assert plain(None, 2) == ("box", "⚠️ not a number")
    assert plain(None, 3) == ("box", "⚠️ " + errors.UNEXPECTED.format(name="KeyError"))
    with pytest.warns(UserWarning, match="admins only"):
        assert list(stream(None, 0)) == ["first", "⚠️ admins only"]
    with pytest.warns(UserWarning, match="busy"):
        assert list(stream(None, 1)) == ["first", "⚠️ the model is busy; retry in 3 s"]
    bound = bind(plain, "services")  # what the tabs hand to Gradio: its signature and hints still show gr.Request
    assert list(bound.__signature__.parameters) == ["n", "request"]
    import inspect
    assert inspect.isgeneratorfunction(bind(stream, "services")) and not inspect.isgeneratorfunction(bound)


def test_error_status_leads_and_warns():
    with pytest.warns(UserWarning, match=re.escape("generation failed: nope")):
        assert errors.error_status(Conflict("nope"), lead="generation failed: ") == "⚠️ generation failed: nope"


# ---- no tab words an error its own way -------------------------------------------------------------------------
ERROR_NAMES = {"StoreError", "InvalidInput", "NotFound", "Conflict", "StorageUnavailable", "StoreBusy", "Forbidden",
               "Busy", "EngineFault", "ConfigError", "ExportError", "HubError", "ValueError", "TypeError", "KeyError",
               "PermissionError", "RuntimeError"}
MAPPING = {"error_status", "error_text"}


def hand_caught(path: Path) -> list[str]:
    """``except`` clauses of a module that catch an error by type instead of going through ui.tabs.errors: each must
    catch Exception (or BaseException) and either map it with error_status / error_text or re-raise it."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ExceptHandler):
            continue
        names = {n.id for n in ast.walk(node.type) if isinstance(n, ast.Name)} if node.type else {"<bare>"}
        calls = {n.func.id if isinstance(n.func, ast.Name) else getattr(n.func, "attr", "")
                 for stmt in node.body for n in ast.walk(stmt) if isinstance(n, ast.Call)}
        reraises = any(isinstance(n, ast.Raise) and n.exc is None for stmt in node.body for n in ast.walk(stmt))
        if names - {"Exception", "BaseException"} or names & ERROR_NAMES or not (calls & MAPPING or reraises):
            found.append(f"{path.name}:{node.lineno} except {', '.join(sorted(names))}")
    return found


def test_no_tab_module_catches_the_stores_errors_by_hand():
    modules = [p for p in TABS.glob("*.py") if p.name != "errors.py"]
    assert len(modules) >= 10
    assert [f for p in modules for f in hand_caught(p)] == []
    for p in modules:  # nor words a refusal itself: the warning toast is ui.tabs.errors' alone
        assert "gr.Warning(" not in p.read_text(), p.name


def test_the_check_sees_a_hand_written_catch(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    try:\n        g()\n    except (StoreError, Forbidden) as exc:\n        return str(exc)\n"
                     "    try:\n        g()\n    except Exception as exc:\n        return str(exc)\n"
                     "    try:\n        g()\n    except Exception as exc:\n        return error_status(exc)\n"
                     "    try:\n        g()\n    except BaseException:\n        cleanup()\n        raise\n")
    assert hand_caught(probe) == ["probe.py:4 except Forbidden, StoreError", "probe.py:8 except Exception"]
