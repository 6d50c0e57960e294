"""``torch-nvjpeg`` beyond the registry-parametrized contract (``tests/test_pipelines.py``):
its decode agrees with ``torch-jpeg``'s (PIL), bit for bit on the CPU, with either decoder (TorchCodec,
or torchvision.io when TorchCodec cannot be imported: the ``decoder`` fixture); the decoder is
recorded; its augmentation is ``raw``'s, resident bytes are the JPEG files, and the build-time
header check refuses bad files by name. ``gpu``-marked: each decoder's CUDA decode against its CPU
decode of the same bytes, and TorchCodec's host sync before it returns.
"""

from __future__ import annotations

import importlib.metadata as md
import io
import math
import sys
import warnings

import numpy as np
import pytest
import torch

import pipelines
from bench.datasets.prepared import PreparedDataset, open_prepared
from bench.errors import InputError
from pipelines import Augment, PipelineConfig, Unavailable
from pipelines.jpeg_header import jpeg_size
from pipelines.torch_nvjpeg import jpeg_decoder, quiet_torchvision_decode
from tests.test_pipelines import unavailable

# JPEG decoders may differ in IDCT and chroma upsampling: libjpeg-turbo vs libjpeg-turbo (PIL,
# torchvision and TorchCodec on the CPU) agree exactly; nvJPEG's GPU IDCT and upsampling differ by a
# few levels.
MAX_ABS, MEAN_ABS = 8.0, 1.0  # in 0..255 levels
CUDA_MEAN_ABS = 2.0  # nvJPEG vs PIL, mean |difference| in levels (torchvision's own test bounds it so)


def _decoders() -> list:
    """The decoders ``torch-nvjpeg`` can use here; TorchCodec skipped with the reason where it cannot be imported."""
    got = jpeg_decoder()
    tc = pytest.param("torchcodec", marks=() if got.library == "torchcodec" else
                      pytest.mark.skip(reason=got.fallback_reason or "torchcodec not importable"))
    return [tc, "torchvision"]


@pytest.fixture(params=_decoders())
def decoder(request, monkeypatch) -> str:
    """``torch-nvjpeg`` decodes with this library for the test's duration: ``torchvision`` is the
    fallback, reached by making ``from torchcodec.decoders import ...`` fail."""
    if request.param == "torchvision":
        monkeypatch.setitem(sys.modules, "torchcodec.decoders", None)
    assert jpeg_decoder().library == request.param
    return request.param


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
    except Unavailable as e:  # on CUDA a missing library is "not installed", anything else a failure
        unavailable(name, e, device)
    batches = list(p)
    p.close()
    mean = torch.tensor(aug.mean, dtype=torch.float64).view(1, 3, 1, 1)
    std = torch.tensor(aug.std, dtype=torch.float64).view(1, 3, 1, 1)
    images = torch.cat([b.images.cpu() for b in batches]).double()
    return (images * std + mean) * 255.0, torch.cat([b.labels.cpu() for b in batches])


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_decode_matches_torch_jpeg_within_decoder_tolerance(device, decoder, photos):
    """Centre crop, no flip, no shuffle: torch-nvjpeg (``decoder`` on ``device``) vs torch-jpeg (PIL)."""
    ours, labels = _epoch("torch-nvjpeg", photos, device)
    ref, ref_labels = _epoch("torch-jpeg", photos)
    assert torch.equal(labels, ref_labels)
    diff = (ours - ref).abs()
    if device == "cpu":
        assert diff.max() <= MAX_ABS and diff.mean() <= MEAN_ABS, (
            f"{device}: max {diff.max():.2f}, mean {diff.mean():.3f} levels from PIL's decode"
        )
    else:  # nvJPEG's IDCT and upsampling: a few pixels may be far off, so the PSNR and the mean are bounded
        psnr, text = _agreement(ours, ref)
        assert psnr >= AGREE_DB and diff.mean() < CUDA_MEAN_ABS, f"{device} vs PIL's decode: {text}"
    # and both are the prepared pixels up to JPEG's loss (quality 90)
    px = torch.from_numpy(np.array(photos.split("train").images)).permute(0, 3, 1, 2).double()
    assert (ours - px).abs().mean() < 8.0


def test_cpu_decode_is_pils_and_torchvisions_bit_for_bit(decoder, photos):
    """The adapter's CPU decode of every prepared JPEG: uint8 ``[N, 3, H, W]``, PIL's pixels and
    ``torchvision.io.decode_jpeg``'s exactly (both libjpeg-turbo)."""
    from PIL import Image

    p = pipelines.create("torch-nvjpeg", photos, PipelineConfig(workers=0))
    got = p._decode_batch(list(range(len(p.paths))))
    tv = torch.stack([quiet_torchvision_decode(t, mode="RGB") for t in p.jpegs])  # the reference call
    p.close()
    pil = torch.stack([torch.from_numpy(np.array(Image.open(f).convert("RGB"))).permute(2, 0, 1) for f in p.paths])
    assert got.dtype == torch.uint8 and got.shape == (len(p.paths), 3, 32, 32)
    assert torch.equal(got, pil), f"{decoder}: max {(got.int() - pil.int()).abs().max()} levels from PIL"
    assert torch.equal(got, tv)


def test_decoder_is_recorded(decoder, photos):
    """``pipe.decoder`` and env.json's ``torch_nvjpeg`` name the library that decoded and its version."""
    import importlib

    from bench import envinfo

    module = importlib.import_module(decoder)
    p = pipelines.create("torch-nvjpeg", photos, PipelineConfig(workers=0))
    info = p.decoder.info()
    p.close()
    function = {"torchcodec": "torchcodec.decoders.decode_jpeg", "torchvision": "torchvision.io.decode_jpeg"}[decoder]
    assert info["library"] == decoder and info["function"] == function
    assert info["version"] == module.__version__ and info["version"].startswith(md.version(decoder))
    if decoder == "torchcodec":
        assert info["fallback_reason"] is None
    else:
        assert info["fallback_reason"].startswith("torchcodec cannot be imported: ")
    assert envinfo.torch_nvjpeg_decoder() == info
    env = envinfo.collect()  # what every run writes to env.json
    assert env["torch_nvjpeg"] == info
    if decoder == "torchcodec":
        assert env["versions"]["torchcodec"] == md.version("torchcodec")


def test_an_epoch_warns_nothing_with_either_decoder(decoder, photos):
    """No warning per batch: TorchCodec raises none, and the torchvision fallback's DeprecationWarning (one per
    call in torchvision 0.29: hundreds per run) is kept quiet; the fallback is recorded in env.json instead."""
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        images, labels = _epoch("torch-nvjpeg", photos)
    assert images.shape == (48, 3, 32, 32) and labels.shape == (48,)
    assert not w, [f"{x.category.__name__}: {str(x.message)[:80]}" for x in w]


def test_unavailable_when_neither_decoder_imports(monkeypatch, photos):
    monkeypatch.setitem(sys.modules, "torchcodec.decoders", None)
    monkeypatch.setitem(sys.modules, "torchvision.io", None)
    with pytest.raises(Unavailable, match=r"torchcodec cannot be imported: .*; torchvision\.io\.decode_jpeg cannot"):
        pipelines.create("torch-nvjpeg", photos, PipelineConfig(workers=0))


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


def test_the_jpeg_files_are_views_of_one_buffer(photos):
    """One host buffer, a view per file holding exactly its bytes: the resident figure is the memory
    held (no per-file allocations, no pinned blocks rounded up to powers of two)."""
    from pipelines.torch_nvjpeg import read_jpegs

    split = photos.split("train")
    views = read_jpegs(split.jpeg_paths[:5], split.image_size)
    base = views[0].untyped_storage().data_ptr()
    assert all(v.untyped_storage().data_ptr() == base and v.is_contiguous() and not v.is_pinned() for v in views)
    assert views[0].untyped_storage().nbytes() == sum(f.stat().st_size for f in split.jpeg_paths[:5])
    assert all(bytes(v.numpy()) == f.read_bytes() for v, f in zip(views, split.jpeg_paths[:5], strict=True))


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
    # the decoder's own message, without its C++ function and source location
    ("scan", r"000002\.jpg: cannot decode JPEG \({decoder}: [A-Z][^/]*\)$"),
], ids=["resize", "truncate", "header", "scan"])
def test_bad_files_are_refused_naming_the_file(damage, message, decoder, photos, tmp_path):
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
    else:  # a corrupt Huffman table (every code-length count 255, its length intact): only the decoder notices
        b = bytearray(data)
        i = b.index(b"\xff\xc4")
        b[i + 5: i + 21] = b"\xff" * 16
        f.write_bytes(bytes(b))
    with pytest.raises(InputError, match=message.format(decoder=decoder)):
        p = pipelines.create("torch-nvjpeg", open_prepared(root), PipelineConfig(workers=0, shuffle=False))
        for _ in p:
            pass


def test_a_device_failure_is_the_runs_error_not_the_datas(photos, monkeypatch):
    """A batch decode that fails while every file of the batch decodes on the CPU (device memory, the
    driver) re-raises the decoder's error: it is not blamed on the data (``InputError``, exit 2)."""
    import dataclasses

    p = pipelines.create("torch-nvjpeg", photos, PipelineConfig(workers=0, batch_size=8, shuffle=False))
    real = p.decoder.decode

    def batch_fails(data, mode="RGB", device=None):
        if isinstance(data, list):  # the adapter's batched call; one file at a time (the CPU check) decodes
            raise RuntimeError("CUDA error: out of memory")
        return real(data, mode=mode)

    p.decoder = dataclasses.replace(p.decoder, decode=batch_fails)
    with pytest.raises(RuntimeError, match="^CUDA error: out of memory$") as e:
        next(iter(p))
    assert not isinstance(e.value, InputError)
    p.close()


# ----------------------------------------------------------------------------- on a GPU

AGREE_DB = 30.0  # one decoder's CUDA vs CPU decode of the same bytes: the project's CPU-vs-device floor


def _agreement(a: torch.Tensor, b: torch.Tensor) -> tuple[float, str]:
    """PSNR (dB) of uint8 images ``a`` vs ``b`` (any devices), and max/mean |difference| in levels, as text."""
    diff = a.cpu().double() - b.cpu().double()
    mse = float((diff**2).mean())
    psnr = math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)
    return psnr, f"PSNR {psnr:.1f} dB, max {diff.abs().max():.0f}, mean {diff.abs().mean():.3f} levels"


def _jpegs(n: int, size: int, **kw) -> list[torch.Tensor]:
    """``n`` random crops of skimage's astronaut as JPEG bytes (quality 90, 4:2:0; ``kw`` to PIL), pinned."""
    from PIL import Image
    from skimage import data

    astro, rng = data.astronaut(), np.random.default_rng(0)
    out = []
    for y, x in rng.integers(0, 512 - size, size=(n, 2)):
        buf = io.BytesIO()
        Image.fromarray(astro[y:y + size, x:x + size].copy()).save(buf, "JPEG", quality=90, subsampling="4:2:0", **kw)
        out.append(torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8).pin_memory())
    return out


@pytest.mark.gpu
@pytest.mark.parametrize(("n", "size", "kw"), [(256, 32, {}), (64, 224, {}), (32, 224, {"progressive": True})],
                         ids=["256x32", "64x224", "32x224-progressive"])
def test_cuda_decode_matches_cpu_decode_of_the_same_bytes(decoder, n, size, kw):
    """One batched CUDA call (what the adapter makes) vs the same decoder on the CPU: same shapes and
    dtype, on the device, within AGREE_DB (baseline and progressive; nvJPEG's IDCT and chroma
    upsampling are not libjpeg-turbo's, and the hardware decoder's may differ again)."""
    dec = jpeg_decoder()
    js = _jpegs(n, size, **kw)
    gpu = dec.decode(js, mode="RGB", device="cuda")
    cpu = dec.decode(js, mode="RGB")
    assert len(gpu) == len(cpu) == n
    for g, c in zip(gpu, cpu, strict=True):
        assert g.device.type == "cuda" and g.dtype == c.dtype == torch.uint8 and g.shape == c.shape == (3, size, size)
    psnr, text = _agreement(torch.stack(gpu), torch.stack(cpu))
    assert psnr >= AGREE_DB, f"{dec.function} {dec.version}: cuda vs cpu {text}"


@pytest.mark.gpu
def test_torchcodec_and_torchvision_cuda_decodes_agree():
    """The two libraries' nvJPEG decodes of the same bytes, within AGREE_DB (TorchCodec may route
    images to the hardware decoder where torchvision does not)."""
    got = jpeg_decoder()
    if got.library != "torchcodec":
        pytest.skip(got.fallback_reason or "torchcodec not importable")
    js = _jpegs(64, 224)
    tv = torch.stack(quiet_torchvision_decode(js, mode="RGB", device="cuda"))  # the reference call
    tc = torch.stack(got.decode(js, mode="RGB", device="cuda"))
    psnr, text = _agreement(tc, tv)
    assert psnr >= AGREE_DB, f"torchcodec {got.version} vs torchvision on cuda: {text}"


@pytest.mark.gpu
def test_torchcodec_cuda_decode_waits_for_the_stream_and_syncs_the_host():
    """What the module docstring says of TorchCodec 0.17: it decodes on the current stream, after the work
    queued there, and host-synchronizes that stream before returning (so a batch's decode waits for
    the previous step). Checked on a side stream with a long kernel queued before the call."""
    got = jpeg_decoder()
    if got.library != "torchcodec":
        pytest.skip(got.fallback_reason or "torchcodec not importable")
    js = _jpegs(16, 224)
    ref = torch.stack(got.decode(js, mode="RGB", device="cuda"))
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time queued on the side stream
        out = got.decode(js, mode="RGB", device="cuda")
        assert side.query(), "the decode returned with work still queued on its stream: no host sync"
        out = torch.stack(out)
    torch.cuda.synchronize()
    assert torch.equal(out, ref)


@pytest.mark.gpu
def test_adapter_decode_does_not_wait_for_the_training_stream(photos):
    """The adapter decodes on its own stream (module docstring): with a long kernel queued on the
    training (current) stream, a batch's decode returns while that kernel still runs, and the batch
    equals the decode of the same files with nothing queued."""
    pipe = pipelines.create("torch-nvjpeg", photos, PipelineConfig(batch_size=8, device="cuda", workers=0))
    try:
        ref = pipe._decode_batch(list(range(8)))
        torch.cuda.synchronize()
        torch.cuda._sleep(2_000_000_000)  # about a second of GPU time on the current stream
        queued = torch.cuda.Event()
        queued.record()
        out = pipe._decode_batch(list(range(8)))
        assert not queued.query(), f"{pipe.decoder.function}: the decode waited for the training stream's work"
        torch.cuda.synchronize()
        assert torch.equal(out, ref)
    finally:
        pipe.close()
