"""The three ways a command could lose a user's files (issue #34, 1-3); each asserts the files are
byte-identical afterwards."""

from __future__ import annotations

import os

import pytest

from bench import atomic, outputs
from bench.errors import InputError
from tests.cli_helpers import assert_one_line_error, run_cli, snapshot


def _sweep(path, *extra: str) -> None:
    cells = "\n".join(f"  - {c}" for c in ('{kind: python, id: one, command: ["-c", "open(\'done.txt\', \'w\').write(\'1\')"]}',
                                           *extra))
    path.write_text(f"name: s\ncells:\n{cells}\n")


@pytest.mark.parametrize("cid", [".", "..", ".hidden", "-x", "_x"])
def test_a_cell_id_that_is_not_a_plain_folder_name_is_refused_and_nothing_is_touched(tmp_path, capsys, cid):
    y = tmp_path / "s.yaml"
    _sweep(y)
    rc, _, err = run_cli(capsys, "sweep", y, "--out", tmp_path / "out", "--no-report", "--no-progress")
    assert rc == 0, err
    assert (tmp_path / "out" / "cells" / "one" / "done.txt").read_text() == "1"
    before = snapshot(tmp_path, dirs=True)
    _sweep(y, f'{{kind: python, id: "{cid}", command: ["-c", "print(1)"]}}')
    before["s.yaml"] = snapshot(tmp_path)["s.yaml"]
    rc, _, err = run_cli(capsys, "sweep", y, "--out", tmp_path / "out", "--no-report", "--no-progress")
    assert_one_line_error(rc, err, "id must match")
    assert snapshot(tmp_path, dirs=True) == before


def test_the_sweep_runner_never_names_a_parent_as_a_cell_folder(tmp_path):
    from bench.sweep.runner import SweepContext

    ctx = SweepContext(out=tmp_path, data_root=None, cells={})
    assert ctx.cell_dir("ok.1") == tmp_path / "cells" / "ok.1"
    for bad in (".", "..", "a/b", ""):
        with pytest.raises(InputError, match="not a folder name"):
            ctx.cell_dir(bad)


def test_entries_that_only_look_like_old_temp_names_are_kept(tmp_path, capsys):
    """inr-bench 0.1's untagged ``.<out>.<8 chars>.partial|scratch`` names are the user's now."""
    mine = [tmp_path / ".ds.20240101.scratch", tmp_path / ".x.inr.download.partial",
            tmp_path / ".ds.inrbench-short.partial", tmp_path / ".ds.inrbench-abcdefgh.partial.bak"]
    for m in mine:
        m.mkdir()
        (m / "b.txt").write_text("backup\n")
    before = snapshot(tmp_path, dirs=True)
    rc, _, err = run_cli(capsys, "prepare", "synthetic", "--out", tmp_path / "ds", "--size", "8", "--per-class", "2",
                         "--num-classes", "2")
    assert rc == 0, err
    after = snapshot(tmp_path, dirs=True)
    assert {k: v for k, v in after.items() if not k.startswith("ds")} == before


def _own(tmp_path):
    final = tmp_path / "cmp"
    with atomic.atomic_dir(final, kind="compare") as tmp:
        (tmp / "summary.csv").write_text("old results\n")
    return final


def test_an_interrupt_between_the_two_renames_of_a_replace_keeps_the_old_output(tmp_path, monkeypatch):
    final = _own(tmp_path)
    before = snapshot(tmp_path, dirs=True)
    real, calls = os.replace, []

    def replace(src, dst):
        calls.append(dst)
        if str(src).endswith(".partial") and dst == final:  # the new folder onto the output: Ctrl-C
            raise KeyboardInterrupt
        return real(src, dst)

    monkeypatch.setattr(atomic.os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        with atomic.atomic_dir(final, kind="compare", overwrite=True) as tmp:
            (tmp / "summary.csv").write_text("new results\n")
    monkeypatch.setattr(atomic.os, "replace", real)
    assert calls.count(final) == 2  # the new one's rename, then the old one's return
    assert snapshot(tmp_path, dirs=True) == before  # old output back, no temp left


def test_the_next_run_puts_back_a_replaced_output_whose_new_one_never_arrived(tmp_path):
    """A kill (no handler runs) between the renames leaves only ``.old``: cleanup restores it."""
    final = _own(tmp_path)
    before = snapshot(final, dirs=True)
    old = outputs.make_temp_dir(final, ".old")
    os.replace(final, old)
    partial = outputs.make_temp_dir(final, ".partial")
    (partial / "summary.csv").write_text("half\n")
    outputs.remove_stale_temps(final)
    assert snapshot(final, dirs=True) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cmp"]


def test_an_old_output_is_removed_once_its_replacement_is_in_place(tmp_path):
    final = _own(tmp_path)
    old = outputs.make_temp_dir(final, ".old")
    (old / "summary.csv").write_text("replaced\n")
    outputs.remove_stale_temps(final)
    assert (final / "summary.csv").read_text() == "old results\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cmp"]
