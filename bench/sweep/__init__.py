"""Sweeps: grids of ``inrbench`` commands declared in YAML (``spec``), run cell by cell, resumable (``runner``)."""
