"""Training and evaluation: the small CNN learns `synthetic` in two epochs; eval reads original pixels.

Margin: 10 classes (chance 10%); after two epochs the test accuracy must be >= 50%
(measured ~100% here; the bar leaves room for a noisy, shared 2-core machine).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bench.train.backbones import backbone_names, create_backbone, default_backbone, num_parameters
from bench.train.evaluate import eval_transform, evaluate
from bench.train.loop import TrainConfig, Trainer, autocast_for
from pipelines.base import Augment, Batch

CHANCE = 0.10
MARGIN = 0.40

pytestmark = pytest.mark.usefixtures("one_torch_thread")



@pytest.fixture(scope="module")
def synthetic16(tmp_path_factory):
    from bench.datasets.config import PrepareConfig
    from bench.datasets.prepare import prepare_config
    from bench.datasets.prepared import open_prepared

    out = tmp_path_factory.mktemp("syn") / "synthetic16"
    prepare_config(PrepareConfig(source="synthetic", size=16, num_classes=10, per_class=40), out)
    return open_prepared(out)


def test_small_cnn_two_epochs_beats_chance(synthetic16):
    torch.manual_seed(0)
    train = synthetic16.split("train")
    test = synthetic16.split("test")
    aug = Augment(crop="center", size=16, flip=False)
    x = eval_transform(train.images, aug)  # [N, 3, 16, 16]
    y = torch.as_tensor(train.labels)
    bs, epochs = 32, 2
    steps = (len(y) + bs - 1) // bs
    tr = Trainer(create_backbone("small-cnn", 10), TrainConfig(lr=0.05), "cpu", total_steps=steps * epochs)
    losses = []
    g = torch.Generator().manual_seed(0)
    for _ in range(epochs):
        perm = torch.randperm(len(y), generator=g)
        for i in range(0, len(y), bs):
            idx = perm[i:i + bs]
            tr.step(Batch(images=x[idx], labels=y[idx]))
        losses.append(tr.end_epoch())
    assert tr.steps_done == steps * epochs
    assert tr.opt.param_groups[0]["lr"] == pytest.approx(0.0, abs=1e-9)  # cosine reached its end
    assert losses[1] < losses[0]
    res = evaluate(tr.model, test.images, test.labels, aug, "cpu")
    assert res.images == len(test) == 80
    print(f"synthetic16 small-cnn 2 epochs: test accuracy {res.accuracy:.3f}, losses {losses}")
    assert res.accuracy >= CHANCE + MARGIN, res


def test_eval_transform_shapes_and_values():
    img = np.zeros((2, 40, 60, 3), dtype=np.uint8)
    img[:, :, 10:50] = 255  # the centre 40x40 square is white
    aug = Augment(crop="center", size=20, flip=False, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
    x = eval_transform(img, aug)
    assert x.shape == (2, 3, 20, 20) and x.dtype == torch.float32
    assert torch.allclose(x, torch.ones_like(x))  # white -> (1 - .5) / .5
    with pytest.raises(ValueError):
        eval_transform(img, Augment(crop="random-resized", size=20))
    with pytest.raises(ValueError):
        eval_transform(img.astype(np.float32), aug)


def test_backbones_shapes():
    assert {"resnet18-cifar", "resnet18", "small-cnn"} <= set(backbone_names())
    assert default_backbone(32) == "resnet18-cifar" and default_backbone(224) == "resnet18"
    m = create_backbone("resnet18-cifar", 10)
    assert m.conv1.kernel_size == (3, 3) and m.conv1.stride == (1, 1)
    assert isinstance(m.maxpool, torch.nn.Identity)
    assert 11_000_000 < num_parameters(m) < 11_300_000
    assert create_backbone("resnet18", 7).conv1.kernel_size == (7, 7)
    with torch.no_grad():
        assert create_backbone("small-cnn", 5)(torch.zeros(2, 3, 32, 32)).shape == (2, 5)
    with pytest.raises(KeyError, match="known"):
        create_backbone("vit", 10)


def test_autocast_policy():
    assert not autocast_for(torch.device("cpu"), "auto")._enabled
    assert autocast_for(torch.device("cpu"), "bf16")._enabled
    assert not autocast_for(torch.device("cpu"), "off")._enabled
    with pytest.raises(ValueError):
        TrainConfig(amp="fp8")
