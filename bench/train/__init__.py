"""Training and evaluation: backbone registry (``backbones``), the optimizer/schedule/step
(``loop``), and test accuracy on the original pixels (``evaluate``)."""
