"""Native-size prepared datasets (``prepare --size native``): mixed sizes and orientations
round-trip, consumers that need one size refuse them in one line, ``compare`` works per image."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bench.compare.config import CompareConfig
from bench.compare.core import InrDecoded
from bench.compare.run import run_compare
from bench.datasets.prepare import prepare_dataset
from bench.datasets.prepared import NATIVE_REFUSAL, SplitData, open_prepared, write_prepared
from bench.errors import InputError
from tests.cli_helpers import assert_one_line_error, run_cli

SIZES = [(24, 40), (40, 24), (32, 32), (24, 40), (17, 29)]  # landscape, portrait, square, repeat, odd


def _images(seed: int = 0) -> list[np.ndarray]:
    import skimage.data

    a = skimage.data.chelsea()
    rng = np.random.default_rng(seed)
    out = []
    for h, w in SIZES:
        y, x = int(rng.integers(0, a.shape[0] - h)), int(rng.integers(0, a.shape[1] - w))
        out.append(np.ascontiguousarray(a[y : y + h, x : x + w]))
    return out


@pytest.fixture(scope="module")
def native(tmp_path_factory):
    ims = _images()
    root = tmp_path_factory.mktemp("native") / "mixed"
    write_prepared(root, {"train": SplitData(ims, np.array([0, 1, 0, 1, 0], np.int64), ids=[str(i) for i in range(5)])},
                   {"source": "mixed", "classes": ["a", "b"]})
    return root, ims


def test_mixed_sizes_round_trip(native):
    root, ims = native
    ds = open_prepared(root)
    assert ds.native and ds.manifest["image_size"] is None
    sp = ds.native_split("train")
    assert [tuple(s) for s in sp.sizes] == SIZES and not sp.uniform
    for a, b in zip(sp.images, ims, strict=True):
        np.testing.assert_array_equal(a, b)
    assert list(sp.labels) == [0, 1, 0, 1, 0] and len(sp.jpeg_paths) == 5 and sp.jpeg_paths[1].is_file()
    # the JPEG tree keeps each image's size
    from PIL import Image

    with Image.open(sp.jpeg_paths[1]) as im:
        assert im.size == (24, 40)


def test_one_size_consumers_refuse_a_native_dataset(native, capsys, tmp_path):
    root, _ = native
    ds = open_prepared(root)
    for get in (lambda: ds.split("train"), lambda: ds.image_size):
        with pytest.raises(InputError, match="different sizes"):
            get()
    assert "\n" not in NATIVE_REFUSAL
    for pipeline in ("raw", "torch-jpeg", "inr"):
        argv = ("bench", "--pipeline", pipeline, "--data", str(root), "--mode", "loader", "--out", str(tmp_path / pipeline))
        if pipeline == "inr":
            argv += ("--store", str(tmp_path / "none.inr"))
        rc, _, err = run_cli(capsys, *argv)
        assert_one_line_error(rc, err)
        assert "different sizes" in err or "no such INR store" in err


def test_damaged_sizes_are_refused(native, tmp_path):
    import shutil

    root, _ = native
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    sizes = np.load(copy / "train" / "sizes.npy")
    sizes[[0, 1]] = sizes[[1, 0]]  # same pixel total, other shapes
    np.save(copy / "train" / "sizes.npy", sizes)
    with pytest.raises(InputError, match="sizes_sha256"):
        open_prepared(copy).native_split("train")


def test_photos_native_with_a_cap(tmp_path):
    out = prepare_dataset("photos", tmp_path / "p", size="native", max_side=64, per_class=2)
    ds = open_prepared(out)
    m = ds.manifest
    assert ds.native and m["config"]["max_side"] == 64 and m["source_meta"]["max_side"] == 64
    assert m["resize_policy"] == "native"
    sizes = np.concatenate([ds.native_split(s).sizes for s in ds.splits])
    assert sizes.max() <= 64 and len({tuple(s) for s in sizes.tolist()}) > 1
    with pytest.raises(InputError, match="does not support --size native"):
        prepare_dataset("synthetic", tmp_path / "s", size="native")
    with pytest.raises(InputError, match="--max-side needs --size native"):
        prepare_dataset("photos", tmp_path / "q", size=32, max_side=64)


def test_compare_works_per_image_on_native_sizes(native, tmp_path):
    root, ims = native
    rng = np.random.default_rng(1)
    dec = [np.clip(im + rng.normal(0, 4, im.shape), 0, 255).round().astype(np.uint8) for im in ims]
    v = InrDecoded(name="8bit", bytes_per_image=600.0, decoded=dec)
    cfg = CompareConfig(qualities=(20, 80), codecs=("jpeg", "webp"))
    res = run_compare(root, [], cfg, tmp_path / "cmp", variants=[v], env=False)
    pi = res.per_image
    inr = pi[pi.method == "inr"].sort_values("image")
    px = np.array([h * w for h, w in SIZES], float)
    np.testing.assert_allclose(inr.bpp, 600.0 * 8 / px)  # bytes per pixel are per image
    # per-image PSNR equals the PSNR of that image alone
    from bench.compare.quality import psnr

    for i in range(len(ims)):
        assert inr.psnr.iloc[i] == pytest.approx(psnr(dec[i][None], ims[i][None])[0])
    w = pi[(pi.method == "webp-sweep") & (pi.quality == 80)].sort_values("image")
    np.testing.assert_allclose(w.bpp, w.file_bytes * 8 / px)
    meta = json.loads((res.out / "config.json").read_text())
    assert meta["native"] and meta["image_size"] is None and meta["image_sizes"]["distinct"] == 4
    assert "native sizes: 4 distinct" in (res.out / "summary.md").read_text()


@pytest.fixture(scope="module")
def native_store(native, tmp_path_factory):
    from bench.datasets.identity import source_record
    from inr.encode import EncodeConfig
    from inr.fit import preset
    from inr.native import encode_native
    from inr.quantize import QuantConfig

    root, ims = native
    ds = open_prepared(root)
    cfg = EncodeConfig(fit=preset("demo", iterations=40), quant=QuantConfig((8,) * 6))
    out = tmp_path_factory.mktemp("nstore") / "n.inr"
    sp = ds.native_split("train")
    encode_native(list(sp.images), sp.labels, cfg, out, source=source_record(ds, "train"))
    return out


def test_native_store_round_trips_per_image(native, native_store):
    from bench.metrics import to_uint8
    from inr.store import load

    _, ims = native
    st = load(native_store)
    assert "sizes" in {a["name"] for a in st.header["arrays"]}
    assert [tuple(x) for x in st.image_sizes] == SIZES
    from bench.compare.quality import psnr

    alone = []
    for i, im in enumerate(ims):
        x = to_uint8(st.decode(torch_idx([i]))).permute(0, 2, 3, 1).numpy()
        assert x.shape == (1, *im.shape)
        alone.append(x[0])
        assert psnr(x, im[None])[0] == pytest.approx(float(st.psnr[i]), abs=0.02)  # stored at encode time (float16)
    both = to_uint8(st.decode(torch_idx([0, 3]))).permute(0, 2, 3, 1).numpy()  # the two 24x40 images together
    assert np.abs(both.astype(int) - np.stack([alone[0], alone[3]]).astype(int)).max() <= 1
    with pytest.raises(ValueError, match="different sizes"):
        st.decode(torch_idx([0, 1]))


def torch_idx(ix):
    import torch

    return torch.tensor(ix, dtype=torch.int64)


def test_damaged_native_store_is_refused(native_store, tmp_path):
    from inr.store import load

    data = bytearray(native_store.read_bytes())
    st = load(native_store)
    entry = next(e for e in st.header["arrays"] if e["name"] == "sizes")
    from inr.store import ALIGN, PREFIX

    hlen = int.from_bytes(data[12:16], "little")
    start = -(-(PREFIX.size + hlen) // ALIGN) * ALIGN + entry["offset"]
    data[start] ^= 0x01
    bad = tmp_path / "bad.inr"
    bad.write_bytes(bytes(data))
    with pytest.raises(InputError, match="'sizes'"):
        load(bad)


def test_compare_and_inspect_a_native_store(native, native_store, tmp_path, capsys):
    root, ims = native
    cfg = CompareConfig(qualities=(50,), codecs=("jpeg",), match="file")
    res = run_compare(root, [native_store], cfg, tmp_path / "cmp", env=False)
    inr = res.per_image[res.per_image.method == "inr"].sort_values("image")
    px = np.array([h * w for h, w in SIZES], float)
    np.testing.assert_allclose(inr.bpp, inr.file_bytes * 8 / px)
    from inr.store import load

    st = load(native_store)
    np.testing.assert_allclose(inr.psnr, st.psnr.astype(float), atol=0.02)
    rc, out, _ = run_cli(capsys, "inspect", str(native_store))
    assert rc == 0 and "native sizes (4 distinct, 17x29 .. 32x32" in out
