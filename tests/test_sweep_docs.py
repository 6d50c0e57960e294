"""docs/sweeps.md tells the truth: every YAML example in it loads with the real loader and lists its
cells (or, where the page marks it ``refused``, is refused with the line it shows), and its table of
options ``args`` may not set is the one the code derives."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from cli_helpers import assert_one_line_error, run_cli

from bench.sweep.cells import KINDS, owned_options
from bench.sweep.spec import load_sweep

DOC = Path(__file__).resolve().parent.parent / "docs" / "sweeps.md"
BLOCK = re.compile(r"(?:<!-- sweeps-doc: refused \"(?P<refused>[^\"]+)\" -->\n)?```yaml\n(?P<body>.*?)```", re.S)


def _blocks() -> list[tuple[str, str | None]]:
    return [(m["body"], m["refused"]) for m in BLOCK.finditer(DOC.read_text())]


def test_the_page_has_examples_of_every_feature():
    text = "\n".join(b for b, _ in _blocks())
    assert len(_blocks()) >= 5
    for word in ("matrix:", "label:", "defaults:", "args:", "needs:", "timeout_s:", "kind: inrbench", "kind: python",
                 "stores:", "description:", "report:", "device:"):
        assert word in text, word
    assert sum(1 for _, r in _blocks() if r) >= 1


@pytest.mark.parametrize("i", range(len(_blocks())))
def test_every_yaml_example_loads_and_lists_its_cells(tmp_path, capsys, i):
    body, refused = _blocks()[i]
    y = tmp_path / f"example{i}.yaml"
    y.write_text(body)
    rc, out, err = run_cli(capsys, "sweep", y, "--list", "--out", tmp_path / "runs")
    if refused:
        assert_one_line_error(rc, err, str(y), refused)
        return
    assert rc == 0, err
    cfg = load_sweep(str(y))
    listed = [line.split(" ", 1)[0] for line in out.splitlines() if not line.startswith(" ")]
    assert listed == [c.id for c in cfg.cells] and listed


def test_the_matrix_example_makes_the_cells_the_page_names():
    body = next(b for b, _ in _blocks() if "name: matrix-example" in b)
    import yaml

    from bench.sweep.spec import parse_sweep

    ids = [c.id for c in parse_sweep(yaml.safe_load(body), Path("matrix-example.yaml")).cells]
    bench = [f"b-{p}-{m}-{n}" for n in (1, 2) for m in ("loader", "train") for p in ("raw", "inr")]
    assert ids == ["prep", "enc-fp32", "enc-8bit", *bench, "method-dense", "method-expand"]


def test_the_table_of_refused_options_is_the_derived_one():
    text = DOC.read_text()
    table = text[text.index("<!-- managed:begin -->"):text.index("<!-- managed:end -->")]
    rows = dict(re.findall(r"^\| `([a-z-]+)` \| (.+) \|$", table, re.M))
    assert rows == {k: ", ".join(f"`{f}`" for f in owned_options(c)) for k, c in KINDS.items() if c.command}
