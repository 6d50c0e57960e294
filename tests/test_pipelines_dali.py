"""DALI's best-practice settings that a CPU can check: which GPUs get the hardware-decoder options,
and that they reach only the ``mixed`` decoder (the graph itself runs in ``tests/test_pipelines.py``)."""

from __future__ import annotations

import pytest

from pipelines.dali import HW_DECODER_LOAD, decoder_options, hw_jpeg_decoder


@pytest.mark.parametrize(("name", "cap", "hw"), [
    ("NVIDIA A100-SXM4-80GB", (8, 0), True),
    ("NVIDIA A30", (8, 0), True),
    ("NVIDIA H100 80GB HBM3", (9, 0), True),
    ("NVIDIA H200", (9, 0), True),
    ("NVIDIA B200", (10, 0), True),
    ("NVIDIA A10", (8, 6), False),
    ("NVIDIA L4", (8, 9), False),
    ("Tesla V100-SXM2-16GB", (7, 0), False),
    ("NVIDIA GeForce RTX 4090", (8, 9), False),
])
def test_hw_jpeg_decoder_by_capability_or_name(name, cap, hw):
    assert hw_jpeg_decoder(name, cap) is hw


def test_hw_decoder_options_only_on_the_mixed_backend():
    assert decoder_options(gpu=False, hw_jpeg=False, height=32, width=32) == {}
    assert decoder_options(gpu=False, hw_jpeg=True, height=32, width=32) == {}  # cpu backend: never
    assert decoder_options(gpu=True, hw_jpeg=False, height=32, width=32) == {}
    assert decoder_options(gpu=True, hw_jpeg=True, height=224, width=200) == {
        "hw_decoder_load": HW_DECODER_LOAD, "preallocate_width_hint": 200, "preallocate_height_hint": 224,
    }


def _jpegs(folder, n=3):
    import numpy as np
    from PIL import Image

    folder.mkdir()
    paths = []
    for i in range(n):
        p = folder / f"{i:03d}.jpg"
        Image.fromarray(np.full((8, 8, 3), 40 * i, np.uint8)).save(p, quality=90)
        paths.append(p)
    return tuple(paths)


DECODER_FAILURE = ("Critical error in pipeline: Error in MIXED operator `nvidia.dali.fn.decoders.image`, which "
                   "was used in the pipeline definition with the following traceback: ... encountered: "
                   "nvImageCodec failure: '#4'. Current pipeline object is no longer valid.")


def test_a_decoder_failure_is_bad_input_only_when_a_file_really_is_bad(tmp_path):
    """A damaged file is named (exit 2); when every file decodes, the failure is the decoder's own
    (a driver, a library of another CUDA, device memory) and stays an error of the run, not the data's."""
    from pipelines.dali import decode_error

    paths = _jpegs(tmp_path / "jpeg")
    assert decode_error(RuntimeError(DECODER_FAILURE), paths) is None
    assert decode_error(RuntimeError("CUDA error: out of memory"), paths) is None  # not a decoder message
    paths[1].write_bytes(paths[1].read_bytes()[:40])  # truncated inside the headers
    err = decode_error(RuntimeError(DECODER_FAILURE), paths)
    assert err is not None and err.path == paths[1]
    assert "cannot decode JPEG (DALI: nvImageCodec failure: '#4'.)" in str(err)
