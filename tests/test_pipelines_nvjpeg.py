"""``torch-nvjpeg`` beyond the registry-parametrized contract (``tests/test_pipelines.py``):
its decode agrees with ``torch-jpeg``'s (PIL), its augmentation is ``raw``'s, resident bytes are the JPEG files, and the build-time header check refuses bad files by name.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

import pipelines
from bench.datasets.prepared import PreparedDataset, open_prepared
from bench.errors import InputError
from pipelines import Augment, PipelineConfig, Unavailable
from pipelines.torch_nvjpeg import jpeg_size

# JPEG decoders may differ in IDCT and chroma upsampling: libjpeg-turbo vs libjpeg-turbo (PIL and
# torchvision on the CPU) agree exactly; nvJPEG's GPU IDCT and upsampling differ by a few levels.
MAX_ABS, MEAN_ABS = 8.0, 1.0  # in 0..255 levels


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> PreparedDataset:
    from bench.datasets.prepare import prepare_dataset

    out = tmp_path_factory.mktemp("nvjpeg") / "photos32"
    return open_prepared(prepare_dataset("photos", out, size=32, limit=48, jpeg_quality=90))


def _epoch(name: str, data: PreparedDataset, device: str = "cpu", **kw) -> tuple[torch.Tensor, torch.Tensor]:
    aug = kw.pop("augment", Augment(crop="center", flip=False))
    cfg = PipelineConfig(batch_size=16, augment=aug, device=device, **{"workers": 0, "shuffle": False, **kw})
    try:
        p = pipelines.create(name, data, cfg)
    except Unavailable as e:
        pytest.skip(f"{name} unavailable here: {e}")
    batches = list(p)
    p.close()
    mean = torch.tensor(aug.mean, dtype=torch.float64).view(1, 3, 1, 1)
    std = torch.tensor(aug.std, dtype=torch.float64).view(1, 3, 1, 1)
    images = torch.cat([b.images.cpu() for b in batches]).double()
    return (images * std + mean) * 255.0, torch.cat([b.labels.cpu() for b in batches])


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_decode_matches_torch_jpeg_within_decoder_tolerance(device, photos):
    """Centre crop, no flip, no shuffle: torch-nvjpeg (torchvision on ``device``) vs torch-jpeg (PIL)."""
    ours, labels = _epoch("torch-nvjpeg", photos, device)
    ref, ref_labels = _epoch("torch-jpeg", photos)
    assert torch.equal(labels, ref_labels)
    diff = (ours - ref).abs()
    assert diff.max() <= MAX_ABS and diff.mean() <= MEAN_ABS, (
        f"{device}: max {diff.max():.2f}, mean {diff.mean():.3f} levels from PIL's decode"
    )
    # and both are the prepared pixels up to JPEG's loss (quality 90)
    px = torch.from_numpy(np.array(photos.split("train").images)).permute(0, 3, 1, 2).double()
    assert (ours - px).abs().mean() < 8.0


def test_augmentation_is_raws(photos):
    """Same seed, same crops: torch-nvjpeg and raw differ only by the decode (JPEG's loss)."""
    aug = Augment()
    ours, labels = _epoch("torch-nvjpeg", photos, augment=aug, shuffle=True, seed=5)
    ref, ref_labels = _epoch("raw", photos, augment=aug, shuffle=True, seed=5)
    assert torch.equal(labels, ref_labels)
    assert (ours - ref).abs().mean() < 8.0  # the crops agree; a different crop would be far off


def test_resident_bytes_are_the_jpeg_files(photos):
    split = photos.split("train")
    p = pipelines.create("torch-nvjpeg", photos, PipelineConfig(workers=0))
    held = p.resident_bytes()
    p.close()
    assert held["host"] == sum(f.stat().st_size for f in split.jpeg_paths)
    assert held["device"] == len(split) * 8  # int64 labels


def test_jpeg_size_reads_frame_headers():
    from PIL import Image

    im = Image.new("RGB", (37, 21), (10, 200, 30))
    for kw in ({}, {"progressive": True}, {"quality": 50, "subsampling": 0}):
        buf = io.BytesIO()
        im.save(buf, "JPEG", **kw)
        assert jpeg_size(buf.getvalue()) == (21, 37), kw
    png = io.BytesIO()
    im.save(png, "PNG")
    assert jpeg_size(png.getvalue()) is None
    assert jpeg_size(b"") is None and jpeg_size(b"\xff\xd8") is None and jpeg_size(b"\xff\xd8\xff\xda\x00\x02") is None


def _copy(photos: PreparedDataset, tmp_path):
    import shutil

    dst = tmp_path / "copy"
    shutil.copytree(photos.root, dst)
    return dst


@pytest.mark.parametrize(("damage", "message"), [
    ("resize", r"000002\.jpg: JPEG is 40x40, the prepared split is 32x32"),
    ("truncate", r"000002\.jpg: truncated JPEG"),
    ("header", r"000002\.jpg: no JPEG frame header"),
    ("scan", r"000002\.jpg: cannot decode JPEG \(torchvision: "),
])
def test_bad_files_are_refused_naming_the_file(damage, message, photos, tmp_path):
    from PIL import Image

    root = _copy(photos, tmp_path)
    f = root / "train" / "jpeg" / "000002.jpg"
    data = f.read_bytes()
    if damage == "resize":
        Image.new("RGB", (40, 40)).save(f, "JPEG")
    elif damage == "truncate":
        f.write_bytes(data[: len(data) // 2])
    elif damage == "header":
        f.write_bytes(data[:40])
    else:  # a corrupt Huffman table after the frame header: only the decoder notices
        b = bytearray(data)
        i = b.index(b"\xff\xc4")
        b[i + 2: i + 22] = b"\x00" * 20
        f.write_bytes(bytes(b))
    with pytest.raises(InputError, match=message):
        p = pipelines.create("torch-nvjpeg", open_prepared(root), PipelineConfig(workers=0, shuffle=False))
        for _ in p:
            pass
