"""``prepare imagefolder --size native`` on a real image folder (Kodak-like: a flat folder of PNG/JPEG
files of mixed sizes and orientations), then ``encode`` / ``compare`` / ``inspect`` per image, and
the resumable native encode (``inr.native``: one shard per size group, skipped on rerun, same bytes)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from fixtures_datasets import png_claiming, write_flowers102, write_miniimagenet
from PIL import Image

from bench.datasets.prepare import prepare_dataset
from bench.datasets.prepared import open_prepared
from bench.errors import InputError
from tests.cli_helpers import assert_one_line_error, run_cli

# (file, (H, W)): landscape and portrait PNGs, a square JPEG, a repeated size, a tall one past the cap
FILES = [("a.png", (24, 36)), ("b.png", (36, 24)), ("c.jpg", (20, 20)), ("d.png", (24, 36)), ("e.png", (50, 30))]
REPO = Path(__file__).resolve().parents[1]


def _photo(h: int, w: int, seed: int) -> np.ndarray:
    """A crop of a real photograph (smooth enough for a tiny SIREN to fit), uint8 ``[h, w, 3]``."""
    import skimage.data

    a = skimage.data.chelsea()
    rng = np.random.default_rng(seed)
    y, x = int(rng.integers(0, a.shape[0] - h)), int(rng.integers(0, a.shape[1] - w))
    return np.ascontiguousarray(a[y : y + h, x : x + w])


def write_folder(root: Path) -> dict[str, np.ndarray]:
    """The flat test folder; returns file name -> the pixels PIL reads back from it."""
    root.mkdir(parents=True)
    out = {}
    for i, (name, (h, w)) in enumerate(FILES):
        Image.fromarray(_photo(h, w, i)).save(root / name)
        with Image.open(root / name) as im:
            out[name] = np.asarray(im.convert("RGB"))
    return out


@pytest.fixture(scope="module")
def kodak(tmp_path_factory):
    """(folder, pixels per file, prepared --size native folder, store encoded by the CLI)."""
    from bench import cli  # a module fixture has no capsys: the CLI's main, its output not checked

    top = tmp_path_factory.mktemp("kodak")
    pixels = write_folder(top / "kodak")
    prep = top / "p"
    assert cli.main(["prepare", "imagefolder", "--root", str(top / "kodak"), "--size", "native",
                     "--out", str(prep)]) == 0
    store = top / "s.inr"
    assert cli.main(["encode", str(prep), "--preset", "demo", "--iterations", "40", "--bits", "8", "--threads", "1",
                     "--no-progress", "--out", str(store)]) == 0
    return top / "kodak", pixels, prep, store


def test_keep_work_reaches_the_native_encode(kodak, tmp_path):
    from bench import cli

    _, _, prep, store = kodak
    out = tmp_path / "kept.inr"
    assert cli.main(["encode", str(prep), "--preset", "demo", "--iterations", "40", "--bits", "8", "--threads", "1",
                     "--no-progress", "--keep-work", "--out", str(out)]) == 0
    assert sorted(p.name for p in (tmp_path / ".kept.inr.inrbench-encode.work").glob("shard_*.inr"))
    assert out.read_bytes() == store.read_bytes()  # same images, same settings: the same store


def test_flat_folder_keeps_every_size_exactly(kodak):
    root, pixels, prep, _ = kodak
    ds = open_prepared(prep)
    m = ds.manifest
    assert ds.native and m["resize_policy"] == "native" and m["classes"] == ["kodak"] and list(ds.splits) == ["train"]
    assert m["source_meta"]["split_rule"].startswith("flat folder") and m["source_meta"]["downscaled"] == []
    sp = ds.native_split("train")
    ids = json.loads((prep / "train" / "source_ids.json").read_text())
    assert sorted(ids) == [f for f, _ in FILES] and list(sp.labels) == [0] * 5
    for i, name in enumerate(ids):
        assert tuple(sp.sizes[i]) == dict(FILES)[name]
        np.testing.assert_array_equal(sp.images[i], pixels[name])  # not resampled (PNG exact; JPEG as PIL decodes it)


def test_max_side_caps_the_long_side_and_is_recorded(kodak, tmp_path, capsys):
    root, pixels, _, _ = kodak
    rc, _, err = run_cli(capsys, "prepare", "imagefolder", "--root", root, "--size", "native", "--max-side", 32,
                         "--out", tmp_path / "p")
    assert rc == 0, err
    ds = open_prepared(tmp_path / "p")
    sp = ds.native_split("train")
    ids = json.loads((tmp_path / "p" / "train" / "source_ids.json").read_text())
    got = {name: tuple(s) for name, s in zip(ids, sp.sizes.tolist(), strict=True)}
    # 50x30 -> long side 32, aspect kept: 30 * 32 / 50 = 19.2 -> 19; the others are under the cap
    assert got["e.png"] == (32, 19) and got["b.png"] == (32, 21) and got["a.png"] == (21, 32)
    assert got["c.jpg"] == (20, 20) and got["d.png"] == (21, 32)
    m = ds.manifest
    assert m["config"]["max_side"] == 32 and m["source_meta"]["max_side"] == 32
    down = {d["file"]: (d["from"], d["to"]) for d in m["source_meta"]["downscaled"]}
    assert down == {"a.png": ([24, 36], [21, 32]), "b.png": ([36, 24], [32, 21]), "d.png": ([24, 36], [21, 32]),
                    "e.png": ([50, 30], [32, 19])}
    c = sp.images[ids.index("c.jpg")]
    np.testing.assert_array_equal(c, pixels["c.jpg"])  # under the cap: untouched


def test_class_tree_mixed_sizes_with_broken_files_and_bombs(tmp_path, capsys):
    """Class folders + seeded split, mixed sizes in one split; --on-error skip lists the broken file
    and the pixel bomb (refused from its header), the rest keep their sizes."""
    tree = tmp_path / "tree"
    for c, cls in enumerate(("cat", "dog")):
        (tree / cls).mkdir(parents=True)
        for i, (name, (h, w)) in enumerate(FILES[:4]):
            Image.fromarray(_photo(h, w, 10 * c + i)).save(tree / cls / name)
    (tree / "cat" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\nnot a png")
    png_claiming(tree / "dog" / "bomb.png", 20000, 20000)
    rc, _, err = run_cli(capsys, "prepare", "imagefolder", "--root", tree, "--size", "native", "--out",
                         tmp_path / "p", "--val-fraction", "0.5")
    line = assert_one_line_error(rc, err)  # --on-error fail: the first bad file of the first split stops it
    assert "broken.png: cannot read image" in line or "bomb.png: image is 20000x20000" in line
    rc, _, err = run_cli(capsys, "prepare", "imagefolder", "--root", tree, "--size", "native", "--out",
                         tmp_path / "p", "--val-fraction", "0.5", "--on-error", "skip")
    assert rc == 0, err
    ds = open_prepared(tmp_path / "p")
    skipped = {Path(s["file"]).name: s["error"] for s in ds.manifest["skipped"]}
    assert set(skipped) == {"broken.png", "bomb.png"} and "over the --max-pixels limit" in skipped["bomb.png"]
    sizes = {n: {tuple(s) for s in ds.native_split(n).sizes.tolist()} for n in ds.splits}
    assert set(ds.splits) == {"train", "val"} and sum(len(ds.native_split(n)) for n in ds.splits) == 8
    assert sizes["train"] | sizes["val"] == {(24, 36), (36, 24), (20, 20)} and len(sizes["train"]) > 1


@pytest.mark.parametrize("source, write, own, capped", [
    ("flowers102", write_flowers102, (48, 64), (30, 40)),  # the fixture's JPEGs are 64x48 (W x H)
    ("mini-imagenet", write_miniimagenet, (40, 50), (32, 40)),
])
def test_file_sources_share_the_native_path(tmp_path, source, write, own, capped):
    write(tmp_path / "src")
    for cap, want in ((None, own), (40, capped)):
        ds = open_prepared(prepare_dataset(source, tmp_path / f"p{cap}", root=tmp_path / "src", size="native",
                                           max_side=cap))
        assert ds.native and ds.manifest["resize_policy"] == "native" and ds.manifest["source_meta"]["max_side"] == cap
        n = sum(len(ds.native_split(s)) for s in ds.splits)
        assert {tuple(x) for s in ds.splits for x in ds.native_split(s).sizes.tolist()} == {want}
        assert len(ds.manifest["source_meta"]["downscaled"]) == (0 if cap is None else n)


def test_native_refused_where_images_are_one_size(tmp_path, capsys):
    with pytest.raises(InputError, match=r"'synthetic' does not support --size native \(it makes images of one "
                                         r"size; flowers102, imagefolder, mini-imagenet, photos do\)"):
        prepare_dataset("synthetic", tmp_path / "s", size="native")
    (tmp_path / "c10").mkdir()
    rc, _, err = run_cli(capsys, "prepare", "cifar10", "--root", tmp_path / "c10", "--size", "native",
                         "--out", tmp_path / "c")
    assert_one_line_error(rc, err, "'cifar10' does not support --size native", "leave out --size")
    (tmp_path / "k").mkdir()
    Image.new("RGB", (9, 8)).save(tmp_path / "k" / "x.png")
    rc, _, err = run_cli(capsys, "prepare", "imagefolder", "--root", tmp_path / "k", "--size", "native",
                         "--resize-policy", "resize", "--out", tmp_path / "o")
    assert_one_line_error(rc, err, "--resize-policy does not apply with --size native")


def test_encode_round_trips_sizes_and_per_image_psnr(kodak):
    import torch

    from bench.compare.quality import psnr
    from bench.metrics import to_uint8
    from inr.store import load

    _, _, prep, store = kodak
    sp = open_prepared(prep).native_split("train")
    st = load(store)
    np.testing.assert_array_equal(st.image_sizes, sp.sizes)
    assert st.meta["native"]["groups"] == 4 and [s["size"] for s in st.meta["native"]["shards"]] == \
        [list(s) for s in dict.fromkeys(map(tuple, sp.sizes.tolist()))]
    assert not store.with_name(f".{store.name}.inrbench-encode.work").exists()
    for i, im in enumerate(sp.images):
        x = to_uint8(st.decode(torch.tensor([i]))).permute(0, 2, 3, 1).numpy()
        assert x.shape == (1, *im.shape)
        p = psnr(x, im[None])[0]
        assert p == pytest.approx(float(st.psnr[i]), abs=0.02) and p > 15.0


def test_compare_limit_and_inspect_on_native(kodak, tmp_path, capsys):
    _, _, prep, store = kodak
    rc, _, err = run_cli(capsys, "compare", prep, "--store", store, "--limit", 3, "--jpeg-qualities", 50,
                         "--match", "file", "--out", tmp_path / "cmp")
    assert rc == 0, err
    import pandas as pd

    pi = pd.read_csv(tmp_path / "cmp" / "per_image.csv")
    inr = pi[pi.method == "inr"].sort_values("image")
    sizes = open_prepared(prep).native_split("train").sizes[:3]
    assert len(inr) == 3
    np.testing.assert_allclose(inr.bpp, inr.file_bytes * 8 / (sizes[:, 0] * sizes[:, 1]))
    rc, out, _ = run_cli(capsys, "inspect", store)
    assert rc == 0 and "native sizes (4 distinct, 20x20 .. 50x30" in out


def test_bench_refuses_a_native_dataset(kodak, tmp_path, capsys):
    _, _, prep, _ = kodak
    rc, _, err = run_cli(capsys, "bench", "--pipeline", "raw", "--data", prep, "--mode", "loader",
                         "--out", tmp_path / "r")
    assert_one_line_error(rc, err, "different sizes", "--size S")


# ----------------------------------------------------------------------------- resume


def _sha(p: Path) -> str:
    return hashlib.sha256(Path(p).read_bytes()).hexdigest()


def _cfg(shard_size: int = 1):
    from inr.encode import EncodeConfig
    from inr.fit import preset
    from inr.quantize import QuantConfig

    return EncodeConfig(fit=preset("demo", iterations=20), quant=QuantConfig((8,) * 6), shard_size=shard_size)


def test_resume_skips_finished_shards_and_writes_the_same_bytes(kodak, tmp_path, monkeypatch):
    import torch

    import inr.native as native

    torch.set_num_threads(1)
    _, _, prep, _ = kodak
    sp = open_prepared(prep).native_split("train")
    ims, labels = list(sp.images), sp.labels
    out = tmp_path / "n.inr"
    work = tmp_path / ".n.inr.inrbench-encode.work"
    # shard_size 1: 5 shards (the 24x36 group of two is cut in two)
    assert [s.index for s in native.native_shards(sp.sizes, 1)] == [[0], [3], [1], [2], [4]]
    assert [s.first_index for s in native.native_shards(sp.sizes, 1)] == [0, 1, 1, 2, 4]
    native.encode_native(ims, labels, _cfg(), out, keep_work=True)
    whole = _sha(out)
    assert sorted(p.name for p in work.iterdir()) == [f"shard_{i:05d}.inr" for i in range(5)] + ["work.json"]
    (work / "shard_00002.inr").unlink()  # as if killed before that shard was written
    (work / "shard_00003.inr").write_bytes((work / "shard_00003.inr").read_bytes()[:-7])  # killed mid-write
    calls = []
    real = native.encode_images
    monkeypatch.setattr(native, "encode_images", lambda *a, **k: calls.append(k["first_index"]) or real(*a, **k))
    seen = []
    native.encode_native(ims, labels, _cfg(), out, overwrite=True, progress=lambda k, p: seen.append(k))
    assert calls == [1, 2] and sum(seen) == 5  # shards 2 and 3 refitted (seed indices 1, 2), three resumed
    assert _sha(out) == whole and not work.exists()
    # the same store as a group fitted in one shard (splitting a group keeps each image's seed)
    one = tmp_path / "one.inr"
    native.encode_native(ims, labels, _cfg(shard_size=8), one)
    from inr.store import load

    np.testing.assert_array_equal(load(one).psnr, load(out).psnr)


def test_resume_refuses_a_work_folder_of_other_settings(kodak, tmp_path):
    import inr.native as native

    _, _, prep, _ = kodak
    sp = open_prepared(prep).native_split("train")
    out = tmp_path / "n.inr"
    work = tmp_path / ".n.inr.inrbench-encode.work"
    work.mkdir()
    (work / "work.json").write_text(json.dumps({"kind": "encode-work", "schema_version": 3, "job": {"encode": {}}}))
    with pytest.raises(InputError, match="holds the work of an inrbench encode with other settings"):
        native.encode_native(list(sp.images), sp.labels, _cfg(), out)
    assert not out.exists() and (work / "work.json").is_file()


def _encode_cmd(prep: Path, out: Path, iterations: int) -> list[str]:
    return [sys.executable, "-m", "bench", "encode", str(prep), "--preset", "demo", "--iterations", str(iterations),
            "--bits", "8", "--shard-size", "1", "--threads", "1", "--no-progress", "--out", str(out)]


def test_killed_encode_resumes_to_the_same_bytes(kodak, tmp_path, capsys):
    """A real SIGKILL of ``inrbench encode`` after its first shards: the rerun fits only the rest and
    writes the bytes of an uninterrupted encode. Only the killed encode needs its own process: the
    uninterrupted encode and the rerun run in this one (``cli.main``)."""
    from bench import cli

    _, _, prep, _ = kodak
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    iters = 150
    full = tmp_path / "full.inr"
    assert cli.main(_encode_cmd(prep, full, iters)[3:]) == 0
    out = tmp_path / "k.inr"
    work = tmp_path / ".k.inr.inrbench-encode.work"
    proc = subprocess.Popen(_encode_cmd(prep, out, iters), env=env, cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (work / "shard_00001.inr").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert not out.exists(), "killed too late: the encode had finished"
    done = sorted(p.name for p in work.glob("shard_*.inr"))
    assert "shard_00001.inr" in done and len(done) < 5
    capsys.readouterr()
    assert cli.main(_encode_cmd(prep, out, iters)[3:]) == 0
    assert f"resuming, {len(done)} of 5 shards already fitted" in capsys.readouterr().out
    assert _sha(out) == _sha(full) and not work.exists()
