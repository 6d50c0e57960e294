"""A multi-picture JPEG (MPO: a camera's, written here by PIL's own MPO writer) in a prepared split: every
JPEG adapter refuses it, with the same one line naming the file (``pipelines.jpeg_header.multi_picture``).

PIL names such a file ``"MPO"`` and decodes its first image, as TorchCodec and DALI's CPU decoder do, but
``prepare`` writes single-image JPEGs: an MPO in a split is a replaced file, whose appended images would be
read every epoch and counted in the split's bytes per image without being decoded. Before, ``torch-jpeg``
listed ``"MPO"`` among the formats it accepts while the shared walk refused the file as "damaged JPEG: N
bytes after its end-of-image marker"."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

import pipelines
from bench.datasets.prepared import open_prepared
from bench.errors import InputError
from pipelines import Augment, PipelineConfig
from pipelines import jpeg_header as jh
from tests.fixtures_datasets import write_tiny_prepared


def _mpo(first: np.ndarray, *more: np.ndarray) -> bytes:
    """An MPO of the images ``first``, ``more`` (uint8 ``[H, W, 3]``), as PIL writes it (quality 90)."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(first).save(buf, format="MPO", save_all=True, quality=90,
                                append_images=[Image.fromarray(m) for m in more])
    return buf.getvalue()


def _mpf_at(raw: bytes) -> int:
    """The offset of the file's APP2 MPF segment."""
    at = raw.index(b"\xff\xe2")
    assert raw[at + 4:at + 8] == b"MPF\0"
    return at


def _astronaut(side: int, top: int) -> np.ndarray:
    from skimage import data

    return data.astronaut()[top:top + side, 150:150 + side].copy()


def test_the_walk_refuses_an_mpo_and_says_so():
    """The first image alone passes; the MPO (the same first image, a second one appended after its end-of-image
    marker) is refused as a multi-picture JPEG, not as a damaged one. PIL sees an MPO of 2 frames and decodes the
    first: the pixels of the first image alone."""
    from PIL import Image

    a, b = _astronaut(32, 100), _astronaut(32, 300)
    raw = _mpo(a, b)
    with Image.open(io.BytesIO(raw)) as im:
        assert (im.format, im.n_frames, im.size) == ("MPO", 2, (32, 32))
        first = np.asarray(im.convert("RGB"))
    at, eoi = _mpf_at(raw), raw.index(b"\xff\xd9")
    assert at == 20 and raw[eoi + 2:eoi + 4] == b"\xff\xd8"  # after SOI and JFIF's APP0; a second JPEG after the EOI
    message = f"a multi-picture JPEG (MPO: MPF segment at byte {at:,}); a prepared split holds single-image JPEGs"
    assert jh.layout_problem(raw) == message
    with pytest.raises(InputError) as e:
        jh.check_jpeg_bytes(raw, (32, 32), Path("x.jpg"))
    assert str(e.value) == f"x.jpg: {message}"
    # the first image as a plain JPEG: no MPF segment, nothing after its end-of-image marker
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, format="JPEG", quality=90)
    assert jh.layout_problem(buf.getvalue()) is None
    with Image.open(buf) as im:
        assert im.format == "JPEG" and np.array_equal(np.asarray(im.convert("RGB")), first)


def test_an_mpo_cut_after_its_first_image_is_refused_too():
    """Its MPF segment still lists 2 images, none follows the first's end-of-image marker: the markers walk to the
    end, and PIL still calls it an MPO (of 2 frames, the second unreadable). The walk refuses it as an MPO all the
    same (the segment is the rule: no adapter reads it). Before, every adapter trained on it."""
    from PIL import Image

    two = _mpo(_astronaut(32, 100), _astronaut(32, 300))
    raw = two[:two.index(b"\xff\xd9") + 2]
    with Image.open(io.BytesIO(raw)) as im:
        assert (im.format, im.n_frames) == ("MPO", 2)
        im.convert("RGB")  # the first image decodes
    assert jh.layout_problem(raw) == jh.multi_picture(20)


ADAPTERS = ["torch-jpeg", "torch-jpeg-worker", "torch-nvjpeg", "dali"]


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_every_jpeg_adapter_refuses_an_mpo_in_one_line_naming_it(adapter, tmp_path):
    """A prepared 8x8 set whose train file 000005.jpg is replaced by an MPO of 8x8 images, its first image the
    file's own pixels: each adapter stops with the same line naming it (``dali`` and ``torch-nvjpeg`` at build,
    ``torch-jpeg`` when the epoch reaches it, from a worker or not). Before, ``torch-jpeg`` took PIL's ``"MPO"`` as
    a JPEG and every adapter called the file damaged."""
    from PIL import Image

    if adapter == "dali":
        pytest.importorskip("nvidia.dali", reason="DALI is not installed")
    ds = open_prepared(write_tiny_prepared(tmp_path / "d", 8, 2))
    f = ds.split("train").jpeg_paths[5]
    with Image.open(f) as im:
        own = np.asarray(im.convert("RGB"))
    raw = _mpo(own, 255 - own)
    f.write_bytes(raw)
    with Image.open(f) as im:
        assert (im.format, im.n_frames) == ("MPO", 2)
    name, workers = ("torch-jpeg", 1) if adapter == "torch-jpeg-worker" else (adapter, 0 if adapter != "dali" else 1)
    cfg = PipelineConfig(workers=workers, batch_size=4, shuffle=False, augment=Augment(crop="center"))
    with pytest.raises(InputError) as e:
        p = pipelines.create(name, ds, cfg)
        try:
            for _ in p:
                pass
        finally:
            p.close()
    assert str(e.value) == f"{f}: {jh.multi_picture(_mpf_at(raw))}"
    assert e.value.path == f
