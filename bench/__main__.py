"""``python -m bench`` (how torchrun starts each rank): ``bench.cli.main``. Ctrl-C before the command's
own handling starts (``bench.errors.guarded``: while modules import) ends the same way as after it, never
with a traceback: ``inrbench: interrupted`` and exit 130, said by the launcher or rank 0 alone in a
data-parallel run (``bench.errors.interrupt_said_elsewhere``)."""

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
