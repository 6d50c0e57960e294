"""A pytest plugin (``pytest -p devtools.pytest_log``): one JSON line per event, flushed as it happens, to
``$INRBENCH_PYTEST_LOG``, so a pytest killed by a time cap still tells what finished, what was running
and what was never reached (``read_log``; junit XML is written only at the end).

Events (key ``event``): ``collected`` (``nodeids``), ``collect_error`` (``nodeid``, ``message``), ``start``
(``nodeid``), ``test`` (``nodeid``, ``outcome`` passed | failed | skipped, ``duration``, ``message``),
``finished`` (``exitstatus``; absent when pytest was killed).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

ENV = "INRBENCH_PYTEST_LOG"
MESSAGE_CHARS = 300

_tests: dict[str, dict[str, Any]] = {}  # nodeid -> outcome so far, over its setup/call/teardown phases


def _write(rec: dict[str, Any]) -> None:
    path = os.environ.get(ENV)
    if not path:
        return
    with open(path, "a", encoding="utf-8") as f:  # one write per line, flushed: survives a SIGKILL after it
        f.write(json.dumps(rec, default=str) + "\n")
        f.flush()


def one_line(text: Any) -> str:
    return " ".join(str(text).split())[:MESSAGE_CHARS]


def _message(report: Any) -> str:
    """A skip's reason or a failure's crash message, on one line."""
    if getattr(report, "wasxfail", None) is not None and report.skipped:
        return one_line(f"xfail: {report.wasxfail}")
    rep = report.longrepr
    if report.skipped and isinstance(rep, tuple) and len(rep) == 3:
        return one_line(str(rep[2]).removeprefix("Skipped: "))
    crash = getattr(rep, "reprcrash", None)
    if crash is not None and getattr(crash, "message", ""):
        return one_line(crash.message)
    lines = [ln for ln in str(getattr(report, "longreprtext", "") or rep or "").splitlines() if ln.strip()]
    return one_line(lines[-1]) if lines else ""


def pytest_collection_finish(session: Any) -> None:
    _write({"event": "collected", "nodeids": [item.nodeid for item in session.items]})


def pytest_collectreport(report: Any) -> None:
    if report.failed:
        _write({"event": "collect_error", "nodeid": report.nodeid, "message": _message(report)})


def pytest_runtest_logstart(nodeid: str, location: Any) -> None:
    _tests[nodeid] = {"outcome": "passed", "duration": 0.0, "message": ""}
    _write({"event": "start", "nodeid": nodeid})


def pytest_runtest_logreport(report: Any) -> None:
    t = _tests.setdefault(report.nodeid, {"outcome": "passed", "duration": 0.0, "message": ""})
    t["duration"] += float(getattr(report, "duration", 0.0) or 0.0)
    if report.failed and t["outcome"] != "failed":
        msg = _message(report)
        t.update(outcome="failed", message=msg if report.when == "call" else f"in {report.when}: {msg}")
    elif report.skipped and t["outcome"] == "passed":
        t.update(outcome="skipped", message=_message(report))


def pytest_runtest_logfinish(nodeid: str, location: Any) -> None:
    t = _tests.pop(nodeid, {"outcome": "passed", "duration": 0.0, "message": ""})
    _write({"event": "test", "nodeid": nodeid, **t, "duration": round(t["duration"], 3)})


def pytest_sessionfinish(session: Any, exitstatus: Any) -> None:
    _write({"event": "finished", "exitstatus": int(exitstatus)})


def short(nodeid: str) -> str:
    """``tests/test_a.py::test_b[x]`` -> ``test_a.py::test_b[x]``."""
    path, sep, rest = nodeid.partition("::")
    return path.rsplit("/", 1)[-1] + sep + rest


def read_log(path: Path, select: Any = None) -> dict[str, Any]:
    """Sum up a log, maybe cut short (a torn last line ignored), over the tests ``select(nodeid)`` keeps:
    ``passed``, ``failed``, ``skipped``, ``failures``, ``skip_reason``, ``collected`` (None: never finished),
    ``running``, ``not_reached`` and ``finished``."""
    keep = select or (lambda _n: True)
    out: dict[str, Any] = {"passed": 0, "failed": 0, "skipped": 0, "failures": [], "skip_reason": "",
                           "collected": None, "running": None, "not_reached": [], "finished": False}
    started: list[str] = []
    done: set[str] = set()
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return out
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        ev, node = rec.get("event"), rec.get("nodeid", "")
        if ev == "collected":
            out["collected"] = [n for n in rec.get("nodeids", []) if keep(n)]
        elif ev == "finished":
            out["finished"] = True
        elif not keep(node):
            continue
        elif ev == "start":
            started.append(node)
        elif ev == "collect_error":
            out["failed"] += 1
            out["failures"].append(f"collecting {short(node) or '(session)'}: {rec.get('message', '')}")
        elif ev == "test":
            done.add(node)
            outcome = rec.get("outcome")
            if outcome == "failed":
                out["failed"] += 1
                out["failures"].append(f"{short(node)}: {rec.get('message', '')}")
            elif outcome == "skipped":
                out["skipped"] += 1
                out["skip_reason"] = out["skip_reason"] or rec.get("message", "")
            else:
                out["passed"] += 1
    running = [n for n in started if n not in done]
    out["running"] = running[-1] if running else None
    seen = set(started)
    out["not_reached"] = [n for n in (out["collected"] or []) if n not in seen]
    return out
