"""`inrbench perf decode`: every row measured on the CPU, a bad device is one line (exit 2), and the
CUDA code's logic (decoder variants as the ``inr`` adapter builds them there, GPU-sized batches, the GPU
JPEG rows' plumbing and skip reasons) runs here without a GPU and without mocks.
"""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from bench.cli import main
from bench.perf import decode

ARGS = ["perf", "decode", "--sizes", "16", "--no-compile", "--seconds", "0.01", "--repeats", "1"]


@pytest.fixture(scope="module")
def doc():
    """One ``perf decode --json`` run on the CPU (the default device) at 16 px."""
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main([*ARGS, "--json"]) == 0
    return json.loads(out.getvalue())


def test_every_row_is_measured_and_the_device_recorded(doc):
    assert set(doc) == {"device", "threads", "matmul_peak_gflops", "inr_batch", "rows"}
    assert doc["device"] == "cpu" and doc["inr_batch"] == {"16": 256} and doc["threads"] == 1
    assert doc["matmul_peak_gflops"]["fp32"] > 0
    rows = doc["rows"]
    assert {"PIL", "torchvision.io.decode_jpeg", "torchcodec.decoders.decode_jpeg", "DALI", "INR"} <= {
        r["method"].split(" ")[0] for r in rows}
    assert all(r["size"] == 16 and ("skipped" in r or r["images_per_s"] > 0) for r in rows)
    assert all("images_per_s_per_thread" in r for r in rows if "rate" in r)
    inr = [r for r in rows if r["method"].startswith("INR")]
    assert [r["variant"] for r in inr] == ["inr.siren.forward (reference: [B,P,h] baddbmm, w0 folded, in-place sin_)",
                                           "channels-first [B,h,P], whole batch", "channels-first, chunks of 39",
                                           "channels-first, chunks of 39, bf16"]
    assert all(r["gflops"] > 0 and 0 < r["pct_peak"] for r in inr)
    # fp32 variants compute the reference function: 8-bit identical or nearly
    assert all(r["psnr_vs_reference_db"] >= 60.0 for r in inr if "bf16" not in r["variant"])


def test_torchcodec_is_measured_beside_torchvision_where_the_adapter_uses_it(doc):
    from pipelines.torch_nvjpeg import jpeg_decoder

    rows = {r["method"].split(" ")[0]: r for r in doc["rows"]}
    tv, tc = rows["torchvision.io.decode_jpeg"], rows["torchcodec.decoders.decode_jpeg"]
    assert tv["images_per_s"] > 0 and tv["variant"] == tc["variant"] == "cpu, one image per call"
    dec = jpeg_decoder()
    if dec.library == "torchcodec":
        assert "skipped" not in tc and tc["method"] == f"torchcodec.decoders.decode_jpeg {dec.version}"
    else:
        assert tc["skipped"].startswith("torchcodec cannot be imported: ") and "rate" not in tc


def test_the_torchcodec_row_is_skipped_with_the_reason(monkeypatch, capsys):
    import sys

    monkeypatch.setitem(sys.modules, "torchcodec.decoders", None)
    assert main(ARGS) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "torchcodec" in x)
    assert "skipped" in line and "torchcodec.decoders.decode_jpeg: torchcodec cannot be imported" in line


@pytest.mark.parametrize("device", [pytest.param("gpu", id="not-a-device"), "cuda:x", "cpu:1", "cuda:99"])
def test_a_bad_device_is_one_line_exit_2(capsys, device):
    if device == "cuda:99" and not torch.cuda.is_available():
        device = "cuda"  # without CUDA every cuda device is refused; with it, a missing index is
    assert main(["perf", "decode", "--device", device, "--sizes", "16"]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err.count("\n") == 1, cap.err
    assert cap.err.startswith("inrbench: error: --device ") and device in cap.err, cap.err


def test_gpu_batches_fill_the_device_and_cpu_batches_are_unchanged():
    assert [decode.inr_batch(s, False) for s in (16, 32, 64, 65, 224)] == [256, 256, 256, 8, 8]
    assert [decode.inr_batch(s, True) for s in (32, 224)] == [4096, 256]


def test_cuda_variants_are_the_inr_adapters_decoder():
    """On CUDA the ``inr`` adapter builds ``SirenDecoder(arch, size, device, compile=..., fast_sine=False)``:
    no chunks (the whole batch), no polynomial sine; the rows measure that, eager and compiled, fp32 and bf16."""
    for size in (32, 224):
        v = decode.decoder_variants(size, "cuda", no_compile=False)
        assert [label for label, _ in v] == ["channels-first [B,h,P], whole batch", "channels-first, whole batch, bf16",
                                             "torch.compile, whole batch", "torch.compile, whole batch, bf16"]
        assert all("chunk" not in kw and not kw.get("fast_sine") for _, kw in v)
        assert [kw.get("compile", False) for _, kw in v] == [False, False, True, True]
        assert [kw.get("dtype") for _, kw in v] == [None, torch.bfloat16, None, torch.bfloat16]
        assert len(decode.decoder_variants(size, "cuda:0", no_compile=True)) == 2
    cpu = decode.decoder_variants(224, "cpu", no_compile=False)
    assert [kw.get("chunk") for _, kw in cpu] == [8, 1, 1, 1, 1, 1] and cpu[4][1]["fast_sine"]


def test_synchronizer_is_a_no_op_on_the_cpu():
    assert decode.synchronizer("cpu")() is None


def _photos(tmp_path, size: int = 16):
    return decode.photo_jpegs(size, tmp_path)


def test_gpu_jpeg_rows_decode_a_whole_batch_per_call(tmp_path):
    """The GPU rows' code on the CPU device: the files repeated to the batch, one batched call per timing
    step (TorchCodec), DALI's reader wrapping around to fill its batch."""
    root, blobs = _photos(tmp_path)
    args = argparse.Namespace(device="cpu", seconds=0.01, repeats=1, threads=1)
    batch = 3 * len(blobs) + 1
    nv, dali = decode.gpu_jpeg_rows(16, root, blobs, batch, args)
    assert nv["variant"] == f"cpu, batch of {batch} per call" and nv["rate"]["median"] > 0, nv
    assert "skipped" not in dali and dali["rate"]["median"] > 0, dali


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA: the failure path")
def test_a_gpu_jpeg_decoder_that_cannot_run_is_skipped_with_the_reason(tmp_path):
    root, blobs = _photos(tmp_path)
    args = argparse.Namespace(device="cuda", seconds=0.01, repeats=1, threads=1)
    data = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in blobs]
    row = decode.nvjpeg_row(data, args)
    assert "rate" not in row and row["skipped"].startswith("torchcodec.decoders.decode_jpeg cannot decode on cuda: "), row
    assert "\n" not in row["skipped"]
