"""``python -m bench`` (how torchrun starts each rank): ``bench.cli.main``. A Ctrl-C while modules import
ends as one after it does: ``inrbench: interrupted``, exit 130, said once in a data-parallel run."""

import sys

try:
    from bench.cli import main

    code = main()
except KeyboardInterrupt:
    from bench.errors import EXIT_INTERRUPTED, interrupt_said_elsewhere

    if not interrupt_said_elsewhere():
        print("inrbench: interrupted", file=sys.stderr)
    code = EXIT_INTERRUPTED
sys.exit(code)
