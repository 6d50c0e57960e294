"""The shared crop sampler (``pipelines.crops``) against torchvision, and its geometry."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats as st
import torch
import torch.nn.functional as F

from pipelines import Augment
from pipelines.crops import Crops, crop_theta, sample_crops, warp
from pipelines.shard import epoch_generator


def _torchvision_boxes(aug: Augment, h: int, w: int, n: int) -> np.ndarray:
    import torchvision.transforms.v2 as T
    from PIL import Image

    t = T.RandomResizedCrop(aug.size, scale=aug.scale, ratio=aug.ratio)
    im = Image.new("RGB", (w, h))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        ps = [t.make_params([im]) for _ in range(n)]
    return np.array([[p["top"], p["left"], p["height"], p["width"]] for p in ps], float)


@pytest.mark.parametrize(("h", "w", "scale"), [(32, 32, (0.08, 1.0)), (48, 30, (0.08, 1.0)), (20, 60, (0.5, 1.0))])
def test_random_resized_matches_torchvision_distribution(h, w, scale):
    """Area fraction, log aspect ratio and crop centre: KS p >= 0.001 against torchvision (n = 4000)."""
    aug = Augment(crop="random-resized", scale=scale)
    ours = sample_crops(aug, 4000, h, w, torch.Generator().manual_seed(1)).boxes.double().numpy()
    ref = _torchvision_boxes(aug, h, w, 4000)
    for name, f in {
        "area": lambda b: b[:, 2] * b[:, 3],
        "log-ratio": lambda b: np.log(b[:, 3] / b[:, 2]),
        "centre-x": lambda b: b[:, 1] + b[:, 3] / 2,
        "centre-y": lambda b: b[:, 0] + b[:, 2] / 2,
    }.items():
        ks = st.ks_2samp(f(ours), f(ref))
        assert ks.pvalue >= 1e-3, f"{name}: {ks}"
    assert (ours[:, :2] >= 0).all() and (ours[:, 0] + ours[:, 2] <= h).all() and (ours[:, 1] + ours[:, 3] <= w).all()
    assert np.array_equal(ours, np.round(ours)), "crop boxes must be whole pixels, as torchvision's"


def test_random_resized_fallback_is_torchvision_centre_crop():
    """No try can succeed (ratio 2..3 on a square image at full area): the fallback box, exactly."""
    aug = Augment(crop="random-resized", scale=(1.0, 1.0), ratio=(2.0, 3.0))
    ours = sample_crops(aug, 5, 32, 32, torch.Generator().manual_seed(0)).boxes
    ref = torch.from_numpy(_torchvision_boxes(aug, 32, 32, 5)).float()
    assert torch.equal(ours, ref)
    assert ours[0].tolist() == [8.0, 0.0, 16.0, 32.0]


def test_random_pad_and_center_boxes():
    g = torch.Generator().manual_seed(0)
    pad = sample_crops(Augment(crop="random-pad", size=32, pad=4), 5000, 32, 32, g).boxes
    assert pad[:, 2:].eq(32).all()
    for col in (0, 1):
        counts = torch.bincount((pad[:, col] + 4).long(), minlength=9)
        assert counts.numel() == 9 and st.chisquare(counts.numpy()).pvalue >= 1e-3
    center = sample_crops(Augment(crop="center", size=16, flip=False), 3, 40, 32, g)
    assert center.boxes.tolist() == [[4.0, 0.0, 32.0, 32.0]] * 3 and not center.flip.any()
    with pytest.raises(ValueError, match="exceeds the padded image"):
        sample_crops(Augment(crop="random-pad", size=48, pad=4), 1, 32, 32, g)


def test_flip_rate_and_per_image_draws():
    c = sample_crops(Augment(), 10000, 32, 32, torch.Generator().manual_seed(2))
    assert st.binomtest(int(c.flip.sum()), 10000, 0.5).pvalue >= 1e-3
    assert len({tuple(b) for b in c.boxes[:64].tolist()}) > 48, "crops repeat within a batch"
    assert not sample_crops(Augment(flip=False), 100, 32, 32, torch.Generator()).flip.any()


def test_epoch_generator_depends_on_seed_and_epoch_only():
    a = torch.rand(4, generator=epoch_generator(3, 1))
    assert torch.equal(a, torch.rand(4, generator=epoch_generator(3, 1)))
    assert not torch.equal(a, torch.rand(4, generator=epoch_generator(3, 2)))
    assert not torch.equal(a, torch.rand(4, generator=epoch_generator(4, 0)))  # not seed + epoch


def test_theta_maps_output_pixel_centres_into_the_box():
    """Output pixel centres land evenly inside the box (half-pixel convention); flip mirrors them."""
    boxes = torch.tensor([[2.0, 4.0, 10.0, 20.0], [2.0, 4.0, 10.0, 20.0]])
    theta = crop_theta(Crops(boxes, torch.tensor([False, True])), 32, 40)
    grid = F.affine_grid(theta, [2, 1, 5, 5], align_corners=False)  # [2, 5, 5, 2]
    to_px_x = (grid[..., 0] + 1) * 40 / 2  # input pixel units
    to_px_y = (grid[..., 1] + 1) * 32 / 2
    expect_x = 4 + (torch.arange(5) + 0.5) * 20 / 5
    expect_y = 2 + (torch.arange(5) + 0.5) * 10 / 5
    assert torch.allclose(to_px_x[0, 0], expect_x, atol=1e-5)
    assert torch.allclose(to_px_x[1, 0], expect_x.flip(0), atol=1e-5)
    assert torch.allclose(to_px_y[0, :, 0], expect_y, atol=1e-5)
    assert crop_theta(Crops(boxes, torch.tensor([False, True])), 32, 40).shape == (2, 2, 3)


def test_warp_matches_torchvision_resized_crop_inside_the_box():
    """Bilinear upscaling of a crop: ``warp`` equals torchvision's ``resized_crop`` wherever the
    bilinear support lies inside the box. At the box's rim ``warp`` samples the image at the exact
    crop coordinates (using the pixels just outside the box, as the INR adapter does), while
    crop-then-resize clamps to the box: a sub-pixel difference, by design.
    """
    import torchvision.transforms.v2.functional as TF

    g = torch.Generator().manual_seed(0)
    x = torch.rand(6, 3, 32, 32, generator=g) * 255
    c = sample_crops(Augment(scale=(0.2, 0.9), flip=False), 6, 32, 32, g)
    out = warp(x, c, Augment(size=32))
    j = torch.arange(32) + 0.5
    compared = 0
    for i in range(6):
        t, left, h, w = (int(v) for v in c.boxes[i])
        ref = TF.resized_crop(x[i], t, left, h, w, [32, 32], antialias=False)
        sx, sy = j * w / 32 - 0.5, j * h / 32 - 0.5  # source positions in box pixel centres
        ok = ((sy >= 0) & (sy <= h - 1))[:, None] & ((sx >= 0) & (sx <= w - 1))[None, :]
        assert ok.sum() > 500
        assert (out[i] - ref).abs()[:, ok].max() < 1e-2
        compared += int(ok.sum())
    assert compared > 3000
