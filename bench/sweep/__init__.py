"""Sweeps: grids of ``inrbench`` invocations declared as data, run cell by cell, resumable.

A sweep file (``bench/sweeps/<name>.yaml`` or any path) declares *cells*: one ``inrbench``
command each (prepare, encode, compare, bench) with typed fields and dependencies.
``spec`` turns the YAML into frozen, validated ``Cell`` objects; ``cells`` says how each kind
becomes an argv; ``runner`` runs them one by one in subprocesses, each in its own folder,
with a completion marker written atomically after the cell's outputs.
"""
