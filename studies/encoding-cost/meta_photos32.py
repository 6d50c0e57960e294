"""Shared by the learned-init studies (``studies/encoding-cost/meta-init-lr``, ``meta-init-seeds``, ``meta-init-unseen``):
the ``photos`` 32x32 set they use, its fixed validation split and random init's reference curves.

photos at 32x32, 20 crops per photograph (JPEG quality 90): 128 train and 32 test images with the 8
offline photographs. ``VAL`` train images, drawn with a fixed seed, are set aside as validation images.
"""

from __future__ import annotations

import json
from pathlib import Path

ITERATIONS = 5000  # the cifar10 preset's fit length
PER_CLASS = 20
VAL = 16


def data(out: Path):
    """The prepared set under ``out/photos32`` (prepared on first use)."""
    from bench.datasets.prepare import prepare_dataset
    from bench.datasets.prepared import open_prepared

    p = out / "photos32"
    if not (p / "manifest.json").is_file():
        prepare_dataset("photos", p, size=32, per_class=PER_CLASS, jpeg_quality=90)
    return open_prepared(p)


def split(out: Path):
    """(validation ``[VAL, 32, 32, 3]``, meta-training ``[N_train - VAL, ...]``, test ``[N_test, ...]``) uint8."""
    import numpy as np

    ds = data(out)
    tr = np.asarray(ds.split("train").images)
    val = np.sort(np.random.default_rng(123).choice(len(tr), VAL, replace=False))
    return tr[val], tr[np.setdiff1d(np.arange(len(tr)), val)], np.asarray(ds.split("test").images)


def save(path: Path, text: str) -> None:
    """Atomic write: a crash never leaves a partial file that a rerun would take as finished."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def reference(out: Path) -> dict:
    """Random init (seed 0) at the ``cifar10`` preset's lr: per-image best-so-far curves ``[ITERATIONS + 1, N]``
    on the validation (``"val"``) and test (``"test"``) images; computed once, kept in ``out/reference.json``."""
    import numpy as np
    import torch

    torch.set_num_threads(1)
    from inr.fit import preset
    from inr.meta import fit_curve

    f = out / "reference.json"
    if not f.is_file():
        val, _, test = split(out)
        cfg = preset("cifar10")
        save(f, json.dumps({k: fit_curve(x, cfg.arch, ITERATIONS, cfg.lr, seed=0, per_image=True).tolist()
                            for k, x in (("val", val), ("test", test))}))
    return {k: np.asarray(v) for k, v in json.loads(f.read_text()).items()}
