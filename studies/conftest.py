"""Study tests run on demand (``pytest studies/<topic>``), never in the default suite (``testpaths = tests``).
Each test file's folder is on ``sys.path`` (pytest's default import mode), so a test imports its study's script."""

from tests.conftest import *  # noqa: F401,F403  the suite's fixtures and its gpu-marker skip
