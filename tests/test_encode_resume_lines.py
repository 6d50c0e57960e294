"""``inrbench encode`` says when it resumes, as ``prepare`` and ``meta-init`` do: a run stopped with
fitted shards on disk (Ctrl-C, an error) says they are kept and to rerun the same command; the rerun
says how many shards it found finished, and writes the store an uninterrupted run writes. A work
folder of other settings is refused before the run's header is printed."""

from __future__ import annotations

import pytest

import inr.encode as E
from inr.encode import work_path
from tests.cli_helpers import assert_one_line_error, run_cli
from tests.fixtures_datasets import write_tiny_prepared

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ARGS = ("--iterations", "5", "--layers", "2", "--hidden", "6", "--shard-size", "3", "--no-progress")  # 10 images: 4 shards


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_tiny_prepared(tmp_path_factory.mktemp("resume") / "data", 10, 2)


def _stop_at_shard(monkeypatch, k: int, exc: BaseException, module=E) -> None:
    """``module.encode_images`` (the batched encode's, or ``inr.native``'s) raises ``exc`` when asked for
    shard ``k`` (0-based): shards 0..k-1 are on disk."""
    real, calls = module.encode_images, []

    def stopping(*a, **kw):
        calls.append(1)
        if len(calls) == k + 1:
            raise exc
        return real(*a, **kw)

    monkeypatch.setattr(module, "encode_images", stopping)


def _interrupted_then_resumed(capsys, monkeypatch, tmp_path, data, args, stop, header: str, images: int,
                              shards: int) -> None:
    """Encode ``data`` whole, then again stopped by Ctrl-C at shard 2 (``stop(monkeypatch, k, exc)``) and
    rerun: both print ``header`` first; the stopped run says its 2 of ``shards`` shards are kept and how to
    resume, the rerun says it resumes and writes the uninterrupted run's bytes."""
    full = tmp_path / "full.inr"
    rc, _, err = run_cli(capsys, "encode", data, *args, "--out", full)
    assert rc == 0, err

    out = tmp_path / "s.inr"
    work = work_path(out)
    stop(monkeypatch, 2, KeyboardInterrupt())
    rc, stdout, err = run_cli(capsys, "encode", data, *args, "--out", out)
    assert rc == 130 and err.strip() == "inrbench: interrupted", err
    lines = stdout.splitlines()
    assert lines[0].startswith(header)
    assert lines[-1] == (f"encode: 2 of {shards} fitted shards are kept in {work}: rerun the same command "
                         "to resume (or delete it)") and len(lines) == 2
    assert not out.exists() and len(list(work.glob("shard_*.inr"))) == 2
    monkeypatch.undo()

    rc, stdout, err = run_cli(capsys, "encode", data, *args, "--out", out)
    assert rc == 0, err
    lines = stdout.splitlines()
    assert lines[0].startswith(header)
    assert lines[1] == f"encode: resuming, 2 of {shards} shards already fitted (work folder {work})"
    assert lines[2].startswith(f"wrote {out}: {images} images") and len(lines) == 3
    assert out.read_bytes() == full.read_bytes() and not work.exists()


def _other_settings_refused(capsys, monkeypatch, tmp_path, data, args, stop) -> None:
    """A work folder left by a run stopped at shard 1 is refused, before the header, to a run with
    other settings (``--iterations 6``)."""
    out = tmp_path / "s.inr"
    stop(monkeypatch, 1, KeyboardInterrupt())
    assert run_cli(capsys, "encode", data, *args, "--out", out)[0] == 130
    monkeypatch.undo()
    rc, stdout, err = run_cli(capsys, "encode", data, *args, "--iterations", "6", "--out", out)
    assert_one_line_error(rc, err, work_path(out), "other settings (encode.fit.iterations differs)")
    assert stdout == ""


def test_an_interrupted_encode_says_how_to_resume_and_the_rerun_says_it_resumes(data, tmp_path, capsys, monkeypatch):
    _interrupted_then_resumed(capsys, monkeypatch, tmp_path, data, ARGS, _stop_at_shard,
                              f"encode {data} [train] 10 images", 10, 4)


def test_an_error_after_some_shards_says_they_are_kept(data, tmp_path, capsys, monkeypatch):
    from bench.errors import InputError

    out = tmp_path / "s.inr"
    _stop_at_shard(monkeypatch, 1, InputError("a disk went away"))
    rc, stdout, err = run_cli(capsys, "encode", data, *ARGS, "--out", out)
    assert_one_line_error(rc, err, "a disk went away")
    assert f"encode: 1 of 4 fitted shards are kept in {work_path(out)}: rerun the same command" in stdout


def test_a_fresh_run_and_a_stop_before_any_shard_say_nothing_of_resuming(data, tmp_path, capsys, monkeypatch):
    out = tmp_path / "s.inr"
    _stop_at_shard(monkeypatch, 0, KeyboardInterrupt())
    rc, stdout, _ = run_cli(capsys, "encode", data, *ARGS, "--out", out)
    assert rc == 130 and len(stdout.splitlines()) == 1 and stdout.startswith(f"encode {data} ")  # the header only
    assert list(tmp_path.iterdir()) == []  # nothing to resume: no work folder
    monkeypatch.undo()
    rc, stdout, err = run_cli(capsys, "encode", data, *ARGS, "--out", out)
    assert rc == 0 and not any(line.startswith("encode: ") for line in stdout.splitlines()), err


def test_other_settings_are_refused_before_the_header(data, tmp_path, capsys, monkeypatch):
    _other_settings_refused(capsys, monkeypatch, tmp_path, data, ARGS, _stop_at_shard)


def test_the_library_reports_through_its_callbacks(tmp_path, monkeypatch):
    """``encode_split(log=, on_start=)``: on_start once the work folder is checked, then the resume line."""
    import numpy as np

    from inr.encode import EncodeConfig, encode_split
    from inr.fit import preset
    from inr.quantize import QuantConfig
    from tests.test_inr_codec import smooth_images

    imgs, labels = smooth_images(5, 8, 8), np.zeros(5, int)
    cfg = EncodeConfig(fit=preset("demo", iterations=5, layers=2, hidden=6), quant=QuantConfig((32, 32, 32)),
                       shard_size=2)
    out, events = tmp_path / "o.inr", []
    _stop_at_shard(monkeypatch, 1, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        encode_split(imgs, labels, cfg, out, log=events.append, on_start=lambda: events.append("start"))
    assert events == ["start", f"encode: 1 of 3 fitted shards are kept in {work_path(out)}: rerun the same command "
                                "to resume (or delete it)"]
    monkeypatch.undo()
    events.clear()
    encode_split(imgs, labels, cfg, out, log=events.append, on_start=lambda: events.append("start"))
    assert events == ["start", f"encode: resuming, 1 of 3 shards already fitted (work folder {work_path(out)})"]


# --- the native-size encode (``prepare --size native``, inr.native) says the same lines -------------------------

NATIVE_SIZES = [(12, 16), (16, 12), (12, 16), (10, 10), (16, 12)]  # 3 size groups, shard size 1: 5 shards
NATIVE_ARGS = ("--iterations", "5", "--layers", "2", "--hidden", "6", "--shard-size", "1", "--no-progress")


@pytest.fixture(scope="module")
def native_data(tmp_path_factory):
    import numpy as np

    from bench.datasets.prepared import SplitData, write_prepared

    rng = np.random.default_rng(0)
    ims = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in NATIVE_SIZES]
    root = tmp_path_factory.mktemp("native") / "mixed"
    write_prepared(root, {"train": SplitData(ims, np.array([0, 1, 0, 1, 0], np.int64), ids=[str(i) for i in range(5)])},
                   {"source": "mixed", "classes": ["a", "b"]})
    return root


def _stop_native_at_shard(monkeypatch, k: int, exc: BaseException) -> None:
    import inr.native as N

    _stop_at_shard(monkeypatch, k, exc, module=N)


def test_an_interrupted_native_encode_says_how_to_resume_and_the_rerun_says_it_resumes(native_data, tmp_path, capsys,
                                                                                       monkeypatch):
    _interrupted_then_resumed(capsys, monkeypatch, tmp_path, native_data, NATIVE_ARGS, _stop_native_at_shard,
                              f"encode {native_data} [train] 5 images, native sizes (3 size groups)", 5, 5)


def test_a_native_error_after_some_shards_says_they_are_kept_and_a_fresh_run_says_nothing(native_data, tmp_path,
                                                                                          capsys, monkeypatch):
    from bench.errors import InputError

    out = tmp_path / "s.inr"
    _stop_native_at_shard(monkeypatch, 1, InputError("a disk went away"))
    rc, stdout, err = run_cli(capsys, "encode", native_data, *NATIVE_ARGS, "--out", out)
    assert_one_line_error(rc, err, "a disk went away")
    assert f"encode: 1 of 5 fitted shards are kept in {work_path(out)}: rerun the same command" in stdout
    monkeypatch.undo()

    fresh = tmp_path / "fresh.inr"
    _stop_native_at_shard(monkeypatch, 0, KeyboardInterrupt())
    rc, stdout, _ = run_cli(capsys, "encode", native_data, *NATIVE_ARGS, "--out", fresh)
    assert rc == 130 and len(stdout.splitlines()) == 1  # the header only: nothing fitted, nothing kept
    assert not work_path(fresh).exists()


def test_a_native_work_folder_of_other_settings_is_refused_before_the_header(native_data, tmp_path, capsys,
                                                                             monkeypatch):
    _other_settings_refused(capsys, monkeypatch, tmp_path, native_data, NATIVE_ARGS, _stop_native_at_shard)
