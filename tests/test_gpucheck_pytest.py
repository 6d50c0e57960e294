"""gpu-check's pytest steps (``pytest-pipelines``, ``pytest-rest``, ``dali-crops``): per-test outcomes streamed by ``devtools.pytest_log``
survive a pytest killed by the step's time cap; a finished run reads the same log.

A fake test file goes through the step machinery (``gpucheck._pytest``: a subprocess in its own
process group, killed at the cap), no mocks.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from devtools import gpucheck, pytest_log

FAKE = '''
import time

import pytest


def test_ok():
    pass


def test_bad():
    assert 1 == 2, "one is not two"


@pytest.mark.skip(reason="no CUDA device")
def test_skipped():
    pass


@pytest.mark.xfail(reason="known")
def test_xfail():
    assert False


@pytest.fixture
def broken():
    raise RuntimeError("fixture broke")


def test_setup_error(broken):
    pass


@pytest.mark.parametrize("x", [1, 2])
def test_param(x):
    assert x


def test_sleeps():
    if SLEEP:
        time.sleep(SLEEP)


def test_after():
    pass


def test_after_2():
    pass
'''


def _fake(tmp_path: Path, sleep: float) -> Path:
    f = tmp_path / "fake" / "test_fake.py"
    f.parent.mkdir()
    f.write_text(f"SLEEP = {sleep}\n" + FAKE)
    return f


def _ctx(tmp_path: Path) -> dict:
    work = tmp_path / "work"
    work.mkdir(parents=True)
    return {"work": str(work), "deadline": time.time() + 600}


def test_a_pytest_killed_by_the_cap_still_reports_the_tests_it_finished(tmp_path):
    f = _fake(tmp_path, sleep=600)
    t0 = time.time()
    with pytest.raises(gpucheck.StepFailed) as e:
        gpucheck._pytest(_ctx(tmp_path), "fake", [str(f)], cap=4)  # the fake pytest reaches test_sleeps in ~0.5 s
    assert time.time() - t0 < 60  # killed at the cap, not after the sleep
    msg, fig = str(e.value), e.value.figures
    assert msg.startswith("pytest timed out after 4 s, while running test_fake.py::test_sleeps; "), msg
    assert "before it 3 passed, 2 failed, 2 skipped; 2 not reached" in msg and "\n" not in msg, msg
    assert (fig["passed"], fig["failed"], fig["skipped"]) == (3, 2, 2)
    assert fig["failures"] == ["test_fake.py::test_bad: AssertionError: one is not two assert 1 == 2",
                               "test_fake.py::test_setup_error: in setup: RuntimeError: fixture broke"]
    assert fig["running"] == "test_fake.py::test_sleeps"
    assert fig["not_reached"] == 2 and fig["not_reached_tests"] == ["test_fake.py::test_after", "test_fake.py::test_after_2"]
    log = tmp_path / "work" / "fake.jsonl"
    assert not any(json.loads(ln)["event"] == "finished" for ln in log.read_text().splitlines())


def test_a_finished_pytest_is_read_from_the_same_log(tmp_path):
    f = _fake(tmp_path, sleep=0)
    with pytest.raises(gpucheck.StepFailed) as e:
        gpucheck._pytest(_ctx(tmp_path), "fake", [str(f)], cap=120)
    fig = e.value.figures
    assert str(e.value) == "test_fake.py::test_bad: AssertionError: one is not two assert 1 == 2"
    assert (fig["passed"], fig["failed"], fig["skipped"]) == (6, 2, 2) and "running" not in fig and "not_reached" not in fig
    res = pytest_log.read_log(tmp_path / "work" / "fake.jsonl")
    assert res["finished"] and res["skip_reason"] == "no CUDA device" and res["not_reached"] == []

    # only passing and skipped tests selected: ok with the counts; all skipped: a skip with the reason
    assert gpucheck._pytest(_ctx(tmp_path / "b"), "ok", [str(f), "-k", "ok or param or skipped"], 120) == {
        "passed": 3, "failed": 0, "skipped": 1}
    with pytest.raises(gpucheck.Skip, match="1 collected, all skipped: no CUDA device"):
        gpucheck._pytest(_ctx(tmp_path / "c"), "sk", [str(f), "-k", "skipped"], 120)


def test_read_log_selects_tests_and_ignores_a_torn_last_line(tmp_path):
    log = tmp_path / "x.jsonl"
    lines = [
        {"event": "collected", "nodeids": ["tests/test_pipelines_gpu.py::test_dali_uniform", "tests/test_a.py::test_b",
                                           "tests/test_pipelines_gpu.py::test_agree_across"]},
        {"event": "start", "nodeid": "tests/test_pipelines_gpu.py::test_dali_uniform"},
        {"event": "test", "nodeid": "tests/test_pipelines_gpu.py::test_dali_uniform", "outcome": "passed",
         "duration": 1.0, "message": ""},
        {"event": "start", "nodeid": "tests/test_a.py::test_b"},
        {"event": "test", "nodeid": "tests/test_a.py::test_b", "outcome": "failed", "duration": 1.0, "message": "x"},
        {"event": "start", "nodeid": "tests/test_pipelines_gpu.py::test_agree_across"},
    ]
    log.write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"event": "test", "nodeid": "tests/te')
    res = pytest_log.read_log(log, lambda n: "test_pipelines_gpu" in n)
    assert (res["passed"], res["failed"], res["skipped"]) == (1, 0, 0)
    assert res["running"] == "tests/test_pipelines_gpu.py::test_agree_across" and res["not_reached"] == []
    assert not res["finished"]
    everything = pytest_log.read_log(log)
    assert everything["failures"] == ["test_a.py::test_b: x"]
    assert pytest_log.read_log(tmp_path / "missing.jsonl")["collected"] is None
