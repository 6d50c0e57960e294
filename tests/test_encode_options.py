"""``inrbench encode``'s pruning and quantization options: a bad value is refused naming the flag the
user typed and its allowed range, and an option that would be ignored (``--prune`` beside
``--prune-budget-db``, ``--qat`` with float32 widths, ...) is refused instead of dropped; one line, exit
2, nothing written. Left out, every option keeps its documented default (the encode is unchanged)."""

from __future__ import annotations

import argparse

import pytest

from bench.commands import encode as cmd
from tests.cli_helpers import assert_one_line_error, run_cli, snapshot
from tests.fixtures_datasets import write_tiny_prepared

BAD = [
    # values: the flag and its range, never the config's field names
    (["--prune", "1.0"], "argument --prune: must be in [0, 1), got 1.0"),
    (["--prune", "1.5"], "argument --prune: must be in [0, 1), got 1.5"),
    (["--prune", "-0.1"], "argument --prune: must be in [0, 1), got -0.1"),
    (["--prune", "nan"], "argument --prune: must be in [0, 1), got nan"),
    (["--prune-step", "0"], "argument --prune-step: must be in (0, 1), got 0"),
    (["--prune-max", "1"], "argument --prune-max: must be in (0, 1), got 1"),
    (["--prune-rounds", "0"], "argument --prune-rounds: must be >= 1, got 0"),
    (["--prune-finetune", "-1"], "argument --prune-finetune: must be >= 0, got -1"),
    (["--prune-lr", "0"], "argument --prune-lr: must be a finite number > 0, got 0"),
    (["--prune-lr", "inf"], "argument --prune-lr: must be a finite number > 0, got inf"),
    (["--prune-budget-db", "-1"], "argument --prune-budget-db: must be a finite number >= 0, got -1"),
    (["--prune-budget-db", "nan"], "argument --prune-budget-db: must be a finite number >= 0, got nan"),
    (["--qat", "-1"], "argument --qat: must be >= 0, got -1"),
    (["--qat", "2", "--bits", "8", "--qat-lr", "nan"], "argument --qat-lr: must be a finite number > 0, got nan"),
    # options that would be ignored
    (["--prune", "0.3", "--prune-budget-db", "1"],
     "--prune 0.3 and --prune-budget-db 1 are two pruning modes (an exact fraction per layer, or per image within "
     "a PSNR budget): give one"),
    (["--qat", "10"], "--qat 10 fine-tunes against quantized weights, but --bits 32 keeps every layer float32"),
    (["--qat", "10", "--bits", "fp32"], "QAT needs quantized widths (--bits 4..16, e.g. --bits 8)"),
    (["--qat-lr", "1e-3", "--bits", "8"], "--qat-lr 0.001 applies only with --qat N"),
    (["--per-channel"], "--per-channel sets quantization scales, but --bits 32 keeps every layer float32"),
    (["--prune-max", "0.5"], "--prune-max 0.5 applies to dynamic pruning only: add --prune-budget-db DB"),
    (["--prune", "0.2", "--prune-step", "0.1"], "--prune-step 0.1 applies to dynamic pruning only"),
    (["--prune-rounds", "3"], "--prune-rounds 3 applies to iterative pruning only: add --prune FRACTION"),
    (["--prune-budget-db", "1", "--prune-rounds", "3"], "--prune-rounds 3 applies to iterative pruning only"),
    (["--prune-finetune", "5"], "--prune-finetune 5 applies only when pruning"),
    (["--prune-lr", "1e-3"], "--prune-lr 0.001 applies only when pruning"),
    (["--prune-budget-db", "1", "--prune-step", "0.7"], "--prune-step 0.7 is larger than --prune-max 0.6"),
    (["--prune-budget-db", "1", "--prune-max", "0.2", "--prune-step", "0.3"],
     "--prune-step 0.3 is larger than --prune-max 0.2: no ratio would be tried"),
]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_tiny_prepared(tmp_path_factory.mktemp("opts") / "data", 6, 2)


@pytest.mark.parametrize("extra,fragment", BAD, ids=[" ".join(c[0]) for c in BAD])
def test_a_bad_or_ignored_option_is_one_line_naming_the_flag(data, tmp_path, capsys, extra, fragment):
    before = snapshot(data.parent, dirs=True)
    rc, out, err = run_cli(capsys, "encode", data, "--out", tmp_path / "s.inr", "--iterations", "2", *extra)
    line = assert_one_line_error(rc, err, fragment)
    assert "ratio=" not in line and "finetune_iterations" not in line and "qat_lr" not in line
    assert out == "" and list(tmp_path.iterdir()) == [] and snapshot(data.parent, dirs=True) == before


def _config(*argv: str):
    from bench import cli

    args = cli.build_parser().parse_args(["encode", "DATA", "--out", "x.inr", *argv])
    return cmd.build_config(args)


def test_left_out_options_keep_the_documented_defaults():
    from inr.encode import EncodeConfig
    from inr.prune import PruneConfig

    d = PruneConfig()
    assert cmd.PRUNE_DEFAULTS == {"rounds": d.rounds, "finetune_iterations": d.finetune_iterations, "lr": d.lr,
                                  "max_ratio": d.max_ratio, "step": d.step}
    assert cmd.QAT_LR == EncodeConfig.__dataclass_fields__["qat_lr"].default
    cfg = _config()
    assert cfg.prune == d and cfg.qat_iterations == 0 and cfg.qat_lr == cmd.QAT_LR and not cfg.quant.per_channel
    # the combinations that apply are taken as given
    cfg = _config("--prune", "0.2", "--prune-rounds", "1", "--prune-finetune", "5", "--prune-lr", "1e-3",
                  "--bits", "8", "--qat", "3", "--qat-lr", "2e-4", "--per-channel")
    assert cfg.prune == PruneConfig(ratio=0.2, rounds=1, finetune_iterations=5, lr=1e-3)
    assert (cfg.qat_iterations, cfg.qat_lr, cfg.quant.per_channel) == (3, 2e-4, True)
    cfg = _config("--prune-budget-db", "0.5", "--prune-max", "0.4", "--prune-step", "0.1", "--prune-finetune", "0")
    assert cfg.prune == PruneConfig(budget_db=0.5, max_ratio=0.4, step=0.1, finetune_iterations=0)
    assert _config("--prune", "0", "--prune-budget-db", "1").prune.budget_db == 1  # --prune 0: no fraction given
    assert _config("--bits", "32,8,32", "--layers", "2", "--qat", "2").qat_iterations == 2  # one quantized layer


def test_the_fraction_type_refuses_what_is_not_a_number():
    with pytest.raises(argparse.ArgumentTypeError, match="expected a number, got 'x'"):
        cmd._fraction("[0, 1)")("x")
    assert cmd._fraction("[0, 1)")("0") == 0.0
    with pytest.raises(argparse.ArgumentTypeError, match=r"must be in \(0, 1\), got 0"):
        cmd._fraction("(0, 1)")("0")


@pytest.mark.parametrize("kw,fragment", [
    ({"ratio": 1.0}, "the prune ratio must be in [0, 1), got 1.0"),
    ({"step": 0.0}, "the dynamic prune max_ratio and step must be in (0, 1), got 0.6, 0.0"),
    ({"max_ratio": 1.0}, "the dynamic prune max_ratio and step must be in (0, 1), got 1.0, 0.05"),
])
def test_the_config_checks_stay_as_a_backstop(kw, fragment):
    from inr.prune import PruneConfig

    with pytest.raises(ValueError) as e:
        PruneConfig(**kw)
    assert fragment in str(e.value)
