"""`inrbench compare` end to end on a tiny prepared set with stand-in INR reconstructions.

The INR variants here are decoded images supplied directly (``InrDecoded``: originals plus
seeded noise, with a chosen bytes-per-image), so the JPEG matching, tables and figures are
tested without the codec; ``tests/test_compare_store.py`` runs real stores.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
import pandas as pd
import pytest

from bench.compare import figures
from bench.compare.codecs import Ladder, create
from bench.compare.config import CompareConfig
from bench.compare.core import InrDecoded
from bench.compare.jpeg import exhaustive_quality
from bench.compare.run import run_compare
from bench.datasets.prepared import SplitData, write_prepared
from bench.errors import InputError
from bench.metrics import mean_psnr, psnr_per_image

N, S = 6, 32


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    import skimage.data
    from skimage.transform import resize

    imgs = []
    for k, name in enumerate(("astronaut", "coffee", "chelsea")):
        a = getattr(skimage.data, name)()[..., :3]
        for j in range(2):  # two crops per photo
            h, w = a.shape[:2]
            c = a[j * h // 4 : j * h // 4 + h // 2, k * w // 8 : k * w // 8 + w // 2]
            imgs.append((resize(c, (S, S), anti_aliasing=True) * 255).round().astype(np.uint8))
    images = np.stack(imgs)
    labels = np.repeat(np.arange(3), 2).astype(np.int64)
    root = tmp_path_factory.mktemp("cmp") / "tiny"
    write_prepared(root, {"train": SplitData(images, labels)}, {"source": "tiny", "classes": ["a", "b", "c"]})
    return root, images


def _variants(images):
    rng = np.random.default_rng(0)
    out = []
    for name, sigma, nbytes in (("8bit", 5.0, 950.0), ("pruned-8bit", 8.0, 160.0)):
        dec = np.clip(images + rng.normal(0, sigma, images.shape), 0, 255).round().astype(np.uint8)
        w = {f"layer{i}": np.where(rng.random(500) < 0.2, 0.0, rng.normal(0.05 * i, 0.1, 500)) for i in range(4)}
        out.append(InrDecoded(name=name, bytes_per_image=nbytes, decoded=dec, weights=w))
    return out


@pytest.fixture(scope="module")
def result(prepared, tmp_path_factory):
    root, images = prepared
    cfg = CompareConfig(qualities=(10, 50, 90), limit=N)
    out = tmp_path_factory.mktemp("out") / "cmp"
    return run_compare(root, [], cfg, out, variants=_variants(images), env=False), images


def test_outputs_written(result):
    res, _ = result
    names = {p.name for p in res.out.iterdir()}
    assert {"per_image.csv", "summary.csv", "summary.md", "config.json", "psnr_vs_bytes.png",
            "psnr_spread.png", "weights_8bit.png", "weights_hist.csv"} <= names
    assert not [p for p in res.out.parent.iterdir() if p.name.startswith(".")]  # no temp left
    meta = json.loads((res.out / "config.json").read_text())
    assert meta["config"]["qualities"] == [10, 50, 90] and meta["n_images"] == N
    assert meta["raw_bytes_per_image"] == S * S * 3


def test_inr_rows_use_the_psnr_convention(result):
    res, images = result
    pi = pd.read_csv(res.out / "per_image.csv")
    dec = _variants(images)[0].decoded
    got = pi[(pi.method == "inr") & (pi.variant == "8bit")].sort_values("image")["psnr"].to_numpy(float, copy=True)
    np.testing.assert_allclose(got, psnr_per_image(dec, images).numpy())
    s = pd.read_csv(res.out / "summary.csv")
    row = s[(s.method == "inr") & (s.variant == "8bit")].iloc[0]
    assert row["psnr"] == pytest.approx(mean_psnr(got))
    assert row["bpp"] == pytest.approx(950 * 8 / (S * S)) and row["pct_raw"] == pytest.approx(950 / 3072 * 100)


def test_matched_quality_is_the_highest_that_fits(result):
    res, images = result
    pi = pd.read_csv(res.out / "per_image.csv")
    m = pi[(pi.method == "jpeg-matched") & (pi.variant == "8bit")]
    assert len(m) == 2 * N and (m.status == "ok").all()
    for _, r in m.iterrows():
        ladder = Ladder(create("jpeg"), images[int(r.image)])
        assert r.quality == exhaustive_quality(ladder.size(r.match), 950.0)
        col = "file_bytes" if r.match == "file" else "header_free_bytes"
        assert r[col] <= 950 and r[col] == getattr(ladder(int(r.quality)), "file_bytes" if r.match == "file" else "payload_bytes")


def test_unreachable_target_is_a_row_not_a_gap(result):
    res, images = result
    pi = pd.read_csv(res.out / "per_image.csv")
    u = pi[(pi.method == "jpeg-matched") & (pi.variant == "pruned-8bit") & (pi.match == "file")]
    assert len(u) == N and (u.status == "unreachable").all() and u.quality.isna().all()
    smallest = [Ladder(create("jpeg"), im)(1).file_bytes for im in images]
    np.testing.assert_array_equal(u.sort_values("image")["min_bytes"].to_numpy(), smallest)
    s = pd.read_csv(res.out / "summary.csv")
    row = s[(s.method == "jpeg-matched") & (s.variant == "pruned-8bit") & (s.match == "file")].iloc[0]
    assert row["status"] == "unreachable" and row["n_ok"] == 0 and row["min_bytes"] > 160
    hf = s[(s.method == "jpeg-matched") & (s.variant == "pruned-8bit") & (s.match == "header-free")].iloc[0]
    assert hf["n_ok"] > 0 and hf["header_free_bytes"] <= 160  # header-free bytes can get there
    md = (res.out / "summary.md").read_text()
    assert "| jpeg @ inr-pruned-8bit | file |" in md and "unreachable" in md


def test_rd_figure_holds_the_csv_series(result):
    res, _ = result
    s = pd.read_csv(res.out / "summary.csv").fillna({"match": "", "variant": ""})
    fig = figures.rd_figure(s, (S, S))
    lines = {ln.get_gid(): ln for ln in fig.axes[0].get_lines() if ln.get_gid()}
    sw = s[s.method == "jpeg-sweep"].sort_values("quality")
    np.testing.assert_allclose(lines["jpeg-sweep:file"].get_xdata(), sw.file_bytes)
    np.testing.assert_allclose(lines["jpeg-sweep:file"].get_ydata(), sw.psnr)
    np.testing.assert_allclose(lines["jpeg-sweep:header-free"].get_xdata(), sw.header_free_bytes)
    inr = s[(s.method == "inr") & (s.variant == "8bit")].iloc[0]
    assert list(lines["inr:8bit"].get_xydata()[0]) == pytest.approx([950.0, inr.psnr])
    mt = s[(s.method == "jpeg-matched") & (s.variant == "8bit") & (s.match == "file")].iloc[0]
    assert list(lines["jpeg-matched:file:8bit"].get_xydata()[0]) == pytest.approx([mt.file_bytes, mt.psnr])
    assert "jpeg-matched:header-free:pruned-8bit" in lines
    assert "jpeg-matched:file:pruned-8bit" not in lines  # unreachable: no point, a note instead
    assert any("JPEG cannot reach" in t.get_text() for t in fig.axes[0].texts)
    from bench import plotstyle

    assert lines["jpeg-sweep:file"].get_color() == plotstyle.color("jpeg")
    assert lines["inr:8bit"].get_color() == plotstyle.color("inr-8bit")
    figures.plt.close(fig)


def test_spread_and_weight_figures_hold_the_data(result):
    res, images = result
    pi = pd.read_csv(res.out / "per_image.csv").fillna({"match": "", "variant": ""})
    fig = figures.spread_figure(pi)
    ax = fig.axes[0]
    meds = {ln.get_gid()[len("median:"):]: ln.get_ydata()[0] for ln in ax.get_lines() if (ln.get_gid() or "").startswith("median:")}
    for label, _, vals in figures.spread_groups(pi):
        assert meds[label] == pytest.approx(np.median(vals))
    assert [t.get_text() for t in ax.get_xticklabels()] == [g[0] for g in figures.spread_groups(pi)]
    figures.plt.close(fig)

    w = _variants(images)[0].weights
    fig = figures.weights_figure(w, "8bit")
    steps = {p.get_gid(): p for ax in fig.axes for p in ax.patches if p.get_gid()}
    assert set(steps) == {"hist:first", "hist:hidden", "hist:last"}
    assert steps["hist:first"].get_data().values.sum() == np.count_nonzero(w["layer0"])
    assert steps["hist:hidden"].get_data().values.sum() == np.count_nonzero(w["layer1"]) + np.count_nonzero(w["layer2"])
    figures.plt.close(fig)
    h = pd.read_csv(res.out / "weights_hist.csv")
    assert h[(h.variant == "8bit") & (h.group == "last")]["count"].sum() == np.count_nonzero(w["layer3"])


def _cli(argv):
    from bench.commands import compare

    p = argparse.ArgumentParser()
    compare.add_arguments(p)
    return compare.run(p.parse_args(argv))


def test_cli_bad_input_is_one_line_error(prepared, tmp_path):
    root, _ = prepared
    with pytest.raises(InputError, match="no such prepared dataset"):
        _cli([str(tmp_path / "missing"), "--out", str(tmp_path / "o")])
    with pytest.raises(ValueError, match="--jpeg-qualities: JPEG qualities must be in 1..100"):
        CompareConfig(qualities=(0,))  # the library's check names the option too; the CLI refuses it while parsing
    with pytest.raises(InputError, match="no such INR store"):
        _cli([str(root), "--store", str(tmp_path / "nope.inr"), "--out", str(tmp_path / "o")])
    os.mkfifo(tmp_path / "fifo.inr")  # named as what it is, never opened (a read would block)
    with pytest.raises(InputError, match=r"fifo\.inr: is a named pipe \(FIFO\), not an INR store file"):
        _cli([str(root), "--store", str(tmp_path / "fifo.inr"), "--out", str(tmp_path / "o")])
    with pytest.raises(InputError, match="no split 'val'"):
        _cli([str(root), "--split", "val", "--out", str(tmp_path / "o")])
    assert not (tmp_path / "o").exists()


def test_cli_jpeg_only_run(prepared, tmp_path, capsys):
    root, _ = prepared
    assert _cli([str(root), "--jpeg-qualities", "20", "80", "--limit", "2", "--out", str(tmp_path / "o")]) == 0
    s = pd.read_csv(tmp_path / "o" / "summary.csv")
    assert list(s.quality) == [20, 80] and (s.n_images == 2).all()
    assert "JPEG quality sweep" in capsys.readouterr().out


def test_cli_inr_bytes_reaches_the_config(prepared, tmp_path):
    import json

    root, _ = prepared
    out = tmp_path / "o"
    assert _cli([str(root), "--jpeg-qualities", "50", "--limit", "1", "--inr-bytes", "payload", "--out", str(out)]) == 0
    assert json.loads((out / "config.json").read_text())["config"]["inr_bytes"] == "payload"


def test_crossover_on_the_inr_frontier():
    from bench.compare.core import COLUMNS
    from bench.compare.table import crossovers, inr_frontier, summarize

    rows = [dict(method="jpeg-sweep", variant="", match="", quality=q, file_bytes=b, header_free_bytes=b - 50, psnr=p)
            for q, b, p in ((10, 100.0, 25.0), (90, 1000.0, 40.0))]
    rows += [dict(method="inr", variant=v, match="", file_bytes=b, psnr=p)
             for v, b, p in (("a", 100.0, 30.0), ("bad", 300.0, 20.0), ("b", 1000.0, 32.0))]
    pi = pd.DataFrame([{**dict.fromkeys([*COLUMNS, "bpp", "bpp_header_free", "pct_raw"], np.nan), "image": 0,
                        "codec": "", "status": "ok", **r} for r in rows])
    s = summarize(pi)
    assert list(inr_frontier(s)["variant"]) == ["a", "b"]  # "bad" is dominated by "a"
    lines = crossovers(s, pixels=100, per_image=pi)
    # diff(log b) goes +5 dB at 100 bytes to -8 dB at 1000 bytes: zero at t = 5/13 in log10 bytes
    expected = 10 ** (2 + 5 / 13)
    cross = [ln for ln in lines if ln.startswith("crossing")]
    assert len(cross) == 1 and "INR ahead of JPEG below" in cross[0]
    assert f"~{expected * 8 / 100:.2f} bpp" in cross[0] and f"~{expected:.0f} bytes" in cross[0]
    # one image: every line is a point reading, never a result
    assert all("not a result" in ln for ln in lines) and not any("ahead:" in ln or "behind:" in ln for ln in lines)


def test_summary_md_places_inr_on_the_curve_with_the_paired_interval(result):
    """audit #8: the curve lines of a real run carry the per-image paired interval (t below 30 images)."""
    res, _ = result
    md = (res.out / "summary.md").read_text()
    section = [ln for ln in md[md.index("Where INR stands"):].splitlines() if ln.startswith("- inr-8bit ")]
    compared = [ln for ln in section if " dB vs JPEG " in ln]
    assert compared and all("INR − JPEG" in ln for ln in compared)
    assert compared and all(f"(t interval, {N} images" in ln for ln in compared), compared
    assert all(" dB [" in ln or "no difference detected [" in ln for ln in compared)


@pytest.mark.parametrize("args, flag, message", [
    (["--weight-images", "0"], "--weight-images", "must be >= 1, got 0"),
    (["--weight-images", "x"], "--weight-images", "expected an integer"),
    (["--window", "-1"], "--window", "must be >= 0, got -1"),
    (["--limit", "0"], "--limit", "must be >= 1, got 0"),
    (["--jpeg-qualities", "50", "0"], "--jpeg-qualities", "must be in 1..100, got 0"),
    (["--jpeg-qualities", "101"], "--jpeg-qualities", "must be in 1..100, got 101"),
    (["--codecs", "jpeg,nope"], "--codecs", "unknown codec 'nope'"),
    (["--codecs", ","], "--codecs", "needs at least one codec"),
    (["--reference", "nope"], "--reference", "unknown reference 'nope'"),
])
def test_bad_options_name_the_flag_typed(prepared, tmp_path, capsys, args, flag, message):
    """audit #12: a bad option's error names the flag the user typed, never an internal name
    (``weight_images``) nor an option they did not pass (``batch``): one line, exit 2, nothing written."""
    from bench.cli import main

    root, _ = prepared
    assert main(["compare", str(root), *args, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("inrbench: error:"), err
    assert flag in err[0] and message in err[0], err[0]
    for internal in ("weight_images", "batch", "qualities must", "inr_bytes", " window must"):
        assert internal not in err[0].replace(flag, ""), err[0]
    assert not (tmp_path / "o").exists()


def test_library_config_errors_name_the_cli_flags():
    for kw, flag in ((dict(weight_images=0), "--weight-images"), (dict(window=-1), "--window"),
                     (dict(match="x"), "--match"), (dict(subsampling="x"), "--subsampling"),
                     (dict(inr_bytes="x"), "--inr-bytes"), (dict(codecs=("x",)), "--codecs"),
                     (dict(reference="x"), "--reference")):
        with pytest.raises(ValueError, match=flag):
            CompareConfig(**kw)
    with pytest.raises(ValueError, match=r"^batch \(images per INR forward\) must be >= 1") as e:
        CompareConfig(batch=0)  # no CLI option: named as the library's, alone
    assert "weight" not in str(e.value)


def test_inrbench_compare_bad_input_exits_2_with_one_line(tmp_path, capsys):
    from bench.cli import main

    assert main(["compare", str(tmp_path / "missing"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("inrbench: error:") and "missing" in err[0]
