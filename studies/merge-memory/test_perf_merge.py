"""The merge-memory study (``perf_merge.py``, formerly ``inrbench perf merge``): the in-memory merge never runs on
more images than the store measured (``--old-images`` defaults to 8,192 or ``--images`` when fewer), the goal says
what its baseline is, and end to end the streamed and in-memory stores are identical. Run with
``pytest studies/merge-memory``; not part of the default suite."""

from __future__ import annotations

import argparse
import json

from perf_merge import OLD_IMAGES, _setup, add_arguments, goal_line, main, write_synthetic_shard

from inr import store
from inr.siren import SirenArch

MIB = 2**20
ARCH = SirenArch(3, 7)


def test_old_images_follow_a_small_images(capsys, tmp_path):
    rc = main(["--preset", "demo", "--images", "20", "--shard-size", "8", "--dir", str(tmp_path), "--json"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["config"]["old_images"] == 20  # was 8192: more than the 20-image store itself
    assert [r["images"] for r in doc["rows"]] == [20, 20, 20] and doc["old_and_streamed_identical"]


def test_old_images_default_and_explicit_values():
    def old(*argv: str) -> int:
        p = argparse.ArgumentParser()
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


def test_perf_merge_reports_peak_memory_and_identical_stores(capsys, tmp_path):
    """``perf_merge.py`` end to end, tiny: synthetic pruned shards, three merge workers."""
    job = {"arch": ARCH.to_dict(), "bits": [8, 5, 32, 12], "per_channel": True, "prune": 0.3, "image_size": [8, 8]}
    st = store.StoreStream(write_synthetic_shard(tmp_path / "s.inr", job, 5, 1))  # every CRC and the layout hold
    assert st.num_images == 5 and st.pruned == (True,) * 4 and st.bits == (8, 5, 32, 12)
    rc = main(["--preset", "demo", "--images", "40", "--shard-size", "16",
               "--old-images", "24", "--bits", "8:6:12", "--prune", "0.3", "--dir", str(tmp_path), "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["old_and_streamed_identical"] is True
    assert [(r["merge"], r["images"], r["shards"]) for r in doc["rows"]] == [
        ("streamed", 40, 3), ("streamed", 24, 3), ("in-memory", 24, 3)]
    for r in doc["rows"]:
        assert 0 < r["start_rss"] <= r["peak_rss"] and r["store_bytes"] > 24 * 100
    assert not list(tmp_path.glob("perf-merge-*"))  # the temporary stores are gone
