"""The INR codec (Rapid-INR style): every image becomes the weights of its own small SIREN.
Modules: siren, loop, fit, prune, quantize, store, encode, meta (learned init), native (mixed sizes)."""
