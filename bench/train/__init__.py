"""Training and evaluation: the backbone registry, the training step, test accuracy on the original pixels."""
