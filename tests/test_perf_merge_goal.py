"""``perf merge``: the in-memory merge never runs on more images than the store measured (``--old-images``
defaults to 8,192 or ``--images`` when fewer), and the goal says what its baseline is: the whole process,
not tested where the store is smaller than the process's RSS before the merge."""

from __future__ import annotations

import json

from bench.cli import main
from bench.perf.merge import OLD_IMAGES, goal_line

MIB = 2**20


def test_old_images_follow_a_small_images(capsys, tmp_path):
    rc = main(["perf", "merge", "--preset", "demo", "--images", "20", "--shard-size", "8", "--dir", str(tmp_path),
               "--json"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["config"]["old_images"] == 20  # was 8192: more than the 20-image store itself
    assert [r["images"] for r in doc["rows"]] == [20, 20, 20] and doc["old_and_streamed_identical"]


def test_old_images_default_and_explicit_values():
    import argparse

    from bench.perf.merge import _setup

    def old(*argv: str) -> int:
        p = argparse.ArgumentParser()
        from bench.perf.merge import add_arguments

        add_arguments(p)
        args = p.parse_args(list(argv))
        _setup(args)
        return args.old_images

    assert old() == OLD_IMAGES == 8192  # --images 50000
    assert old("--images", "100") == 100
    assert old("--images", "100", "--old-images", "0") == 0
    assert old("--images", "100", "--old-images", "300") == 300  # asked for: kept


def _row(start: float, peak: float, store: float) -> dict:
    return {"start_rss": start * MIB, "peak_rss": peak * MIB, "store_bytes": store * MIB,
            "peak_over_store": peak / store, "above_start_over_store": (peak - start) / store}


def test_the_goal_names_its_baseline_and_is_not_tested_below_the_interpreter():
    small = goal_line(_row(500, 501, 0.3), 100)
    assert "not tested at 100 images" in small and "NOT met" not in small and " met" not in small
    assert "500 MiB before the merge" in small and "the merge itself added 1 MiB" in small
    big = goal_line(_row(500, 527, 2862), 50000)
    assert big.startswith("goal (streamed peak < 2x store at 50000 images): met (whole process 527 MiB = 0.18x")
    assert "the merge itself added 27 MiB = 0.01x" in big
    assert "NOT met" in goal_line(_row(500, 7000, 3000), 50000)
