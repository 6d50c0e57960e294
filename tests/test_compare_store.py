"""`inrbench compare` on real INR stores (fitted quickly with the codec's test helper)."""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd
import pytest
import torch

from bench.datasets.identity import source_record
from bench.datasets.prepared import SplitData, open_prepared, write_prepared
from bench.errors import InputError

N, S = 4, 32


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    import skimage.data
    from skimage.transform import resize

    store_mod = pytest.importorskip("inr.store", reason="the INR codec (inr.store) is not importable")
    from inr.fit import decode_psnr, fit, preset
    from inr.quantize import QuantConfig, dequantize, quantize

    a = skimage.data.astronaut()
    imgs = np.stack([(resize(a[k * 100 : k * 100 + 256, k * 60 : k * 60 + 256], (S, S), anti_aliasing=True) * 255)
                     .round().astype(np.uint8) for k in range(N)])
    root = tmp_path_factory.mktemp("st") / "prep"
    write_prepared(root, {"train": SplitData(imgs, np.arange(N) % 2)}, {"source": "tiny", "classes": ["a", "b"]})
    # One short fit, stored three ways: float32, 8-bit, and 8-bit with half the weights pruned.
    cfg = preset("demo", iterations=30, lr=5e-3)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls: 2 OpenMP threads on a busy 2-core box run ~40x slower
    try:
        weights = fit(imgs, cfg).weights
    finally:
        torch.set_num_threads(threads)
    masks = [W.abs() >= W.abs().flatten(1).median(1).values[:, None, None] for W, _ in weights]
    d = tmp_path_factory.mktemp("stores")
    stores = []
    for name, bits, m in (("fp32", 32, None), ("8bit", 8, None), ("pruned-8bit", 8, masks)):
        layers = quantize(weights, QuantConfig((bits,) * cfg.arch.num_linear), masks=m)
        p = decode_psnr(dequantize(layers), imgs, cfg.arch)  # the codec's own PSNR
        stores.append(store_mod.save(d / f"{name}.inr", cfg.arch, (S, S), np.arange(N) % 2, layers, psnr=p,
                                     meta={"variant": name, "source": source_record(open_prepared(root), "train")}))
    return root, stores, store_mod


def _cli(argv):
    from bench.commands import compare

    p = argparse.ArgumentParser()
    compare.add_arguments(p)
    return compare.run(p.parse_args(argv))


def test_compare_real_stores(setup, tmp_path):
    root, stores, store_mod = setup
    out = tmp_path / "cmp"
    assert _cli([str(root), "--store", *map(str, stores), "--jpeg-qualities", "10", "90", "--out", str(out)]) == 0
    pi = pd.read_csv(out / "per_image.csv")
    s = pd.read_csv(out / "summary.csv")
    for path, name in zip(stores, ("fp32", "8bit", "pruned-8bit"), strict=True):
        st = store_mod.load(path, "cpu")
        row = s[(s.method == "inr") & (s.variant == name)].iloc[0]
        assert row["file_bytes"] == pytest.approx(path.stat().st_size / N)  # header amortized
        arrays = [a for a in st.header["arrays"] if a["name"].startswith(("codes", "scales", "mask"))]
        assert row["header_free_bytes"] == pytest.approx(sum(a["nbytes"] for a in arrays) / N)
        got = pi[(pi.method == "inr") & (pi.variant == name)].sort_values("image")["psnr"].to_numpy()
        # the codec records PSNR with the same bench.metrics convention at encode time
        # to the precision the store keeps it in (float16 values: half a unit in the last place)
        rec = np.asarray(st.psnr, dtype=np.float64)
        half_ulp = np.spacing(np.abs(rec).astype(np.float16)).astype(np.float64) / 2
        assert np.all(np.abs(got - rec) <= half_ulp + 1e-6), (got, rec)
        assert (out / f"weights_{name}.png").is_file()
    h = pd.read_csv(out / "weights_hist.csv")
    for name, path in (("8bit", stores[1]), ("pruned-8bit", stores[2])):
        w0 = store_mod.load(path, "cpu").weights(torch.arange(N))[0][0]
        hist = h[(h.variant == name) & (h.group == "first")]
        assert hist["count"].sum() == int((w0 != 0).sum())
        assert hist["zeros_left_out"].iloc[0] == int((w0 == 0).sum())
    assert h[(h.variant == "pruned-8bit") & (h.group == "first")]["zeros_left_out"].iloc[0] >= w0.numel() // 2 - N
    b = s[s.method == "inr"].set_index("variant")["file_bytes"]
    assert b["pruned-8bit"] < b["8bit"] < b["fp32"]


def test_store_of_another_split_is_refused(setup, tmp_path):
    root, stores, _ = setup
    # refused by the source identity check (bench.datasets.identity) before any count or label check
    with pytest.raises(InputError, match=r"encoded from other images \(or labels\)"):
        prep = tmp_path / "bigger"
        ds = open_prepared(root).split("train")
        imgs = np.concatenate([np.asarray(ds.images)] * 2)
        write_prepared(prep, {"train": SplitData(imgs, np.zeros(2 * N, np.int64))}, {"source": "x", "classes": ["a"]})
        _cli([str(prep), "--store", str(stores[0]), "--out", str(tmp_path / "o")])
    with pytest.raises(InputError, match=r"encoded from other images \(or labels\)"):
        prep2 = tmp_path / "relabelled"
        write_prepared(prep2, {"train": SplitData(np.asarray(ds.images), np.full(N, 1, np.int64))},
                       {"source": "x", "classes": ["a", "b"]})
        _cli([str(prep2), "--store", str(stores[0]), "--out", str(tmp_path / "o2")])


def test_store_of_this_datasets_other_split_says_so(setup, tmp_path, capsys):
    """audit #11: a store encoded from this dataset's train split, compared on --split test, is refused
    for the split it was encoded from (not "use the store of this dataset"), and the suggested encode
    command quotes a path with a space and names --split test."""
    import shlex

    from bench.cli import main

    root, stores, _ = setup
    train = open_prepared(root).split("train")
    prep = tmp_path / "w" / "photos 32"  # the same train images as the store's, moved and with a test split
    write_prepared(prep, {"train": SplitData(np.asarray(train.images), np.asarray(train.labels)),
                          "test": SplitData(255 - np.asarray(train.images), np.asarray(train.labels))},
                   {"source": "tiny", "classes": ["a", "b"]})
    code = main(["compare", str(prep), "--store", str(stores[1]), "--split", "test", "--limit", "2",
                 "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "encoded from split 'train' of this dataset" in err[0] and "not from split 'test'" in err[0]
    assert "`--split train`" in err[0]
    assert f"`inrbench encode {shlex.quote(str(prep))} --split test --out STORE.inr`" in err[0]
    assert "other images" not in err[0]


def test_store_of_other_images_suggests_encoding_this_split(setup, tmp_path):
    """A store of another dataset: the encode command names this dataset (quoted) and the split compared."""
    import shlex

    root, stores, _ = setup
    train = open_prepared(root).split("train")
    prep = tmp_path / "my data"
    write_prepared(prep, {"val": SplitData(255 - np.asarray(train.images), np.asarray(train.labels))},
                   {"source": "x", "classes": ["a", "b"]})
    with pytest.raises(InputError) as e:
        _cli([str(prep), "--store", str(stores[1]), "--split", "val", "--out", str(tmp_path / "o")])
    msg = str(e.value)
    assert "encoded from other images (or labels)" in msg
    assert f"`inrbench encode {shlex.quote(str(prep))} --split val --out STORE.inr`" in msg
