"""``inrbench perf init``'s counts: 0 is refused (it used to mean "the default", a 10-minute run), a count
left out takes the documented default, and ``--help`` says each default."""

from __future__ import annotations

import pytest

from bench import cli
from bench.perf.init import CANDIDATES, SETS, settings
from tests.cli_helpers import assert_one_line_error, run_cli

COUNTS = ("--iterations-32", "--iterations-224", "--test-images", "--outer-steps", "--candidates", "--threads")


@pytest.mark.parametrize("flag", COUNTS)
@pytest.mark.parametrize("value", ["0", "-5"])
def test_a_count_of_zero_or_less_is_refused_naming_the_option(capsys, monkeypatch, flag, value):
    from bench.perf import init

    monkeypatch.setattr(init, "measure_set", lambda *a: pytest.fail("perf init started with " + flag))
    rc, _, err = run_cli(capsys, "perf", "init", "--sets", "32", flag, value)
    assert_one_line_error(rc, err, f"argument {flag}: must be >= 1, got {value}")


def _parser(*path: str):
    p = cli.build_parser()
    for name in path:
        p = next(a for a in p._actions if a.__class__.__name__ == "_SubParsersAction").choices[name]
    return p


def _args(*argv: str):
    return cli.build_parser().parse_args(["perf", "init", *argv])


def test_counts_left_out_take_each_sets_documented_default():
    args = _args()
    assert args.iterations_32 is args.iterations_224 is args.test_images is args.outer_steps is None
    assert args.candidates is args.threads is None
    for name in SETS:
        _, _, iters, n_test, meta = SETS[name]
        assert settings(name, args) == (iters, n_test, {**meta, "candidates": CANDIDATES[name]})
    assert settings("32", args)[:2] == (5000, 8) and settings("224", args)[:2] == (300, 1)
    assert settings("32", args)[2]["outer_steps"] == 300 and settings("224", args)[2]["outer_steps"] == 80


def test_counts_given_are_used_as_given():
    args = _args("--iterations-32", "7", "--iterations-224", "9", "--test-images", "3", "--outer-steps", "2",
                 "--candidates", "1")
    it32, n32, m32 = settings("32", args)
    it224, n224, m224 = settings("224", args)
    assert (it32, n32, it224, n224) == (7, 3, 9, 3)
    assert m32["outer_steps"] == m224["outer_steps"] == 2 and m32["candidates"] == m224["candidates"] == 1


def test_help_says_every_default():
    text = " ".join(_parser("perf", "init").format_help().split())
    for want in ("fit iterations at 32x32 (default 5000", "fit iterations at 224x224 (default 300",
                 "held-out images per set (default 8 at 32, 1 at 224)",
                 "Reptile outer steps (default 300 at 32, 80 at 224)", "default 4 at 32, 1 at 224)",
                 "torch CPU threads (default: torch's default"):
        assert want in text, want
