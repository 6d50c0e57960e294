"""The results schema round-trips: write a run, read it back with the schema's dtypes."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from bench import results as R
from bench.errors import InputError

CFG = {"pipeline": "raw", "batch_size": 64, "augment": {"crop": "random-pad", "scale": (0.08, 1.0)},
       "seed": 0, "device": "cpu"}


def _ok_run(run_id: str = "r1") -> R.RunRows:
    run = R.RunRows(run_id, "raw", "photos32", "loader", CFG)
    for rep in range(3):
        run.add("ttfb_s", 0.01 * (rep + 1), "s", repeat=rep)
        for ep in range(2):
            run.add("images_per_s", 1000.0 + 10 * rep + ep, "img/s", repeat=rep, epoch=ep)
    return run


def test_round_trip_dtypes_and_values(tmp_path):
    R.write_run(tmp_path, _ok_run())
    df = R.read_results(tmp_path)
    assert list(df.columns[: len(R.CORE_COLUMNS)]) == list(R.CORE_COLUMNS)
    for col, dtype in R.CORE_COLUMNS.items():
        assert str(df[col].dtype) == dtype, col
    assert len(df) == 3 + 6
    assert set(df["schema_version"]) == {R.RESULTS_SCHEMA_VERSION}
    ips = df[df.metric == "images_per_s"].sort_values(["repeat", "epoch"])
    assert ips["value"].tolist() == [1000, 1001, 1010, 1011, 1020, 1021]
    ttfb = df[df.metric == "ttfb_s"]
    assert ttfb["epoch"].isna().all() and ttfb["repeat"].tolist() == [0, 1, 2]
    assert (df["reason"] == "").all() and (df["status"] == "ok").all()
    # flattened config: nested keys with dots, tuples as JSON text
    assert (df["cfg.augment.crop"] == "random-pad").all()
    assert json.loads(df["cfg.augment.scale"].iloc[0]) == [0.08, 1.0]
    assert (df["cfg.batch_size"] == 64).all()
    # the saved config is the unflattened one
    saved = json.loads((tmp_path / "runs" / "r1" / "config.json").read_text())
    assert saved["augment"]["crop"] == "random-pad"


def test_merged_views_match_runs(tmp_path):
    R.write_run(tmp_path, _ok_run("a"))
    skip = R.RunRows("b", "dali", "photos32", "train", CFG)
    skip.skip("DALI needs a GPU for mixed decode")
    R.write_run(tmp_path, skip)
    merged = pd.read_csv(tmp_path / "results.csv")
    assert len(merged) == 10 and set(merged["run_id"]) == {"a", "b"}
    pq = pd.read_parquet(tmp_path / "results.parquet")
    assert len(pq) == 10 and str(pq["repeat"].dtype) == "Int64"


def test_a_value_arrow_cannot_hold_does_not_break_later_views(tmp_path):
    """A run folder written with a seed beyond int64 (before --seed was range-checked): every later
    rebuild still writes both views; the parquet view holds that column as text."""
    big = R.RunRows("big", "raw", "photos32", "loader", {**CFG, "seed": 10**23})
    big.add("images_per_s", 1000.0, "img/s", repeat=0, epoch=0)
    R.write_run(tmp_path, big)
    R.write_run(tmp_path, _ok_run("a"))
    merged = pd.read_csv(tmp_path / "results.csv")
    assert set(merged["run_id"]) == {"big", "a"}
    pq = pd.read_parquet(tmp_path / "results.parquet")
    assert len(pq) == len(merged) and str(10**23) in set(pq["cfg.seed"].dropna())


def test_skip_and_error_replace_partial_rows(tmp_path):
    run = _ok_run("e")
    run.error("CUDA out of memory. Tried to allocate 2.00 GiB\n(more text)")
    R.write_run(tmp_path, run)
    df = R.read_results(tmp_path)
    assert len(df) == 1
    row = df.iloc[0]
    assert row["status"] == "error" and row["metric"] == "run" and math.isnan(row["value"])
    assert row["reason"] == "CUDA out of memory. Tried to allocate 2.00 GiB (more text)"
    with pytest.raises(RuntimeError):
        run.add("images_per_s", 1.0, "img/s")
    # summaries never average a failed run in
    assert R.summarize(df).empty


def test_summarize_median_iqr(tmp_path):
    R.write_run(tmp_path, _ok_run())
    s = R.summarize(R.read_results(tmp_path))
    row = s[s.metric == "images_per_s"].iloc[0]
    vals = pd.Series([1000, 1001, 1010, 1011, 1020, 1021], dtype=float)
    assert row["median"] == vals.median() and row["n"] == 6
    assert row["iqr"] == pytest.approx(vals.quantile(0.75) - vals.quantile(0.25))


def test_rejects_non_finite_and_foreign_files(tmp_path):
    run = _ok_run()
    with pytest.raises(ValueError):
        run.add("epoch_s", float("inf"), "s")
    with pytest.raises(InputError, match="no results"):
        R.read_results(tmp_path)
    bad = tmp_path / "runs" / "x"
    bad.mkdir(parents=True)
    (bad / "rows.csv").write_text("a,b\n1,2\n")
    with pytest.raises(InputError, match="missing columns"):
        R.read_results(tmp_path)
    (bad / "rows.csv").write_text("")  # empty file
    with pytest.raises(InputError):
        R.read_results(tmp_path)


def _cut(raw: bytes) -> bytes:
    return raw[:-2]  # the last field and the newline: pandas would read that field as NA


def _short_record(raw: bytes) -> bytes:
    lines = raw.split(b"\n")
    lines[2] = b",".join(lines[2].split(b",")[:6])
    return b"\n".join(lines)


@pytest.mark.parametrize("damage, message", [
    (_cut, "rows.csv: truncated: the last line ends without a newline"),
    (_short_record, "rows.csv: malformed: line 3 has 6 fields, the header"),
])
def test_truncated_or_malformed_rows_refused_naming_the_file(tmp_path, capsys, damage, message):
    """`report` and the views never read a cut-short rows.csv as data: one line naming it, exit 2."""
    from bench.cli import main
    from tests.cli_helpers import assert_one_line_error

    R.write_run(tmp_path / "res", _ok_run("a"))
    rows = tmp_path / "res" / "runs" / "a" / "rows.csv"
    rows.write_bytes(damage(rows.read_bytes()))
    with pytest.raises(InputError, match=message):
        R.read_results(tmp_path / "res")
    capsys.readouterr()
    rc = main(["report", str(tmp_path / "res"), "--out", str(tmp_path / "rep")])
    assert_one_line_error(rc, capsys.readouterr().err, str(rows), message)
    assert not (tmp_path / "rep").exists()


def test_newer_schema_refused(tmp_path):
    R.write_run(tmp_path, _ok_run("z"))
    f = tmp_path / "runs" / "z" / "rows.csv"
    df = pd.read_csv(f)
    df["schema_version"] = R.RESULTS_SCHEMA_VERSION + 1
    df.to_csv(f, index=False)
    with pytest.raises(InputError, match="schema_version"):
        R.read_results(tmp_path)


def test_write_env(tmp_path):
    p = R.write_env(tmp_path, env={"schema_version": 1, "git": {"sha": "abc", "dirty": False}})
    assert json.loads(p.read_text())["git"]["sha"] == "abc"


def test_unavailable_metric_is_a_skip_row_inside_an_ok_run(tmp_path):
    run = _ok_run("u")
    run.unavailable("gpu_mem_used_peak_bytes", "bytes", "NVML init failed (no driver)", repeat=0)
    R.write_run(tmp_path, run)
    df = R.read_results(tmp_path)
    sk = df[df.status == "skip"]
    assert len(sk) == 1 and sk.iloc[0]["metric"] == "gpu_mem_used_peak_bytes"
    assert math.isnan(sk.iloc[0]["value"]) and "no driver" in sk.iloc[0]["reason"]
    assert not (df.metric == "run").any()
    assert "gpu_mem_used_peak_bytes" not in set(R.summarize(df)["metric"])
