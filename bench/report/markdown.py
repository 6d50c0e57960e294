"""DataFrame -> GitHub markdown table (no extra dependency), and reading one back (tests)."""

from __future__ import annotations

import pandas as pd


def _cell(x) -> str:
    s = "" if x is None or (isinstance(x, float) and pd.isna(x)) else str(x)
    return " ".join(s.split()).replace("|", "\\|")


def one_line(text: str) -> str:
    """A heading or an image link on one line: a line break inside a name (a dataset folder ``a\\nb``)
    is shown as ``\\n`` instead of ending the heading or the link there."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


def table(df: pd.DataFrame, index: bool = True) -> str:
    """A markdown table; with ``index`` the index becomes the first column (named by its name)."""
    d = df.reset_index() if index else df
    head = [_cell(c) for c in d.columns]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for row in d.itertuples(index=False):
        lines.append("| " + " | ".join(_cell(x) for x in row) + " |")
    return "\n".join(lines)


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
