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
