"""Backbone registry: ``create_backbone(name, num_classes)``: float ``[B, 3, H, W]`` -> logits ``[B, classes]``,
random init; ``resnet18-cifar`` (32 px), ``resnet18`` (224 px), ``small-cnn`` (CPU tests), ``vit-tiny``."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from bench.train.vit import ViT

_BACKBONES: dict[str, Callable[[int], nn.Module]] = {}


def register_backbone(name: str) -> Callable[[Callable[[int], nn.Module]], Callable[[int], nn.Module]]:
    def deco(fn: Callable[[int], nn.Module]) -> Callable[[int], nn.Module]:
        if name in _BACKBONES:
            raise ValueError(f"backbone {name!r} already registered")
        _BACKBONES[name] = fn
        return fn

    return deco


def backbone_names() -> list[str]:
    return sorted(_BACKBONES)


def create_backbone(name: str, num_classes: int) -> nn.Module:
    """Build backbone ``name``; unknown names raise ``KeyError`` listing the known ones."""
    if name not in _BACKBONES:
        raise KeyError(f"unknown backbone {name!r}; known: {', '.join(backbone_names())}")
    if num_classes < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}")
    return _BACKBONES[name](num_classes)


def default_backbone(image_size: int) -> str:
    """``resnet18-cifar`` for small images (<= 64 px), ``resnet18`` otherwise."""
    return "resnet18-cifar" if image_size <= 64 else "resnet18"


@register_backbone("resnet18-cifar")
def resnet18_cifar(num_classes: int) -> nn.Module:
    from torchvision.models import resnet18

    m = resnet18(weights=None, num_classes=num_classes)
    m.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
    m.maxpool = nn.Identity()
    return m


@register_backbone("resnet18")
def resnet18_imagenet(num_classes: int) -> nn.Module:
    from torchvision.models import resnet18

    return resnet18(weights=None, num_classes=num_classes)


def _conv_bn(cin: int, cout: int, stride: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout),
                         nn.ReLU(inplace=True))


class SmallCNN(nn.Sequential):
    """``[conv/BN/ReLU] x 4, AdaptiveAvgPool2d, Flatten, Linear`` (the class marks it for network expansion)."""


@register_backbone("small-cnn")
def small_cnn(num_classes: int) -> nn.Module:
    return SmallCNN(
        _conv_bn(3, 16, 1), _conv_bn(16, 32, 2), _conv_bn(32, 64, 2), _conv_bn(64, 128, 2),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, num_classes),
    )


@register_backbone("vit-tiny")
def vit_tiny(num_classes: int) -> nn.Module:
    return ViT(num_classes, image_size=32, patch=4, dim=96, depth=6, heads=3, mlp_ratio=2.0, drop_path=0.1)


def num_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
