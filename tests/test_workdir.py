"""``bench.workdir``: one work-folder scheme for prepare, encode and meta-init."""

from __future__ import annotations

import os

import pytest

from bench import workdir
from tests.cli_helpers import assert_one_line_error, run_cli
from tests.fixtures_datasets import write_tiny_prepared


@pytest.mark.parametrize("command", ["prepare", "encode", "meta-init"])
def test_a_long_output_name_gets_a_legal_distinct_work_folder(tmp_path, command):
    a, b = tmp_path / ("x" * 243 + "a"), tmp_path / ("x" * 243 + "b")  # 244 bytes: legal names
    wa, wb = workdir.work_path(a, command), workdir.work_path(b, command)
    assert len(os.fsencode(f".{a.name}.inrbench-{command}.work")) > 255  # the plain name would not be
    assert wa != wb and max(len(os.fsencode(w.name)) for w in (wa, wb)) <= 255
    assert workdir.create_or_check(wa, command, {"n": 1}) and not workdir.create_or_check(wa, command, {"n": 1})
    assert_one_line_error(2, f"inrbench: error: {_refusal(wa, command)}", "other settings (n differs)")


def _refusal(folder, command) -> str:
    with pytest.raises(Exception) as e:
        workdir.create_or_check(folder, command, {"n": 2})
    return str(e.value)


def test_meta_init_writes_to_a_244_byte_out_name(tmp_path, capsys):
    data = write_tiny_prepared(tmp_path / "data", 6, 2)
    out = tmp_path / ("i" * 241 + ".pt")
    rc, _, err = run_cli(capsys, "meta-init", data, "--out", out, "--outer-steps", "2", "--inner-steps", "1",
                         "--images", "4", "--meta-batch", "2", "--pixels", "16", "--layers", "2", "--hidden", "4")
    assert rc == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", out.name]
