"""Batched SIREN: agrees with a plain per-image nn.Linear loop; coordinate convention."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from inr.reference import load_weights, make_siren, rgb
from inr.siren import SirenArch, coord_grid, decode_images, forward, forward_train, init_weights


def test_coord_grid_is_grid_sample_pixel_centres():
    h, w = 5, 7  # non-square
    c = coord_grid(h, w)
    assert c.shape == (h * w, 2)
    assert torch.allclose(c[:w, 0], (2 * torch.arange(w) + 1) / w - 1)
    assert torch.allclose(c[::w, 1], (2 * torch.arange(h) + 1) / h - 1)
    img = torch.rand(1, 3, h, w)
    sampled = F.grid_sample(img, c.view(1, h, w, 2), mode="bilinear", align_corners=False)
    assert torch.allclose(sampled, img, atol=1e-6)


def test_batched_forward_equals_per_image_reference():
    arch = SirenArch(3, 9, w0=25.0, w0_first=30.0)
    B, h, w = 4, 6, 10
    ws = init_weights(arch, B, seed=3)
    coords = coord_grid(h, w)
    out = forward(ws, coords, arch)
    assert out.shape == (B, h * w, 3)
    for k in range(B):
        model = make_siren(arch)
        for li, (W, b) in enumerate(ws):
            load_weights(model, W[k], b[k], li)
        with torch.no_grad():
            ref = rgb(model, coords)
        assert torch.allclose(out[k], ref, atol=2e-5), (k, (out[k] - ref).abs().max())
    # autograd twin and per-image coordinates give the same numbers
    assert torch.allclose(forward_train(ws, coords, arch), out, atol=1e-6)
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


def test_engine_gradients_equal_autograd():
    from inr.engine import SirenEngine, from_theta, to_theta

    arch = SirenArch(3, 7, w0=20.0, w0_first=30.0)
    B, h, w = 3, 5, 9
    ws = init_weights(arch, B, seed=5)
    coords = coord_grid(h, w)
    target = torch.rand(B, h * w, 3)
    leaf = [(W.clone().requires_grad_(), b.clone().requires_grad_()) for W, b in ws]
    loss = (forward_train(leaf, coords, arch) - target).pow(2).mean(dim=(1, 2)).sum()
    loss.backward()
    eng = SirenEngine(arch, coords, B)
    rgb = eng.forward(to_theta(ws))
    assert torch.allclose(rgb.transpose(1, 2), forward(ws, coords, arch), atol=1e-6)
    grads = eng.backward(rgb.sub_(target.transpose(1, 2)).mul_(2.0 / (3 * h * w)))
    for (gW, gb), (W, b) in zip(from_theta(grads), leaf, strict=True):
        assert torch.allclose(gW, W.grad, atol=1e-7, rtol=1e-4) and torch.allclose(gb, b.grad, atol=1e-7, rtol=1e-4)


@pytest.mark.parametrize("layers", [1, 2, 4])
def test_forward_only_engine_gives_the_engine_forward_bit_for_bit(layers):
    """``SirenEngine(..., backward=False)`` (the compiled fit's final evaluation: two activation buffers in turn,
    one pre-activation buffer) computes what the full engine's ``forward(need_grad=False)`` does, bit for bit."""
    from inr.engine import SirenEngine, to_theta

    arch = SirenArch(layers, 6)
    coords = coord_grid(7, 5)
    th = to_theta(init_weights(arch, 3, seed=layers))
    th = [T + 0.05 * torch.randn(T.shape, generator=torch.Generator().manual_seed(li)) for li, T in enumerate(th)]
    full, lean = SirenEngine(arch, coords, 3), SirenEngine(arch, coords, 3, backward=False)
    assert len(lean.acts) == min(2, layers) and len(lean.cos) == 1 and not lean.gbuf
    assert torch.equal(lean.forward(th, need_grad=False), full.forward(th, need_grad=False))
    assert torch.equal(lean.a0, full.a0)
    with pytest.raises(ValueError, match="forward-only"):
        lean.forward(th)
    with pytest.raises(ValueError, match="forward-only"):
        lean.backward(torch.zeros(3, 3, 35))
