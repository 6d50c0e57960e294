"""Training and evaluation: backbones, trainers (dense, expand), the step (``loop``), test accuracy."""
