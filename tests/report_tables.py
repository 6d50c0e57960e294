"""Reading the report's markdown tables back (``bench.report.markdown.table`` writes them)."""

from __future__ import annotations

import pandas as pd


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
