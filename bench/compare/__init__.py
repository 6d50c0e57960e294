"""``inrbench compare``: INR stores against JPEG and other codecs at matched bytes (the paper's Figures 3
and 4): the codec registry, per-image rows, summary tables and figures."""
