"""The CLI surface, the README quickstart, .ci/run and the environment record."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.cli import COMMANDS, main

ROOT = Path(__file__).resolve().parent.parent


def quickstart_lines() -> list[str]:
    text = (ROOT / "README.md").read_text()
    m = re.search(r"<!-- quickstart:begin -->\s*```bash\n(.*?)```\s*<!-- quickstart:end -->", text, re.S)
    assert m, "README has no quickstart block"
    return [ln for ln in m.group(1).splitlines() if ln.strip()]


def test_help_lists_every_command():
    out = subprocess.run(
        [sys.executable, "-m", "bench", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for name in COMMANDS:
        assert re.search(rf"^\s+{name}\s", out, re.M), f"{name} missing from --help:\n{out}"


@pytest.mark.parametrize("name", list(COMMANDS))
def test_each_command_has_help(name, capsys):
    assert main([name, "--help"]) == 0
    assert "usage: inrbench " + name in capsys.readouterr().out


def test_usage_errors_are_one_line_exit_2(capsys):
    assert main(["encode"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("inrbench: error: inrbench encode: the following arguments")
    assert main(["nope"]) == 2
    assert "invalid choice: 'nope'" in capsys.readouterr().err


def test_readme_quickstart_is_two_lines_and_ci_runs_the_test_line():
    lines = quickstart_lines()
    assert len(lines) == 2, lines
    main_line, test_line = lines
    assert "inrbench sweep demo" in main_line
    assert "pytest" in test_line
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test_line in ci, ".ci/run must run the README's test command verbatim"
    # Any doc that quotes a quickstart command (a fresh venv, then the install) quotes these exact lines.
    for doc in ROOT.glob("docs/*.md"):
        for ln in doc.read_text().splitlines():
            if "-m venv" in ln and "pip install -e" in ln:
                assert ln.strip() in lines, f"{doc.name} quotes a different install command: {ln}"


def test_readme_is_one_screen_and_indexes_every_doc():
    """The README stays short (issue #31: at most 150 lines), links every page under docs/, and every page
    opens with the question it answers (the first paragraph after its title ends in ``?*``)."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150, len(readme.splitlines())
    for doc in sorted(ROOT.glob("docs/*.md")):
        assert f"](docs/{doc.name})" in readme, f"README does not link docs/{doc.name}"
        lines = doc.read_text().splitlines()
        assert lines[0].startswith("# ") and lines[2].startswith("*") and "?" in lines[2], \
            f"docs/{doc.name} does not open with the question it answers: {lines[2]!r}"


def test_readme_shows_the_committed_demo_headline():
    """The README's table is the committed demo report's headline, cell for cell: regenerating reports/demo
    without updating the README fails here."""
    from tests.report_tables import parse_tables

    readme = parse_tables((ROOT / "README.md").read_text())["What the demo shows"][0]
    demo = parse_tables((ROOT / "reports" / "demo" / "README.md").read_text())
    [headline] = [tabs[0] for heading, tabs in demo.items() if heading.endswith("— headline")]
    assert readme.equals(headline), f"README:\n{readme}\nreports/demo:\n{headline}"


def test_env_records_which_pil_and_no_gpu_reason(capsys):
    assert main(["env"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["pil"]["flavor"] in ("Pillow", "pillow-simd")
    import PIL

    assert info["pil"]["version"] == PIL.__version__
    assert info["pil"]["libjpeg"]
    assert info["versions"]["torch"]
    gpu = info["gpu"]
    if not gpu["available"]:
        assert gpu["reason"], "absent GPU facts must carry a reason"
    else:
        assert gpu["devices"] and gpu["driver"]


def test_os_errors_name_the_output_not_the_lock_or_nothing(tmp_path, capsys, monkeypatch):
    """A folder that cannot hold --out is named (not the lock file beside it); a write that fails with
    no file named (a full disk) names --out; either way one line, exit 2, and nothing is written."""
    import errno

    from bench import atomic

    assert main(["env", "--out", "/proc/e.json"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "inrbench: error: --out /proc/e.json: cannot write in /proc: No such file or directory", err

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(atomic, "atomic_write_json", full)
    out = tmp_path / "e.json"
    assert main(["env", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"inrbench: error: --out {out}: No space left on device (free some"), err
    assert list(tmp_path.iterdir()) == []
