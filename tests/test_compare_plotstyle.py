"""The project palette: one fixed colour per method, stable for names it does not list."""

from __future__ import annotations

import os
import subprocess
import sys

from bench import plotstyle


def test_every_listed_method_has_its_own_colour():
    methods = ["torch-jpeg", "dali", "inr", "raw", "jpeg", "jpeg-header-free", "inr-16bit", "inr-8bit",
               "inr-pruned", "inr-pruned-8bit", "inr-16-8-16bit", "inr-6bit"]
    colours = [plotstyle.color(m) for m in methods]
    assert len(set(colours)) == len(colours)
    assert plotstyle.color("dali") == plotstyle.STYLE["dali"][0] == "#009E73"


def test_variant_of_another_architecture_keeps_its_method_colour():
    assert plotstyle.color("inr-10x32-8bit") == plotstyle.color("inr-8bit")
    assert plotstyle.color("inr-5x13-pruned-8bit") == plotstyle.color("inr-pruned-8bit")  # longest suffix wins
    assert plotstyle.color("inr-5x13-16-8-16bit") == plotstyle.color("inr-16-8-16bit")
    assert plotstyle.color("inr-pruned15-16-8-16bit") == plotstyle.color("inr-pruned-16-8-16bit")
    assert plotstyle.color("inr-pruned15-16-8-16bit") != plotstyle.color("inr-16-8-16bit")
    assert plotstyle.marker("inr-10x32-8bit") == plotstyle.marker("inr-8bit")
    assert plotstyle.inr_method("8bit") == "inr-8bit" and plotstyle.inr_method("inr-8bit") == "inr-8bit"


def test_unknown_names_get_the_same_colour_in_every_process():
    here = [plotstyle.color(n) for n in ("mystery", "other-method")]
    code = "from bench import plotstyle; print(plotstyle.color('mystery'), plotstyle.color('other-method'))"
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": "123"}).stdout.split()
    assert here == there and all(c in plotstyle.EXTRA for c in here)
