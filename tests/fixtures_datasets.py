"""Writers for tiny datasets in each source's exact on-disk format (used by the dataset tests).

Every image is a ``bench.datasets.synthetic`` image of its class, so a test can check that
labels still match pixels after ``prepare`` with ``synthetic.recover_labels``.
"""

from __future__ import annotations

import csv
import pickle
from pathlib import Path

import numpy as np
from PIL import Image

from bench.datasets.synthetic import generate

CIFAR_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def class_images(labels, h: int, w: int, seed: int = 0) -> np.ndarray:
    """uint8 ``[N, h, w, 3]`` synthetic images of ``labels`` (colour = class)."""
    labels = np.asarray(labels, dtype=np.int64)
    return generate(labels, max(h, w), np.random.default_rng(seed), 27)[:, :h, :w]


def write_cifar10(folder: Path, per_batch: int = 6, n_test: int = 8, seed: int = 0, protocol: int = 2) -> dict:
    """Official python-version batches (bytes keys, as CIFAR's Python 2 pickles load with encoding='bytes').

    Returns {"train": (images [N,32,32,3], labels [N]), "test": (...)} in file order.
    """
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    out = {"train": ([], []), "test": ([], [])}
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for b, name in enumerate(names):
        n = n_test if name == "test_batch" else per_batch
        labels = rng.integers(0, 10, n)
        imgs = class_images(labels, 32, 32, seed + b)
        data = imgs.transpose(0, 3, 1, 2).reshape(n, 3072)  # R plane, G plane, B plane
        d = {b"batch_label": name.encode(), b"labels": [int(x) for x in labels], b"data": data,
             b"filenames": [f"img_{b}_{i}.png".encode() for i in range(n)]}
        with open(folder / name, "wb") as f:
            pickle.dump(d, f, protocol=protocol)
        split = "test" if name == "test_batch" else "train"
        out[split][0].append(imgs)
        out[split][1].append(labels)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({b"label_names": [n.encode() for n in CIFAR_NAMES], b"num_cases_per_batch": per_batch,
                     b"num_vis": 3072}, f, protocol=2)
    return {k: (np.concatenate(v[0]), np.concatenate(v[1]).astype(np.int64)) for k, v in out.items()}


def write_flowers102(folder: Path, num_classes: int = 4, per_class: int = 6, seed: int = 0) -> dict:
    """``jpg/image_NNNNN.jpg`` + ``imagelabels.mat`` + ``setid.mat``; returns labels (1-based) and setid."""
    import scipy.io

    jpg = folder / "jpg"
    jpg.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.repeat(np.arange(1, num_classes + 1), per_class))
    imgs = class_images(labels - 1, 48, 64, seed)  # non-square, like the real photos
    for i, im in enumerate(imgs, start=1):
        Image.fromarray(im).save(jpg / f"image_{i:05d}.jpg", quality=95)
    ids = rng.permutation(np.arange(1, labels.size + 1))
    a, b = labels.size // 4, labels.size // 2
    setid = {"trnid": np.sort(ids[:a]), "valid": np.sort(ids[a:b]), "tstid": np.sort(ids[b:])}
    scipy.io.savemat(folder / "imagelabels.mat", {"labels": labels[None].astype(np.float64)})
    scipy.io.savemat(folder / "setid.mat", {k: v[None].astype(np.float64) for k, v in setid.items()})
    return {"labels": labels, "setid": setid}


def write_imagefolder(folder: Path, classes=("cat", "dog", "eel"), per_class: int = 5, split: bool = False,
                      seed: int = 0) -> dict:
    """``CLASS/*.jpg|png`` (or ``train/CLASS`` + ``val/CLASS`` with ``split``); mixed formats and modes."""
    rng = np.random.default_rng(seed)
    counts = {}
    parts = {"train": per_class, "val": max(1, per_class // 2)} if split else {"": per_class}
    for part, n in parts.items():
        for c, name in enumerate(classes):
            d = folder / part / name
            d.mkdir(parents=True, exist_ok=True)
            h, w = int(rng.integers(30, 60)), int(rng.integers(30, 60))
            for i, im in enumerate(class_images([c] * n, h, w, seed + 7 * c + len(part))):
                if i % 3 == 0:
                    Image.fromarray(im).save(d / f"{i:03d}.png")
                elif i % 3 == 1:
                    Image.fromarray(im).convert("RGBA").save(d / f"{i:03d}.PNG")
                else:
                    Image.fromarray(im).save(d / f"{i:03d}.jpeg", quality=95)
            (d / ".DS_Store").write_bytes(b"junk")  # hidden files are ignored
            counts[(part, name)] = n
    return counts


def write_miniimagenet(folder: Path, wnids=("n01532829", "n01558993", "n01704323", "n01749939"),
                       per_class: int = 9, seed: int = 0) -> dict:
    """``images/`` + ``train.csv``/``val.csv``/``test.csv`` splitting *classes* like the official csvs."""
    images = folder / "images"
    images.mkdir(parents=True, exist_ok=True)
    csvs = {"train.csv": wnids[:2], "val.csv": wnids[2:3], "test.csv": wnids[3:]}
    for fname, ws in csvs.items():
        with open(folder / fname, "w", newline="") as f:
            wr = csv.writer(f)
            wr.writerow(["filename", "label"])
            for w in ws:
                c = sorted(wnids).index(w)
                for i, im in enumerate(class_images([c] * per_class, 40, 50, seed + c)):
                    name = f"{w}{i + 1:08d}.jpg"
                    Image.fromarray(im).save(images / name, quality=95)
                    wr.writerow([name, w])
    return {"csvs": csvs}


def truncate(path: Path, keep: float = 0.5) -> None:
    """Cut a file to ``keep`` of its bytes (a truncated download)."""
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def png_claiming(path: Path, width: int, height: int, mode: str = "L") -> None:
    """A tiny PNG whose header claims ``width`` x ``height`` (a decompression bomb's header, no pixels)."""
    import struct
    import zlib

    Image.new(mode, (1, 1)).save(path)
    data = bytearray(path.read_bytes())
    # The IHDR chunk follows the 8-byte signature: length, b"IHDR", width, height, ..., crc.
    assert data[12:16] == b"IHDR"
    data[16:24] = struct.pack(">II", width, height)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    path.write_bytes(bytes(data))


def write_tiny_prepared(out: Path, n_train: int, n_test: int, num_classes: int = 4, base: int = 30,
                        step: int = 50, seed: int = 0) -> Path:
    """A prepared 8x8 dataset whose label is the flat grey level (``base + step * label``): harness tests."""
    from bench.datasets.prepared import SplitData, write_prepared

    rng = np.random.default_rng(seed)
    splits = {}
    for name, n in (("train", n_train), ("test", n_test)):
        labels = rng.integers(0, num_classes, n)
        images = np.full((n, 8, 8, 3), base, np.uint8) + (labels * step).astype(np.uint8)[:, None, None, None]
        splits[name] = SplitData(images=images, labels=labels.astype(np.int64))
    classes = [chr(ord("a") + k) for k in range(num_classes)]
    return write_prepared(out, splits, {"source": "test", "classes": classes, "resize_policy": "none"})


def photos32_train(folder: Path, n: int = 8) -> tuple[Path, np.ndarray]:
    """The built-in ``photos`` set prepared at 32x32 (2 crops per photograph, JPEG 90) under ``folder``, and the
    first ``n`` train images, uint8 ``[n, 32, 32, 3]`` (the fit tests' real photographs)."""
    from bench.datasets.prepare import prepare_dataset
    from bench.datasets.prepared import open_prepared

    out = prepare_dataset("photos", folder / "photos32", size=32, per_class=2, jpeg_quality=90)
    return out, np.array(open_prepared(out).split("train").images[:n])
