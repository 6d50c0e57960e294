"""Batched SIREN: agrees with the textbook per-image network; the fit step's gradients are autograd's."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from inr.loop import _step
from inr.siren import (
    SirenArch,
    coord_grid,
    decode_images,
    first_layer_input,
    fold_theta,
    forward,
    init_weights,
    net,
    psnr_from_rgb,
    to_theta,
)


def test_coord_grid_is_grid_sample_pixel_centres():
    h, w = 5, 7  # non-square
    c = coord_grid(h, w)
    assert c.shape == (h * w, 2)
    assert torch.allclose(c[:w, 0], (2 * torch.arange(w) + 1) / w - 1)
    assert torch.allclose(c[::w, 1], (2 * torch.arange(h) + 1) / h - 1)
    img = torch.rand(1, 3, h, w)
    sampled = F.grid_sample(img, c.view(1, h, w, 2), mode="bilinear", align_corners=False)
    assert torch.allclose(sampled, img, atol=1e-6)


def _per_image(W: list, b: list, coords: torch.Tensor, arch: SirenArch) -> torch.Tensor:
    """The textbook SIREN of one image (``sin(w0 * (x W + b))``, linear output, ``rgb = 0.5 * out + 0.5``)."""
    x = coords.double()
    for li in range(arch.num_linear):
        z = x @ W[li].double() + b[li].double()
        x = torch.sin(arch.omega(li) * z) if li < arch.layers else z
    return (0.5 * x + 0.5).float()


def test_batched_forward_equals_per_image_reference():
    arch = SirenArch(3, 9, w0=25.0, w0_first=30.0)
    B, h, w = 4, 6, 10
    ws = init_weights(arch, B, seed=3)
    coords = coord_grid(h, w)
    out = forward(ws, coords, arch)
    assert out.shape == (B, h * w, 3)
    for k in range(B):
        ref = _per_image([W[k] for W, _ in ws], [b[k] for _, b in ws], coords, arch)
        assert torch.allclose(out[k], ref, atol=2e-5), (k, (out[k] - ref).abs().max())
    per_image = coords.unsqueeze(0).repeat(B, 1, 1)
    assert torch.allclose(forward(ws, per_image, arch), out, atol=1e-6)
    imgs = decode_images(ws, arch, (h, w))
    assert imgs.shape == (B, 3, h, w)
    assert torch.equal(imgs[2, :, 1, 3], out[2, 1 * w + 3])


def test_init_is_per_image_seeded_and_siren_bounded():
    arch = SirenArch(5, 13)
    a = init_weights(arch, 6, seed=1)
    b = init_weights(arch, 3, seed=1, first_index=3)
    for (Wa, ba), (Wb, bb) in zip(a, b, strict=True):
        assert torch.equal(Wa[3:], Wb) and torch.equal(ba[3:], bb)
    assert a[0][0].abs().max() <= 1 / 2
    assert a[1][0].abs().max() <= (6 / 13) ** 0.5 / 30
    assert arch.params_per_image == 809 and SirenArch(10, 32).params_per_image == 9699


@pytest.mark.parametrize("per_row", [False, True])
def test_step_gradients_equal_autograd(per_row):
    """The loop's hand-written backward (``inr.loop._step``) gives autograd's gradients of the same forward, with
    shared or per-row pixels, and its PSNR is the 8-bit one."""
    arch = SirenArch(3, 7, w0=20.0, w0_first=30.0)
    B, h, w = 3, 5, 9
    coords = coord_grid(h, w)
    thetas = to_theta(init_weights(arch, B, seed=5))
    t01 = torch.rand(B, 3, h * w)
    a0 = first_layer_input(coords)
    if per_row:
        a0 = a0.unsqueeze(0).repeat(B, 1, 1)[:, :, torch.randperm(h * w)]
    leaf = [T.clone().requires_grad_() for T in thetas]
    rgb = net(fold_theta(leaf, arch.scales), a0)[0]
    (rgb - t01).pow(2).mean(dim=(1, 2)).sum().backward()
    grads, psnr = _step(thetas, a0, t01, arch.scales)
    for g, T in zip(grads, leaf, strict=True):
        assert torch.allclose(g, T.grad, atol=1e-7, rtol=1e-4)
    assert torch.allclose(psnr.double(), psnr_from_rgb(rgb, t01 * 255.0), atol=1e-3)
