"""``inrbench meta-init --validation``: the images set aside to choose among ``--candidates`` must leave at
least ``--meta-batch`` train images to meta-train on (each Reptile outer step adapts to that many distinct
images), else one line saying how many there are and the most ``--validation`` can be, exit 2, before any
work; ``--validation`` with one candidate (nothing to choose) is refused, not ignored."""

from __future__ import annotations

import pytest

from tests.cli_helpers import assert_one_line_error, run_cli, snapshot

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TINY = ("--layers", "2", "--hidden", "6", "--outer-steps", "2", "--inner-steps", "2", "--pixels", "40")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from bench.datasets.prepare import prepare_dataset

    # 8 train images, 2 test
    return prepare_dataset("synthetic", tmp_path_factory.mktemp("d") / "syn", size=8, num_classes=2, per_class=5,
                           jpeg_quality=75)


@pytest.mark.parametrize("extra,fragments", [
    (("--candidates", "3", "--validation", "400"),
     ("--validation 400 leaves 0 train images to meta-train on: the train split has 8 images, and at least "
      "--meta-batch (3) must be left", "use --validation 5 or less")),
    (("--candidates", "2", "--validation", "6"),
     ("--validation 6 leaves 2 train images to meta-train on", "use --validation 5 or less")),
    (("--candidates", "2", "--validation", "2", "--images", "4"),
     ("the --images subset has 4 of the 8 train images", "use --validation 1 or less")),
    (("--candidates", "2", "--meta-batch", "8"),  # --validation left out: its default 16
     ("--validation 16 leaves 0 train images", "lower --meta-batch below 8, or use --candidates 1")),
    (("--validation", "2"),
     ("--validation 2 sets train images aside to choose among --candidates; with one candidate nothing is chosen",)),
])
def test_too_few_images_left_to_meta_train_on_is_refused(data, tmp_path, capsys, extra, fragments):
    argv = [*TINY, "--meta-batch", "3", *extra]
    before = snapshot(data, dirs=True)
    rc, out, err = run_cli(capsys, "meta-init", data, *argv, "--out", tmp_path / "init.pt")
    assert_one_line_error(rc, err, *fragments)
    assert out == "" and list(tmp_path.iterdir()) == [] and snapshot(data, dirs=True) == before


def test_exactly_meta_batch_left_runs(data, tmp_path, capsys):
    rc, out, err = run_cli(capsys, "meta-init", data, *TINY, "--meta-batch", "3", "--candidates", "2",
                           "--validation", "5", "--out", tmp_path / "init.pt")
    assert rc == 0, err
    assert "meta-trained on 3 of 8 train images, 5 held out to choose the best of 2 seeds" in out


def test_the_library_refuses_it_too(data):
    from bench.datasets.prepared import open_prepared
    from bench.errors import InputError
    from inr.meta import MetaConfig, meta_init_dataset
    from inr.siren import SirenArch

    cfg = MetaConfig(outer_steps=1, inner_steps=1, meta_batch=3, pixels=40, candidates=2, validation=6)
    with pytest.raises(InputError, match=r"leaves 2 of 8 train images to meta-train on, fewer than the meta-batch \(3\)"):
        meta_init_dataset(open_prepared(data), SirenArch(2, 6), 1e-2, cfg, iterations=5)
