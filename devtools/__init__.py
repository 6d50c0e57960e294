"""Tooling for the project's own developers (not installed): the GPU-machine check and its pytest plugin."""
