"""The INR codec (Rapid-INR style): every image becomes the weights of its own small SIREN.

Public API (what the ``inr`` pipeline, ``perf decode`` and reports use):

``inr.siren``
    ``SirenArch(layers, hidden, w0=30, w0_first=30, in_features=2, out_features=3)`` — frozen;
    ``L x h`` = ``L`` sine layers + one linear ``h -> 3`` output layer (``arch.shapes`` lists
    ``(in, out)`` of the ``L + 1`` linear layers).
    ``coord_grid(h, w) -> [H*W, 2]`` pixel centres ``(x, y)``, ``x_j = (2j+1)/W - 1``,
    ``y_i = (2i+1)/H - 1`` (``grid_sample(align_corners=False)``), row-major pixel order.
    ``forward(weights, coords, arch) -> [B, P, 3]``: ``weights`` = per layer
    ``(W [B, in, out], b [B, 1, out])``; ``coords`` ``[P, 2]`` shared or ``[B, P, 2]`` per
    image. Output is RGB on the [0, 1] scale, *not clamped*: the network is fitted to
    ``2 * rgb - 1`` and ``rgb = 0.5 * out + 0.5`` is folded into the output layer. Sine
    layers compute ``sin(w0 * (x @ W + b))`` (``w0`` folded into the small weight tensors,
    ``baddbmm`` + in-place ``sin_``; no autograd).
``inr.store``
    ``save(path, arch, image_size, labels, layers, psnr=None, meta=None, per_channel=False)``
    (``layers`` from ``inr.quantize.quantize``) and ``load(path, device) -> StoredINR`` with
    ``.arch``, ``.image_size`` ``(H, W)``, ``.labels`` int64 ``[N]`` (on the device),
    ``.num_images``, ``.bytes_on_disk``, ``.bytes_per_image`` (file bytes / N),
    ``.resident_bytes()`` (device bytes of codes + scales + masks + offset tables),
    ``.psnr`` (per-image PSNR recorded at encode time), ``.weights(idx) -> [(W, b)]``
    gathered and dequantized on the store's device, ``.decode(idx, coords=None)`` ->
    ``[B, 3, H, W]`` float in [0, 1] (clamped), or ``[B, P, 3]`` samples at ``coords``.
``inr.fit``
    ``FitConfig``, ``PRESETS`` / ``preset(name, **overrides)`` (cifar10 5x13, flowers102
    10x32, mini-imagenet 10x40, demo), ``fit(images uint8 [N, H, W, 3], config) -> FitResult``
    (float32 weights + per-image PSNR), ``optimize(...)`` (the batched Adam loop).
``inr.quantize``
    ``QuantConfig(bits per layer, per_channel)``, ``parse_bits``, ``quantize`` / ``dequantize``,
    ``fake_quantize`` (straight-through, for QAT).
``inr.prune``
    iterative magnitude pruning to an exact ratio, dynamic per-image pruning within a PSNR
    budget (masks ``[N, in, out]`` bool per layer).
``inr.encode``
    ``EncodeConfig``, ``encode_images`` (fit -> prune -> QAT -> quantize, in memory) and
    ``encode_split`` (sharded, resumable: ``OUT.work/shard_*.inr``; a rerun continues and
    writes the identical file).
``inr.engine``
    the hand-written batched forward/backward used by ``fit.optimize`` (channel-major,
    bias folded into the matmuls; gradients tested equal to autograd).
``inr.reference``
    the one-image-at-a-time ``nn.Module`` design (baseline of ``perf encode``, test oracle).
``inr.testing``
    ``fit_store_for_tests(prepared, out)``: a quickly fitted 16-bit store for other tests.

Sizes: ``L x h`` has ``sum((in + 1) * out)`` parameters per image (5x13: 809; 10x32: 9,699;
10x40: 15,003). A store's bytes per image are its file bytes / N (header amortized).
"""
