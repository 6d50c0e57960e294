"""DataFrame -> GitHub markdown table (no extra dependency); tests read it back with ``tests/report_tables.py``."""

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
