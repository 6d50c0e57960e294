"""Hostile numbers and devices on the command line: each is one line on stderr, exit 2, nothing written.

Table-driven over the real CLI (``bench.cli.main``). A value that would silently mean
"automatic" (``--batch 0``), a non-finite float (``--lr nan``) or an impossible range is
refused before any work; the dataset folder is byte-identical afterwards and no output appears.
"""

from __future__ import annotations

import pytest

from bench import cli
from tests.cli_helpers import assert_one_line_error, snapshot

BENCH = ["bench", "--pipeline", "raw", "--data", "{D}", "--mode", "loader", "--epochs", "1", "--warmup", "0",
         "--repeats", "1", "--batch-size", "8", "--workers", "0", "--device", "cpu", "--out", "{O}"]
ENC = ["encode", "{D}", "--out", "{O}.inr"]
CMP = ["compare", "{D}", "--out", "{O}"]
PREP = ["prepare", "synthetic", "--out", "{O}"]
MI = ["meta-init", "{D}", "--out", "{O}.pt"]
SEED = "a seed must be an integer in 0..4294967295"

CASES = [
    (PREP + ["--size", "0"], "--size must be between 8 and 4096"),
    (PREP + ["--size", "100000"], "--size must be between 8 and 4096"),
    (PREP + ["--per-class", "0"], "--per-class must be >= 2"),
    (PREP + ["--jpeg-quality", "101"], "--jpeg-quality must be between 1 and 100"),
    (PREP + ["--limit", "-1"], "--limit must be >= 1"),
    (PREP + ["--val-fraction", "1.5"], "--val-fraction must be in (0, 1)"),
    (PREP + ["--max-pixels", "-1"], "--max-pixels must be >= 1"),
    (PREP + ["--size", "abc"], "argument --size: invalid int value"),
    (ENC + ["--iterations", "0"], "argument --iterations: must be >= 1, got 0"),
    (ENC + ["--layers", "0"], "argument --layers: must be >= 1"),
    (ENC + ["--lr", "nan"], "argument --lr: must be a finite number > 0, got nan"),
    (ENC + ["--w0", "inf"], "argument --w0: must be a finite number > 0, got inf"),
    (ENC + ["--batch", "0"], "argument --batch: must be >= 1, got 0"),
    (ENC + ["--memory-mb", "0"], "argument --memory-mb: must be >= 1"),
    (ENC + ["--shard-size", "0"], "argument --shard-size: must be >= 1"),
    (ENC + ["--threads", "0"], "argument --threads: must be >= 1"),
    (ENC + ["--limit", "-1"], "argument --limit: must be >= 1, got -1"),
    (ENC + ["--limit", "0"], "argument --limit: must be >= 1, got 0"),
    (ENC + ["--bits", "3"], "--bits '3': widths must be 4..16 or 32"),
    (ENC + ["--prune", "1.5"], "argument --prune: must be in [0, 1), got 1.5"),
    (ENC + ["--qat", "2", "--bits", "8", "--qat-lr", "nan"], "argument --qat-lr: must be a finite number > 0, got nan"),
    (ENC + ["--prune-budget-db", "-1"], "argument --prune-budget-db: must be a finite number >= 0, got -1"),
    (ENC + ["--prune-budget-db", "nan"], "argument --prune-budget-db: must be a finite number >= 0, got nan"),
    (ENC + ["--preset", "nope"], "unknown preset 'nope'"),
    (ENC + ["--split", "nope"], "no split 'nope'"),
    (ENC + ["--device", "cuda:7"], "cuda:7"),
    (ENC + ["--device", "tpu"], "tpu"),
    (BENCH + ["--batch-size", "0"], "argument --batch-size: must be >= 1"),
    (BENCH + ["--epochs", "0"], "argument --epochs: must be >= 1"),
    (BENCH + ["--size", "0"], "argument --size: must be >= 1"),
    (BENCH + ["--scale", "0.5", "0.1"], "Augment.scale must satisfy 0 < lo <= hi <= 1"),
    (BENCH + ["--lr", "nan"], "lr must be > 0 and finite, got nan"),
    (BENCH + ["--momentum", "2"], "momentum must be in [0, 1)"),
    (BENCH + ["--weight-decay", "inf"], "weight_decay must be >= 0"),
    (BENCH + ["--monitor-period", "0"], "monitor periods must be > 0"),
    (BENCH + ["--monitor-period", "nan"], "monitor periods must be > 0 and finite, got nan"),
    (BENCH + ["--pss-period", "inf"], "monitor periods must be > 0 and finite"),
    (BENCH + ["--pipeline", "inr"], "--pipeline inr reads an encoded store: pass --store FILE"),
    (["env", "--out", ""], "argument --out: must not be empty"),
    (["report", "results", "--out", ""], "argument --out: must not be empty"),
    (BENCH + ["--pipeline", "nope"], "unknown pipeline 'nope'"),
    (BENCH + ["--device", "cuda:7"], "cuda:7"),
    (BENCH + ["--device", "bogus"], "bogus"),
    (BENCH + ["--method", "expand", "--schedule", "0.5:1:1,1:2:1", "--warmup", "1"],
     "--method expand trains a model: it needs --mode replay or train, not loader"),
    # --seed: one range everywhere (numpy refuses negatives; beyond int64 broke the results views)
    (PREP + ["--seed", "-1"], "argument --seed: " + SEED),
    (ENC + ["--seed", "-5"], "argument --seed: " + SEED),
    (ENC + ["--seed", "99999999999999999999999"], "argument --seed: " + SEED),
    (BENCH + ["--seed", "-1"], "argument --seed: " + SEED),
    (BENCH + ["--seed", "99999999999999999999999"], "argument --seed: " + SEED),
    (MI + ["--seed", "-1"], "argument --seed: " + SEED),
    (MI + ["--seed", str(2**32)], "argument --seed: " + SEED),
    # perf: counts >= 1, "0 = default" options >= 0, durations finite
    (["perf", "encode", "--iterations", "0"], "argument --iterations: must be >= 1, got 0"),
    (["perf", "encode", "--batch", "0"], "argument --batch: must be >= 1, got 0"),
    (["perf", "encode", "--loop-images", "0"], "argument --loop-images: must be >= 1, got 0"),
    (["perf", "encode", "--chunk", "-1"], "argument --chunk: must be >= 0, got -1"),
    (["perf", "encode", "--threads", "-1"], "argument --threads: must be >= 0, got -1"),
    (["perf", "encode", "--lr", "nan"], "argument --lr: must be a finite number > 0, got nan"),
    (["perf", "decode", "--repeats", "0"], "argument --repeats: must be >= 1, got 0"),
    (["perf", "decode", "--threads", "0"], "argument --threads: must be >= 1, got 0"),
    (["perf", "decode", "--seconds", "-1"], "argument --seconds: must be a finite number >= 0, got -1"),
    (["perf", "decode", "--seconds", "nan"], "argument --seconds: must be a finite number >= 0, got nan"),
    (["perf", "decode", "--sizes", "32", "0"], "argument --sizes: must be >= 1, got 0"),
    (["perf", "expand", "--repeats", "0"], "argument --repeats: must be >= 1, got 0"),
    (["perf", "expand", "--threads", "0"], "argument --threads: must be >= 1, got 0"),
    (["perf", "expand", "--batch-size", "0"], "argument --batch-size: must be >= 1, got 0"),
    (CMP + ["--jpeg-qualities", "0"], "argument --jpeg-qualities: a quality must be in 1..100, got 0"),
    (CMP + ["--limit", "0"], "argument --limit: must be >= 1, got 0"),
    (CMP + ["--window", "-1"], "argument --window: must be >= 0, got -1"),
]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("num") / "data"
    assert cli.main(["prepare", "synthetic", "--out", str(d), "--size", "8", "--per-class", "4",
                     "--num-classes", "2"]) == 0
    return d


@pytest.mark.parametrize("argv,fragment", CASES, ids=[f"{c[0][0]}{' '.join(c[0][-2:])}" for c in CASES])
def test_bad_number_is_one_line_exit_2_and_writes_nothing(data, tmp_path, capsys, argv, fragment):
    out = tmp_path / "o"
    before = snapshot(data.parent, dirs=True)
    rc = cli.main([a.replace("{D}", str(data)).replace("{O}", str(out)) for a in argv])
    _, err = capsys.readouterr()
    assert_one_line_error(rc, err, fragment)
    assert snapshot(data.parent, dirs=True) == before
    assert list(tmp_path.iterdir()) == []


OOM_CASES = [  # beyond any machine (more bytes than a 47-bit address space): torch's allocator refuses at once
    (ENC + ["--iterations", "2", "--no-progress", "--hidden", "100000000"], "encode-hidden-1e8"),
    (BENCH + ["--size", "4000000"], "bench-size-4e6"),
]


@pytest.mark.parametrize("argv,name", OOM_CASES, ids=[c[1] for c in OOM_CASES])
def test_out_of_memory_is_one_line_exit_3(data, tmp_path, capsys, argv, name):
    """Sizes beyond the machine: ``inrbench: error: out of memory: ...``, the documented exit 3, no
    traceback; encode leaves no store and no work folder (nothing was fitted); bench records an error row."""
    import pandas as pd

    out = tmp_path / "o"
    before = snapshot(data.parent, dirs=True)
    rc = cli.main([a.replace("{D}", str(data)).replace("{O}", str(out)) for a in argv])
    _, err = capsys.readouterr()
    assert rc == 3 and "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("inrbench: error: out of memory: "), err
    assert "can't allocate memory" in lines[0] or "out of memory" in lines[0].split(": ", 2)[2]
    assert snapshot(data.parent, dirs=True) == before
    if argv[0] == "encode":
        assert list(tmp_path.iterdir()) == []
    else:
        rows = pd.concat(pd.read_csv(f) for f in out.glob("runs/*/rows.csv"))
        assert len(rows) == 1 and rows.status.item() == "error" and rows.reason.item().startswith("out of memory: ")


@pytest.mark.parametrize("timeout", ["-1", "0", ".nan", ".inf"])
def test_sweep_cell_timeout_must_be_positive_and_finite(tmp_path, capsys, timeout):
    """A cell's timeout_s is checked with the sweep file (--list), not found wrong hours later."""
    sweep = tmp_path / "s.yaml"
    sweep.write_text(f"name: t\ncells:\n  - {{kind: prepare, id: p, source: photos, timeout_s: {timeout}}}\n")
    rc = cli.main(["sweep", str(sweep), "--list"])
    _, err = capsys.readouterr()
    assert_one_line_error(rc, err, str(sweep), "cell 'p': timeout_s must be a finite number of seconds > 0")
    assert [p.name for p in tmp_path.iterdir()] == ["s.yaml"]
