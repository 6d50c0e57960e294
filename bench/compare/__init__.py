"""``inrbench compare``: INR stores against JPEG at matched bytes (the paper's Figures 3 and 4).

Modules: ``codecs`` (the registry: jpeg, webp, avif, jxl, jp2 and their "at its best" variants;
per-image quality ladders; docs/codecs.md), ``kodak`` (the self-check against published Kodak curves),
``jpeg`` (marker parsing, header-free bytes, byte-target quality search),
``references`` (published bpp -> PSNR curves with their sources, ``data/reference_rd.csv``),
``quality`` (PSNR via ``bench.metrics``, SSIM), ``core`` (per-image rows), ``table``
(summary, crossovers, markdown), ``figures`` (matplotlib), ``inr_side`` (store loading),
``run`` (one run end to end), ``config`` (``CompareConfig``).
"""
