"""``inrbench compare``: INR stores against JPEG and other codecs at matched bytes (``run`` end to end;
``core`` per-image rows, ``table`` summaries, ``figures``, ``codecs`` registry, ``kodak`` self-check)."""
