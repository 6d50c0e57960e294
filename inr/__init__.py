"""The INR codec (Rapid-INR style): every image becomes the weights of its own small SIREN.

``siren`` (architecture, the forward, init, coordinates), ``loop`` (the fit loop: eager or compiled step),
``fit`` (``FitConfig``, presets, ``fit``), ``prune``, ``quantize``, ``store`` (the file format), ``encode``
(fit -> prune -> QAT -> quantize, sharded and resumable), ``meta`` (learned init), ``native`` (mixed sizes).
"""
