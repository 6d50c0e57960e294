"""`--help` of every command: defaults shown (and no "default: None" noise), registry names derived
from the registries, no doubled '%'; progress bars only on a terminal; the compiled fit step's
CUDA_HOME note dropped; the encode header names the fit step."""

from __future__ import annotations

import argparse
import io
import logging
import re
import subprocess
import sys

import pytest

from bench import cli
from tests.cli_helpers import run_cli


def _parsers() -> dict[str, argparse.ArgumentParser]:
    """Every command's parser (and every ``perf`` target's), by its ``prog``."""
    out = {}

    def walk(p: argparse.ArgumentParser) -> None:
        out[p.prog] = p
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for sub in a.choices.values():
                    walk(sub)

    walk(cli.build_parser())
    return out


PARSERS = _parsers()


def _action_help(p: argparse.ArgumentParser, action: argparse.Action) -> str:
    f = p._get_formatter()
    f.add_argument(action)
    return " ".join(f.format_help().split())


@pytest.mark.parametrize("prog", sorted(PARSERS))
def test_every_option_with_a_default_shows_it_and_none_shows_noise(prog):
    p = PARSERS[prog]
    text = p.format_help()
    assert "%%" not in text
    assert not re.search(r"default:? (None|False|True|\[\]|\(\))\b", text), text
    for a in p._actions:
        if a.help is argparse.SUPPRESS or not a.option_strings or a.nargs == 0:
            continue
        if a.default in (None, "", [], ()) or isinstance(a.default, bool):
            continue
        assert re.search(r"\bdefault\b", _action_help(p, a)), (prog, a.option_strings, _action_help(p, a))


def test_defaults_are_formatted_as_written():
    bench = " ".join(PARSERS["inrbench bench"].format_help().split())
    for want in ("images per batch, per rank with --nproc (default 256)", "(default random-resized)",
                 "(default 0.08 1)", "(default 3/4 4/3)", "(default 0.1)", "(default 0.9)", "(default 0.0005)",
                 "model init (default 0)"):
        assert want in bench, want
    assert re.search(r"--no-flip disable the random horizontal flip (?!\(default)", bench)  # a flag: none shown


def test_inspect_description_has_one_percent_sign(capsys):
    assert cli.main(["inspect", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "bytes/image, % of raw RGB" in out and "%%" not in out


def test_registry_names_come_from_the_registries():
    import pipelines
    from bench.compare.codecs import names as codec_names
    from bench.compare.references import DATASETS
    from bench.sweep.spec import builtin_names
    from bench.train.backbones import backbone_names
    from bench.train.trainers import trainer_names
    from inr.fit import PRESETS

    def help_of(prog):
        return " ".join(PARSERS[prog].format_help().split())

    bench = help_of("inrbench bench")
    assert "vit-tiny" in backbone_names()
    assert f"a registered backbone ({', '.join(backbone_names())})" in bench
    assert f"a registered pipeline: {', '.join(pipelines.names())}" in bench
    assert f"training method (bench.train.trainers): {', '.join(trainer_names())};" in bench
    for prog in ("inrbench encode", "inrbench meta-init"):
        assert ", ".join(PRESETS) in help_of(prog), prog
    compare = help_of("inrbench compare")
    assert ", ".join(codec_names()) in compare and f"({', '.join(DATASETS)};" in compare
    assert f"a built-in sweep ({', '.join(builtin_names())})" in help_of("inrbench sweep")


def test_building_the_parser_imports_no_torch():
    code = ("import sys; from bench.cli import build_parser; build_parser(); "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_names_are_still_checked_by_the_commands(capsys, tmp_path):
    from tests.cli_helpers import assert_one_line_error

    rc, _, err = run_cli(capsys, "compare", tmp_path, "--reference", "nope", "--out", tmp_path / "o")
    assert_one_line_error(rc, err, "unknown reference 'nope'")


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_only_on_a_terminal():
    for file, enabled, drawn in ((io.StringIO(), True, False), (_Tty(), True, True), (_Tty(), False, False)):
        bar = cli.progress_bar(3, "x", "img", enabled=enabled, file=file)
        assert bar.disable is not drawn
        bar.update(3)
        bar.close()
        assert bool(file.getvalue()) is drawn


def test_cuda_home_note_is_dropped_and_nothing_else(caplog):
    cli.quiet_cuda_home_note()
    cli.quiet_cuda_home_note()  # installed once
    log = logging.getLogger("torch.utils.cpp_extension")
    assert log.filters.count(cli.no_cuda_runtime_note) == 1
    with caplog.at_level(logging.WARNING, logger="torch.utils.cpp_extension"):
        log.warning("No CUDA runtime is found, using CUDA_HOME='%s'", "/usr/local")
        log.warning("something else")
    assert [r.getMessage() for r in caplog.records] == ["something else"]


def test_encode_header_names_the_fit_step(tmp_path, capsys):
    data = tmp_path / "d"
    assert run_cli(capsys, "prepare", "synthetic", "--out", data, "--size", "8", "--per-class", "2",
                   "--num-classes", "2")[0] == 0
    rc, out, err = run_cli(capsys, "encode", data, "--out", tmp_path / "s.inr", "--layers", "2", "--hidden", "4",
                           "--iterations", "2", "--limit", "2")
    assert rc == 0, err
    assert "2 iterations, eager fit step, lr" in out.splitlines()[0]
    assert "\r" not in err  # stderr is not a terminal here: no progress-bar frames
