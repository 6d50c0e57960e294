"""studies/ddp-cpu-scaling/ddp-cpu-scaling's table: the 2-process / 1-process ratios count each bench run (process) once
(bench.stats.unit_ratio_ci), never one process's repeats x epochs pooled; one run a side is no result."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench import results as R

SCRIPT = Path(__file__).resolve().parent / "ddp-cpu-scaling"


def _run(out: Path, run_id: str, pipeline: str, rates: list[float], rank_rows: bool = False) -> None:
    run = R.RunRows(run_id, pipeline, "photos32", "loader", {"pipe": {"device": "cpu"}})
    for e, v in enumerate(rates):
        run.add("images_per_s", v, "img/s", repeat=0, epoch=e + 1)
    R.write_run(out, run)


def _table(tmp_path: Path, runs: int) -> str:
    for folder, level in (("p1t1", 1000.0), ("p1t2", 1500.0), ("p2t1", 1800.0)):
        for k in range(runs):  # each run: 3 epochs a little apart (pooled, 3 x runs samples)
            _run(tmp_path / folder, f"{folder}-{k}", "raw", [level * (1 + 0.02 * k) + d for d in (-5.0, 0.0, 5.0)])
    src = SCRIPT.read_text()
    py = src.split("<<'PYEOF'\n", 1)[1].split("\nPYEOF", 1)[0]
    r = subprocess.run([sys.executable, "-", str(tmp_path)], input=py, capture_output=True, text=True,
                       cwd=SCRIPT.parents[2])
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_one_run_a_side_is_no_result(tmp_path):
    out = _table(tmp_path, 1)  # 3 epochs of one process: the bootstrap of pooled epochs gave an interval
    assert "1.80x (one process a side: no interval, not a result" in out and "[" not in out.split("raw", 1)[1]


def test_runs_are_the_units(tmp_path):
    out = _table(tmp_path, 3)
    line = next(ln for ln in out.splitlines() if "| raw" in ln)
    assert "1.80x [" in line and "1.20x [" in line and "not a result" not in line
