"""Sweeps: grids of ``inrbench`` commands declared as data (``bench/sweeps/<name>.yaml`` or any path), run
cell by cell in subprocesses, each in its own folder, resumable."""
