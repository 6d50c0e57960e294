"""Sharded encode: an interrupted encode resumes to the identical file; CLI encode + inspect."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from bench.cli import main
from bench.errors import InputError
from inr import store
from inr.encode import EncodeConfig, encode_split
from inr.fit import preset
from inr.prune import PruneConfig
from inr.quantize import QuantConfig
from tests.test_inr_codec import smooth_images

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def small_cfg(**kw) -> EncodeConfig:
    fit = preset("demo", iterations=30, layers=2, hidden=8)
    return EncodeConfig(fit=fit, quant=QuantConfig((16, 8, 16)), shard_size=2, **kw)


class Killed(Exception):
    pass


def test_resume_after_kill_gives_the_identical_file(tmp_path):
    imgs, labels = smooth_images(7, 12, 12), np.arange(7) % 3
    cfg = small_cfg(prune=PruneConfig(ratio=0.25, rounds=1, finetune_iterations=5))
    full = encode_split(imgs, labels, cfg, tmp_path / "full.inr")
    assert not (tmp_path / ".full.inr.inrbench-encode.work").exists()

    out = tmp_path / "resumed.inr"
    done = []

    def killer(n, p):
        done.append(n)
        if len(done) == 3:
            raise Killed  # dies while finishing the 3rd shard: shards 0 and 1 are on disk
    with pytest.raises(Killed):
        encode_split(imgs, labels, cfg, out, progress=killer)
    work = tmp_path / ".resumed.inr.inrbench-encode.work"
    assert not out.exists() and sorted(p.name for p in work.glob("shard_*.inr")) == ["shard_00000.inr", "shard_00001.inr"]
    # a half-written temp file from the kill is ignored; a damaged shard is redone
    (work / ".shard_00002.inr.123.tmp").write_bytes(b"partial")
    seen = []
    encode_split(imgs, labels, cfg, out, progress=lambda n, p: seen.append(n))
    assert sum(seen) == 7
    assert out.read_bytes() == full.read_bytes()
    st = store.load(out)
    assert st.labels.tolist() == labels.tolist() and st.num_images == 7 and st.pruned


def test_resume_refuses_a_work_folder_of_another_config(tmp_path):
    imgs, labels = smooth_images(3, 8, 8), np.zeros(3, int)
    out = tmp_path / "o.inr"
    done = []

    def killer(n, p):
        done.append(n)
        if len(done) == 2:
            raise Killed  # shard 0 is on disk
    with pytest.raises(Killed):
        encode_split(imgs, labels, small_cfg(), out, progress=killer)
    with pytest.raises(InputError, match=r"other settings \(encode.qat_iterations differs\)"):
        encode_split(imgs, labels, small_cfg(qat_iterations=3), out)


def test_failure_before_any_shard_leaves_no_work_folder(tmp_path):
    """Nothing fitted yet (out of memory on the first chunk, Ctrl-C): no OUT.work left to trip over."""
    imgs, labels = smooth_images(3, 8, 8), np.zeros(3, int)
    out = tmp_path / "o.inr"
    with pytest.raises(Killed):
        encode_split(imgs, labels, small_cfg(), out, progress=lambda n, p: (_ for _ in ()).throw(Killed()))
    assert list(tmp_path.iterdir()) == []
    encode_split(imgs, labels, small_cfg(qat_iterations=3), out)  # other settings: nothing to refuse


def test_cli_encode_and_inspect(tmp_path, capsys):
    from bench.datasets.prepared import SplitData, write_prepared

    imgs = smooth_images(5, 12, 16)  # non-square
    prepared = write_prepared(tmp_path / "prep", {"train": SplitData(imgs, np.arange(5) % 2)}, {"source": "test", "classes": ["a", "b"]})
    out = tmp_path / "s.inr"
    rc = main([
        "encode", str(prepared), "--preset", "demo", "--iterations", "40", "--layers", "2", "--hidden", "8",
        "--bits", "16:8:16", "--prune", "0.2", "--prune-rounds", "1", "--prune-finetune", "5",
        "--out", str(out), "--no-progress",
    ])
    assert rc == 0 and out.is_file()
    capsys.readouterr()
    assert main(["inspect", str(out), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["num_images"] == 5 and s["bits"] == [16, 8, 16] and s["image_size"] == [12, 16]
    assert s["bytes_per_image"] == out.stat().st_size / 5
    assert abs(s["pruned_fraction_of_weights"] - 0.2) < 0.01
    assert abs(s["psnr_db"]["mean"] - float(store.load(out).psnr.mean())) < 1e-6 and s["psnr_db"]["min"] > 10
    assert main(["inspect", str(out)]) == 0
    assert "bytes/image" in capsys.readouterr().out
    decoded = store.load(out).decode(torch.arange(5))
    assert decoded.shape == (5, 3, 12, 16)
    # bad input: one line, exit 2
    assert main(["inspect", str(tmp_path / "nope.inr")]) == 2
    assert "no such INR store file" in capsys.readouterr().err
    assert main(["encode", str(prepared), "--bits", "3", "--out", str(tmp_path / "x.inr")]) == 2


def test_fit_cache_reuses_fits_and_changes_nothing(tmp_path):
    imgs, labels = smooth_images(4, 10, 10), np.arange(4)
    cache = tmp_path / "cache"
    plain = encode_split(imgs, labels, small_cfg(), tmp_path / "plain.inr")
    first = encode_split(imgs, labels, small_cfg(), tmp_path / "first.inr", fit_cache=cache)
    entries = sorted(cache.glob("fit_*.inr"))
    assert len(entries) == 2  # one per shard
    stamp = [p.stat().st_mtime_ns for p in entries]
    again = encode_split(imgs, labels, small_cfg(), tmp_path / "again.inr", fit_cache=cache)
    assert [p.stat().st_mtime_ns for p in entries] == stamp  # reused, not refitted
    assert plain.read_bytes() == first.read_bytes() == again.read_bytes()


def test_prune_and_qat_work_in_chunks():
    """Pruning fine-tunes and QAT run chunk by chunk (masks follow their images)."""
    from inr.encode import encode_images
    from inr.quantize import dequantize

    imgs = smooth_images(5, 10, 10)
    fit = preset("demo", iterations=30, layers=2, hidden=8, batch=2)
    cfg = EncodeConfig(fit=fit, quant=QuantConfig((16, 8, 16)), prune=PruneConfig(ratio=0.25, rounds=1, finetune_iterations=5), qat_iterations=5)
    enc = encode_images(imgs, cfg)
    for ql, (i, o) in zip(enc.layers, fit.arch.shapes, strict=True):
        assert torch.all((~ql.mask).reshape(5, -1).sum(1) == round(0.25 * i * o))
    from inr.fit import decode_psnr

    assert np.allclose(enc.psnr, decode_psnr(dequantize(enc.layers), imgs, fit.arch))
    assert set(enc.stages) >= {"fit_psnr", "prune_psnr", "qat_psnr", "final_psnr"}
