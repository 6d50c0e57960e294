"""``CompareConfig.inr_bytes``: an INR image costs its store file share (default) or its payload
(the packed weight arrays, no store header); the codecs are matched to what it costs."""

from __future__ import annotations

import numpy as np
import pytest

from bench.compare.config import CompareConfig
from bench.compare.core import InrDecoded
from bench.compare.inr_side import payload_variant
from bench.compare.run import run_compare
from bench.datasets.prepared import SplitData, write_prepared
from bench.errors import InputError

N, S = 3, 32


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    rng = np.random.default_rng(0)
    base = rng.integers(0, 256, (N, 4, 4, 3)).astype(np.float64)
    images = np.clip(np.kron(base, np.ones((1, 8, 8, 1))) + rng.normal(0, 4, (N, S, S, 3)), 0, 255).round().astype(np.uint8)
    root = tmp_path_factory.mktemp("payload") / "tiny"
    write_prepared(root, {"train": SplitData(images, np.arange(N, dtype=np.int64))}, {"source": "tiny", "classes": ["a", "b", "c"]})
    return root, images


def _variant(images, payload: float | None) -> InrDecoded:
    dec = np.clip(images.astype(np.int16) + 3, 0, 255).astype(np.uint8)
    return InrDecoded(name="v", bytes_per_image=2500.0, header_free_bytes_per_image=payload, decoded=dec)


@pytest.mark.parametrize("mode,want", [("file", 2500.0), ("payload", 900.0)])
def test_codecs_fit_the_counted_bytes(prepared, tmp_path, mode, want):
    root, images = prepared
    cfg = CompareConfig(inr_bytes=mode, match="file", qualities=(50,), weight_images=1)
    res = run_compare(root, [], cfg, tmp_path / mode, variants=[_variant(images, 900.0)], env=False)
    df = res.per_image
    inr = df[df["method"] == "inr"]
    assert np.allclose(inr["file_bytes"], want) and np.allclose(inr["bpp"], want * 8 / (S * S))
    matched = df[df["method"] == "jpeg-matched"]
    assert np.allclose(matched["target_bytes"], want)
    ok = matched[matched["status"] == "ok"]
    assert (ok["file_bytes"] <= want).all()
    md = (tmp_path / mode / "summary.md").read_text()
    assert ("its payload" in md) == (mode == "payload")


def test_payload_needs_the_array_table(prepared):
    _, images = prepared
    with pytest.raises(InputError, match="array table"):
        payload_variant(_variant(images, None))
    with pytest.raises(ValueError, match="--inr-bytes must be one of"):
        CompareConfig(inr_bytes="disk")
