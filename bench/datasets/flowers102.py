"""``flowers102``: Oxford 102 Flowers as published: ``jpg/image_NNNNN.jpg``, ``imagelabels.mat``
(labels 1..102, shifted to 0..101) and ``setid.mat`` (1-based ids of the train/val/test splits).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bench.datasets.config import PrepareConfig
from bench.datasets.paths import ReadOnce, list_dir
from bench.datasets.sources import FileSource, Parts, register_source
from bench.errors import InputError

SPLIT_KEYS = (("train", "trnid"), ("val", "valid"), ("test", "tstid"))

# category names in label order (label 1 = "pink primrose"), as commonly published with the dataset
CLASS_NAMES = (
    "pink primrose", "hard-leaved pocket orchid", "canterbury bells", "sweet pea", "english marigold",
    "tiger lily", "moon orchid", "bird of paradise", "monkshood", "globe thistle", "snapdragon",
    "colt's foot", "king protea", "spear thistle", "yellow iris", "globe-flower", "purple coneflower",
    "peruvian lily", "balloon flower", "giant white arum lily", "fire lily", "pincushion flower",
    "fritillary", "red ginger", "grape hyacinth", "corn poppy", "prince of wales feathers",
    "stemless gentian", "artichoke", "sweet william", "carnation", "garden phlox", "love in the mist",
    "mexican aster", "alpine sea holly", "ruby-lipped cattleya", "cape flower", "great masterwort",
    "siam tulip", "lenten rose", "barbeton daisy", "daffodil", "sword lily", "poinsettia",
    "bolero deep blue", "wallflower", "marigold", "buttercup", "oxeye daisy", "common dandelion",
    "petunia", "wild pansy", "primula", "sunflower", "pelargonium", "bishop of llandaff", "gaura",
    "geranium", "orange dahlia", "pink-yellow dahlia", "cautleya spicata", "japanese anemone",
    "black-eyed susan", "silverbush", "californian poppy", "osteospermum", "spring crocus",
    "bearded iris", "windflower", "tree poppy", "gazania", "azalea", "water lily", "rose",
    "thorn apple", "morning glory", "passion flower", "lotus", "toad lily", "anthurium", "frangipani",
    "clematis", "hibiscus", "columbine", "desert-rose", "tree mallow", "magnolia", "cyclamen",
    "watercress", "canna lily", "hippeastrum", "bee balm", "ball moss", "foxglove", "bougainvillea",
    "camellia", "mallow", "mexican petunia", "bromelia", "blanket flower", "trumpet creeper",
    "blackberry lily",
)
assert len(CLASS_NAMES) == 102


def _loadmat(path: Path) -> dict:
    import scipy.io

    if not path.is_file():
        raise InputError("missing file: not an Oxford 102 Flowers folder (expected jpg/, imagelabels.mat, setid.mat)", path)
    try:
        return scipy.io.loadmat(path)
    except Exception as e:  # scipy raises ValueError/TypeError/MatReadError on bad files
        raise InputError(f"not a readable MATLAB .mat file ({str(e).splitlines()[0] if str(e) else type(e).__name__})", path) from None


def _vector(mat: dict, key: str, path: Path) -> np.ndarray:
    if key not in mat:
        raise InputError(f"no {key!r} entry", path)
    v = np.asarray(mat[key]).ravel()
    if v.size == 0 or not np.issubdtype(v.dtype, np.number) or not np.all(v == np.round(v)):
        raise InputError(f"{key!r} is not a vector of integers", path)
    return v.astype(np.int64)


@register_source("flowers102")
class Flowers102(FileSource):
    splits_by_ratio = False  # the official splits
    description = "Oxford 102 Flowers: jpg/image_NNNNN.jpg + imagelabels.mat + setid.mat (train/val/test)"

    def parts(self, cfg: PrepareConfig, root: Path) -> tuple[Parts, list[str], dict]:
        jpg = root / "jpg"
        if not jpg.is_dir():
            raise InputError("missing jpg/ folder: not an Oxford 102 Flowers folder (expected jpg/, imagelabels.mat, setid.mat)", jpg)
        labels_path, setid_path = root / "imagelabels.mat", root / "setid.mat"
        labels = _vector(_loadmat(labels_path), "labels", labels_path)
        setid = _loadmat(setid_path)
        n_files = sum(1 for p in list_dir(jpg) if p.suffix.lower() == ".jpg" and not p.name.startswith("."))
        if n_files != labels.size:
            raise InputError(f"has {labels.size} labels but {jpg} holds {n_files} .jpg images", labels_path)
        if labels.min() < 1 or labels.max() > len(CLASS_NAMES):
            raise InputError(f"labels must be 1..{len(CLASS_NAMES)}, found {labels.min()}..{labels.max()}", labels_path)
        num_classes = int(labels.max())
        counts, parts = {}, {}
        tree = ReadOnce(root)
        for split, key in SPLIT_KEYS:  # every split checked before any is decoded
            ids = _vector(setid, key, setid_path)
            if ids.min() < 1 or ids.max() > labels.size:
                raise InputError(f"{key!r} has image ids outside 1..{labels.size}", setid_path)
            paths = [jpg / f"image_{i:05d}.jpg" for i in ids]
            for p in paths:
                if not p.is_file():
                    raise InputError(f"image listed in setid.mat ({key}) is missing", p)
                tree.inside(p)
            counts[split] = int(ids.size)
            parts[split] = (paths, labels[ids - 1] - 1)
        meta = {"split_rule": "setid.mat trnid/valid/tstid", "label_shift": -1, "counts_before_limit": counts}
        return parts, list(CLASS_NAMES[:num_classes]), meta
