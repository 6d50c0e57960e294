"""Reading the report's markdown tables back (``bench.report.markdown.table`` writes them), and what
the report tests share to build their reports quickly."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import pytest


def parse_tables(text: str) -> dict[str, list[pd.DataFrame]]:
    """Every markdown table in ``text``, keyed by the nearest heading above it (for tests)."""
    out: dict[str, list[pd.DataFrame]] = {}
    heading = ""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
        if line.startswith("|") and i + 1 < len(lines) and lines[i + 1].startswith("|---"):
            cols = _split(line)
            rows = []
            i += 2
            while i < len(lines) and lines[i].startswith("|"):
                rows.append(_split(lines[i]))
                i += 1
            out.setdefault(heading, []).append(pd.DataFrame(rows, columns=cols))
            continue
        i += 1
    return out


def _split(line: str) -> list[str]:
    parts, cur, esc = [], "", False
    for ch in line.strip()[1:-1]:
        if esc:
            cur += ch
            esc = False
        elif ch == "\\":
            esc = True
        elif ch == "|":
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    parts.append(cur.strip())
    return parts


@contextmanager
def runs_without_views():
    """``bench.results.write_run`` without rebuilding the merged views (``results.csv``/``.parquet``)
    after each run: a synthetic folder of dozens of runs reread every earlier run per run written.
    The report reads ``runs/*/rows.csv`` (``bench.results.read_results``), never the views."""
    from bench import results

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(results, "rebuild_views", lambda out: None)
        yield


_RENDER: dict = {}  # the real ``bench.compare.figures.save``


@contextmanager
def figures_unrendered():
    """The report's figures built but not rendered to PNG (``bench.compare.figures.save`` writes an
    empty file): rendering is half a report's time, and tests of tables and text never look at the
    pixels. tests/test_report.py::test_figures_are_written_and_linked checks the rendered files."""
    from bench.compare import figures

    def save(fig, path):
        import matplotlib.pyplot as plt

        plt.close(fig)
        Path(path).write_bytes(b"")
        return Path(path)

    _RENDER.setdefault("save", figures.save)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(figures, "save", save)
        yield


FIX = Path(__file__).resolve().parent / "fixtures" / "results" / "sweep"
_SWEEP_REPORT: dict[str, Path] = {}


def sweep_report(tmp_path_factory) -> Path:
    """The report of the committed sweep fixture (tests/fixtures/results/sweep), written by
    ``inrbench report`` (in-process, exit 0), figures rendered; built once per pytest run
    (``once_per_session``) and read, never written, by the tests that share it."""
    if "out" not in _SWEEP_REPORT:
        from dist_helpers import once_per_session

        from bench.cli import main
        from bench.compare import figures

        with once_per_session(tmp_path_factory, "sweep-report") as (folder, done):
            out = folder / "rep"
            if not done:
                with pytest.MonkeyPatch.context() as mp:  # rendered, even inside ``figures_unrendered``
                    mp.setattr(figures, "save", _RENDER.get("save", figures.save))
                    assert main(["report", str(FIX), "--out", str(out)]) == 0
        _SWEEP_REPORT["out"] = out
    return _SWEEP_REPORT["out"]


@pytest.fixture(scope="module", autouse=True)
def _quick_reports():
    """Imported by a test module of synthetic reports: its runs are written without the views
    (``runs_without_views``) and its reports' figures are not rendered (``figures_unrendered``)."""
    with runs_without_views(), figures_unrendered():
        yield
