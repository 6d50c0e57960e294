"""Hostile dataset sources through the real CLI: paths that escape the root, symlink loops,
pixel bombs, unreadable folders and odd file names.

Each refused case must exit 2 with exactly one line on stderr (``inrbench: error: ...``)
naming the offending file, write no output, and leave every file under ``tmp_path``
byte-identical. Each accepted case exits 0 and the check on its output passes.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import snapshot
from fixtures_datasets import png_claiming, write_flowers102, write_imagefolder, write_miniimagenet
from PIL import Image

from bench.datasets.prepared import read_source_ids

MINE = {"prepare": "bench.commands.prepare"}


def _png(path: Path) -> Path:
    Image.fromarray(np.full((12, 12, 3), 99, np.uint8)).save(path)
    return path


def _mini_row(src: Path, row: str) -> Path:
    """mini-ImageNet tree whose train.csv ends with ``row``; returns train.csv."""
    write_miniimagenet(src, per_class=2)
    with open(src / "train.csv", "a") as f:
        f.write(row + "\n")
    return src / "train.csv"


def _deny_scandir(monkeypatch, folder: Path) -> None:
    """``os.scandir(folder)`` raises EACCES, as on a chmod 000 folder (tests run as root)."""
    real, denied = os.scandir, os.fspath(folder.resolve())

    def scandir(path="."):
        if not isinstance(path, int) and os.fspath(path) == denied:  # shutil.rmtree passes fds
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)


# Builders: (src, tmp_path, monkeypatch) -> (source, extra argv, file the message must name).
def csv_dotdot(src, tmp, mp):
    _png(tmp / "x.png")
    return "mini-imagenet", [], f"{_mini_row(src, '../../x.png,n01532829')}: row 6"


def csv_absolute(src, tmp, mp):
    p = _png(tmp / "abs.png")
    return "mini-imagenet", [], f"{_mini_row(src, f'{p},n01532829')}: row 6"


def csv_etc_passwd(src, tmp, mp):
    return "mini-imagenet", [], f"{_mini_row(src, '/etc/passwd,n01532829')}: row 6"


def csv_nul_byte(src, tmp, mp):
    return "mini-imagenet", [], f"{_mini_row(src, 'a' + chr(0) + 'b.png,n01532829')}: row 6"


def symlink_file_escape(src, tmp, mp):
    write_imagefolder(src, per_class=3)
    (src / "cat" / "evil.png").symlink_to(_png(tmp / "outside.png"))
    return "imagefolder", [], src / "cat" / "evil.png"


def symlink_class_loop(src, tmp, mp):
    write_imagefolder(src, per_class=3)
    (src / "loop").symlink_to(src, target_is_directory=True)
    return "imagefolder", [], src / "loop"


def symlink_class_duplicate(src, tmp, mp):
    write_imagefolder(src, per_class=3)
    (src / "zebra").symlink_to(src / "cat", target_is_directory=True)
    return "imagefolder", [], src / "zebra" / "000.png"


def flowers_symlink_escape(src, tmp, mp):
    write_flowers102(src, num_classes=2, per_class=4)
    img = src / "jpg" / "image_00001.jpg"
    img.rename(tmp / "moved.jpg")
    img.symlink_to(tmp / "moved.jpg")
    return "flowers102", [], img


def png16_over_max_pixels(src, tmp, mp):
    write_imagefolder(src, per_class=3)
    Image.fromarray(np.zeros((10000, 10000), np.uint16)).save(src / "cat" / "huge.png")  # ~200 KB, I;16
    return "imagefolder", [], src / "cat" / "huge.png"


def unreadable_root(src, tmp, mp):
    write_imagefolder(src, per_class=3)
    _deny_scandir(mp, src)
    return "imagefolder", [], src


def unreadable_class_folder(src, tmp, mp):
    write_imagefolder(src, per_class=3)
    _deny_scandir(mp, src / "dog")
    return "imagefolder", [], src / "dog"


def dangling_symlink(src, tmp, mp):
    write_imagefolder(src, per_class=3)
    (src / "cat" / "x.jpg").symlink_to(src / "cat" / "gone.jpg")
    return "imagefolder", [], src / "cat" / "x.jpg"


def folder_named_jpg(src, tmp, mp):
    write_imagefolder(src, per_class=3)
    (src / "cat" / "dir.jpg").mkdir()
    return "imagefolder", [], src / "cat" / "dir.jpg"


def _float_tiff(path: Path, value: float, corner: float | None = 0.0) -> Path:
    """A 12x12 float32 (PIL mode F) TIFF of ``value`` everywhere but its first pixel, ``corner``."""
    a = np.full((12, 12), value, np.float32)
    a[0, 0] = value if corner is None else corner
    Image.fromarray(a, "F").save(path)
    return path


def float_tiff_out_of_range(src, tmp, mp):
    write_imagefolder(src, per_class=3)
    return "imagefolder", [], _float_tiff(src / "cat" / "f.tif", 200.0)


def float_tiff_nan(src, tmp, mp):
    write_imagefolder(src, per_class=3)
    return "imagefolder", [], _float_tiff(src / "cat" / "f.tif", float("nan"))


def class_of_unreadable_files(src, tmp, mp):
    """``--on-error skip`` and a class whose only file is unreadable: it was kept, empty (every label 1)."""
    write_imagefolder(src, classes=("dog",), per_class=3)
    (src / "cat").mkdir()
    (src / "cat" / "x.jpg").write_bytes(b"garbage\n")
    return "imagefolder", ["--on-error", "skip"], src / "cat" / "x.jpg"


REFUSED = [
    ("csv-dotdot", csv_dotdot, "path '../../x.png' resolves outside the dataset root"),
    ("csv-absolute", csv_absolute, "resolves outside the dataset root"),
    ("csv-etc-passwd", csv_etc_passwd, "path '/etc/passwd' resolves outside the dataset root"),
    ("csv-nul-byte", csv_nul_byte, "path 'a\\x00b.png' is not a usable path (embedded null byte)"),
    ("symlink-file-escape", symlink_file_escape, "outside the dataset root"),
    ("symlink-class-loop", symlink_class_loop, "which holds this folder (a loop)"),
    ("symlink-class-duplicate", symlink_class_duplicate, "the tree would be read twice"),
    ("flowers-symlink-escape", flowers_symlink_escape, "outside the dataset root"),
    ("png16-10000x10000", png16_over_max_pixels, "10000x10000 (100,000,000 pixels), over the --max-pixels limit 50,000,000"),
    ("unreadable-root", unreadable_root, "cannot read (Permission denied)"),
    ("unreadable-class-folder", unreadable_class_folder, "cannot read (Permission denied)"),
    # named like an image but not a file: an unreadable image (without --on-error skip), not dropped unseen
    ("dangling-symlink", dangling_symlink, "is a dangling symlink (to "),
    ("folder-named-jpg", folder_named_jpg, "is a folder, not an image file"),
    # issue 34.7: floats are read as 0..1 (anything else was divided by 255 or 65535: a black image, silently)
    ("float-tiff-0-200", float_tiff_out_of_range, "a float image with values 0..200: only floats in 0..1 are read"),
    ("float-tiff-nan", float_tiff_nan, "a float image with NaN or infinite values"),
    # issue 34.6: refused, and the work folder holding the decoded images removed (a rerun refuses it again)
    ("class-of-unreadable-files", class_of_unreadable_files,
     "class 'cat' has no readable image: all its files were skipped as unreadable (--on-error skip skips "
     "files, not classes)"),
]



@pytest.mark.parametrize("build,expect", [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_refused(build, expect, run, tmp_path, monkeypatch):
    source, extra, named = build(tmp_path / "src", tmp_path, monkeypatch)
    before = snapshot(tmp_path)
    rc, out, err = run("prepare", source, "--root", tmp_path / "src", "--out", tmp_path / "out", "--size", 8, *extra)
    assert rc == 2, err
    assert err.count("\n") == 1 and err.startswith("inrbench: error: "), err
    assert "Traceback" not in err and expect in err and str(named) in err, err
    assert not (tmp_path / "out").exists()
    assert snapshot(tmp_path) == before


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a chmod 000 folder; unreadable-root covers it by monkeypatch")
def test_unreadable_root_chmod(run, tmp_path):
    write_imagefolder(tmp_path / "src", per_class=3)
    (tmp_path / "src").chmod(0)
    try:
        rc, _, err = run("prepare", "imagefolder", "--root", tmp_path / "src", "--out", tmp_path / "out", "--size", 8)
    finally:
        (tmp_path / "src").chmod(0o755)
    assert rc == 2 and err.count("\n") == 1 and "cannot read (Permission denied)" in err, err


# Accepted: (src) -> (extra argv, check(out folder, manifest)).
def bomb_skipped(src):
    write_imagefolder(src, per_class=3)
    png_claiming(src / "cat" / "bomb.png", 20000, 20000)  # 400 MP: past PIL's own bomb error limit

    def check(out, m):
        assert [s["file"] for s in m["skipped"]] == [str(src / "cat" / "bomb.png")]
        assert m["skipped"][0]["error"] == "image is 20000x20000 (400,000,000 pixels), over the --max-pixels limit 50,000,000"

    return ["--on-error", "skip"], check


def non_utf8_name(src):
    write_imagefolder(src, per_class=3)
    with open(os.path.join(os.fsencode(src / "cat"), b"\xff\xfe.png"), "wb") as f:
        f.write(_png(src / "tmp.png").read_bytes())
    (src / "tmp.png").unlink()

    def check(out, m):
        ids = [i for s in ("train", "val") for i in read_source_ids(out / s)]
        assert os.fsencode(src / "cat") + b"/\xff\xfe.png" in {os.fsencode(src / i) for i in ids}

    return [], check


def newline_name(src):
    write_imagefolder(src, per_class=3)
    _png(src / "cat" / "a\nb.png")

    def check(out, m):
        for s in ("train", "val"):
            ids = read_source_ids(out / s)
            assert len(ids) == m["splits"][s]["count"] == len(np.load(out / s / "labels.npy"))
        assert "cat/a\nb.png" in read_source_ids(out / "train") + read_source_ids(out / "val")
        assert json.loads((out / "train" / "source_ids.json").read_text()) == read_source_ids(out / "train")

    return [], check


def not_files_skipped(src):
    """--on-error skip lists what it skips, a dangling symlink and a folder x.jpg included; the
    folder's own images are read."""
    write_imagefolder(src, per_class=3)
    (src / "cat" / "x.jpg").symlink_to(src / "cat" / "gone.jpg")
    (src / "dog" / "dir.jpg").mkdir()
    _png(src / "dog" / "dir.jpg" / "inner.png")

    def check(out, m):
        assert {s["file"]: s["error"] for s in m["skipped"]} == {
            str(src / "cat" / "x.jpg"): f"is a dangling symlink (to {src / 'cat' / 'gone.jpg'}), not an image file",
            str(src / "dog" / "dir.jpg"): "is a folder, not an image file"}
        ids = [i for s in ("train", "val") for i in read_source_ids(out / s)]
        assert "dog/dir.jpg/inner.png" in ids and len(ids) == m["splits"]["train"]["count"] + m["splits"]["val"]["count"]

    return ["--on-error", "skip"], check


def float_tiff_0_1(src):
    """A float32 TIFF of 0.5 (values in 0..1) is read as 128, not as a black image (it was 0 or 1)."""
    write_imagefolder(src, per_class=3)
    _float_tiff(src / "cat" / "f.tif", 0.5, corner=None)

    def check(out, m):
        split = next(s for s in ("train", "val") if "cat/f.tif" in read_source_ids(out / s))
        px = np.load(out / split / "pixels.npy")[read_source_ids(out / split).index("cat/f.tif")]
        assert px.shape == (8, 8, 3) and (px == 128).all()

    return [], check


ACCEPTED = [
    ("float-tiff-0-1", float_tiff_0_1),
    ("bomb-png-skipped", bomb_skipped),
    ("non-utf8-file-name", non_utf8_name),
    ("newline-file-name", newline_name),
    ("not-files-skipped-and-listed", not_files_skipped),
]


@pytest.mark.parametrize("build", [c[1] for c in ACCEPTED], ids=[c[0] for c in ACCEPTED])
def test_accepted(build, run, tmp_path):
    extra, check = build(tmp_path / "src")
    before = snapshot(tmp_path)
    rc, out, err = run("prepare", "imagefolder", "--root", tmp_path / "src", "--out", tmp_path / "out", "--size", 8, *extra)
    assert rc == 0 and err == "", err
    check(tmp_path / "out", json.loads((tmp_path / "out" / "manifest.json").read_text()))
    after = snapshot(tmp_path)
    assert {k: v for k, v in after.items() if not k.startswith("out" + os.sep)} == before


def test_max_pixels_option_is_validated(run, tmp_path):
    write_imagefolder(tmp_path / "src", per_class=3)
    rc, _, err = run("prepare", "imagefolder", "--root", tmp_path / "src", "--out", tmp_path / "out", "--max-pixels", 0)
    assert rc == 2 and err == "inrbench: error: --max-pixels must be >= 1, got 0\n"


def test_pil_bomb_error_is_an_input_error(tmp_path):
    """Outside ``split_from_files`` PIL's own guard stays on; its error still becomes one InputError line."""
    from bench.datasets.decode import read_image
    from bench.errors import InputError

    png_claiming(tmp_path / "bomb.png", 20000, 20000)
    with pytest.raises(InputError, match=r"bomb\.png: refused as a decompression bomb \(Image size \(400000000 pixels\)"):
        read_image(tmp_path / "bomb.png", 8, "resize", max_pixels=10**12)


def test_decode_budget_holds_big_images_one_at_a_time():
    """Threads asking for more than half the budget never overlap; an oversize ask runs alone."""
    import threading
    import time

    from bench.datasets.decode import ByteBudget

    budget, lock, held, peak = ByteBudget(100), threading.Lock(), [0], [0]

    def work(n):
        with budget.hold(n):
            with lock:
                held[0] += 1
                peak[0] = max(peak[0], held[0])
            time.sleep(0.02)
            with lock:
                held[0] -= 1

    threads = [threading.Thread(target=work, args=(n,)) for n in (60, 60, 250, 60)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=5)
    assert not any(t.is_alive() for t in threads) and peak[0] == 1 and budget.free == 100
