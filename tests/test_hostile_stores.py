"""Hostile input, table-driven: stores, pixels, labels, JPEGs and devices through the real CLI.

Each case builds one hostile input in ``tmp_path`` (from a tiny prepared dataset and one store
encoded from it), runs ``bench.cli.main(argv)`` and checks: the exit code; for exit 2 exactly one
stderr line, ``inrbench: error: ...`` holding the expected text; no traceback anywhere; and every
file that existed under ``tmp_path`` before the command byte-identical after it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from child_cli import run_children
from cli_helpers import snapshot

from bench.cli import main

pytestmark = pytest.mark.usefixtures("one_torch_thread")

BENCH = ["--device", "cpu", "--repeats", "1", "--warmup", "0", "--batch-size", "4", "--workers", "0",
         "--backbone", "small-cnn", "--monitor-period", "0.5"]


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> dict[str, Path]:
    """A prepared dataset (8x8, 2 classes, 6 train images) and a store encoded from it by the CLI."""
    d = tmp_path_factory.mktemp("hostile")
    assert main(["prepare", "synthetic", "--out", str(d / "data"), "--size", "8", "--per-class", "4",
                 "--num-classes", "2"]) == 0
    assert main(["encode", str(d / "data"), "--out", str(d / "s.inr"), "--iterations", "3", "--bits", "8",
                 "--no-progress"]) == 0
    return {"data": d / "data", "store": d / "s.inr"}


# ----------------------------------------------------------------------------- builders

def _data(base, tmp: Path) -> Path:
    return Path(shutil.copytree(base["data"], tmp / "data"))


def _store(base, tmp: Path) -> Path:
    return Path(shutil.copy(base["store"], tmp / "s.inr"))


def _set_manifest_hash(data: Path, split: str, key: str, arr: np.ndarray) -> None:
    m = json.loads((data / "manifest.json").read_text())
    m["splits"][split][key] = hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()
    (data / "manifest.json").write_text(json.dumps(m, indent=2, sort_keys=True) + "\n")


def other_images(base, tmp: Path) -> Path:
    """A dataset with the same shape and labels as ``base`` but other pixels (its own manifest is right)."""
    data = _data(base, tmp)
    px = np.load(data / "train" / "pixels.npy")
    px = (255 - px).astype(np.uint8)
    np.save(data / "train" / "pixels.npy", px)
    _set_manifest_hash(data, "train", "pixels_sha256", px)
    return data


def flip_pixel_byte(base, tmp: Path) -> Path:
    """One byte of ``pixels.npy`` flipped after the .npy header: shape and dtype still read fine."""
    data = _data(base, tmp)
    p = data / "train" / "pixels.npy"
    raw = bytearray(p.read_bytes())
    raw[len(raw) - 7] ^= 0x01
    p.write_bytes(bytes(raw))
    return data


def bad_label(base, tmp: Path) -> Path:
    """labels.npy holds class 5 of a 2-class dataset (the manifest's hash matches it)."""
    data = _data(base, tmp)
    labels = np.load(data / "train" / "labels.npy")
    labels[2] = 5
    np.save(data / "train" / "labels.npy", labels)
    _set_manifest_hash(data, "train", "labels_sha256", labels)
    return data


def damaged_jpeg(damage: Callable[[bytes], bytes]):
    """A builder: a copy of the dataset whose train JPEG 000003.jpg is ``damage(its bytes)``."""
    def build(base, tmp: Path) -> Path:
        data = _data(base, tmp)
        p = data / "train" / "jpeg" / "000003.jpg"
        p.write_bytes(damage(p.read_bytes()))
        return data
    return build


def _jpeg_of(side: int) -> bytes:
    """A JPEG of ``side`` x ``side`` pixels (the prepared split is 8x8)."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.full((side, side, 3), 90, np.uint8)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def _bogus_huffman_counts(raw: bytes) -> bytes:
    """Every code-length count of the first Huffman table 255: the headers still walk to the scan
    (so the build-time check passes), the decoder refuses the table."""
    b = bytearray(raw)
    i = b.index(b"\xff\xc4")
    b[i + 5 : i + 21] = b"\xff" * 16
    return bytes(b)


broken_jpeg = damaged_jpeg(lambda raw: raw[:100])  # cut inside its quantization tables: no frame header
garbage_jpeg = damaged_jpeg(lambda raw: b"garbage\n")  # `echo garbage > 000003.jpg`
truncated_jpeg = damaged_jpeg(lambda raw: raw[:-10])  # cut inside the scan: no end-of-image marker
wrong_size_jpeg = damaged_jpeg(lambda raw: _jpeg_of(16))  # a replaced file of another size
# cut inside a Huffman table, an end-of-image marker appended: frame size and end marker look right
headers_cut_jpeg = damaged_jpeg(lambda raw: raw[: raw.index(b"\xff\xc4") + 20] + b"\xff\xd9")
bogus_huffman_jpeg = damaged_jpeg(_bogus_huffman_counts)


def edited_manifest(edit: Callable[[dict], object]):
    """A builder: a copy of the dataset whose manifest.json is ``edit(manifest)`` (its return value
    when not None, else the manifest changed in place); schema_version stays right."""
    def build(base, tmp: Path) -> Path:
        data = _data(base, tmp)
        m = json.loads((data / "manifest.json").read_text())
        new = edit(m)
        (data / "manifest.json").write_text(json.dumps(m if new is None else new) + "\n")
        return data
    return build


def rewrite_store(base, tmp: Path, mutate: Callable[[dict, bytearray], None]) -> Path:
    """A copy of the store with its header changed by ``mutate(header, body)`` and every checksum
    recomputed (``inr.store.pack_file``), so only the schema check can refuse it."""
    from inr import store

    raw = base["store"].read_bytes()
    _, _, hlen, _ = store.PREFIX.unpack_from(raw, 0)
    header = json.loads(raw[store.PREFIX.size : store.PREFIX.size + hlen])
    start = -(-(store.PREFIX.size + hlen) // store.ALIGN) * store.ALIGN
    body = bytearray(raw[start:])
    mutate(header, body)
    for e in header.get("arrays", []):
        e["crc32"] = zlib.crc32(body[e["offset"] : e["offset"] + e["nbytes"]]) & 0xFFFFFFFF
    out = tmp / "s.inr"
    out.write_bytes(store.pack_file(header, body))
    return out


def _drop_key(key: str):
    return lambda h, body: h.pop(key)


def _wrong_arch(h: dict, body: bytearray) -> None:
    h["arch"]["hidden"] += 3


def _short_labels(h: dict, body: bytearray) -> None:
    e = next(a for a in h["arrays"] if a["name"] == "labels")
    e["shape"] = [e["shape"][0] - 1]
    e["nbytes"] -= np.dtype(e["dtype"]).itemsize


def _fewer_layers(h: dict, body: bytearray) -> None:
    h["layers"] = h["layers"][:-1]


def _meta(**fields):
    return lambda h, body: h["meta"].update(fields)


def a_folder(base, tmp: Path) -> Path:
    (tmp / "dir.inr").mkdir()
    return tmp / "dir.inr"


def unverified_store(base, tmp: Path) -> Path:
    """The same weights saved directly with ``inr.store.save``: no ``meta["source"]``."""
    from inr.store import load, save

    st = load(base["store"])
    return save(tmp / "s.inr", st.arch, st.image_size, st.labels, st.quantized_layers(), psnr=st.psnr)


# ----------------------------------------------------------------------------- cases

@dataclass(frozen=True)
class Case:
    id: str
    build: Callable[[dict, Path], list[str]]  # (base, tmp_path) -> argv
    code: int
    message: str  # a substring of the one stderr line (exit 2) or of stdout (other codes)
    subprocess: bool = False  # run the CLI in a child process: a crash (SIGSEGV in a library) fails the case
    # (every such case in one child, ``child_runs``; one that crashes it fails, the rest run in a new one)
    # stderr lines a native library writes to the process's fd 2 itself (seen only in a child process),
    # left out before the one-line check: the CLI cannot intercept them
    library_lines: tuple[str, ...] = ()


def _compare(data: Path, store: Path | None, tmp: Path, *extra: str) -> list[str]:
    stores = ["--store", str(store)] if store is not None else []
    return ["compare", str(data), *stores, "--jpeg-qualities", "50", "90", "--out", str(tmp / "cmp"), *extra]


DALI_BATCH = ("--batch-size", "32")  # DALI 2.4 reports a bad file at batches of 4 to 16, and crashed at 32+


def _bench(pipeline: str, data: Path, tmp: Path, *extra: str) -> list[str]:
    return ["bench", "--pipeline", pipeline, "--data", str(data), *BENCH, "--out", str(tmp / "results"), *extra]


def _encode(data: Path, tmp: Path, *extra: str) -> list[str]:
    return ["encode", str(data), "--out", str(tmp / "new.inr"), "--iterations", "2", "--no-progress", *extra]


def _stored(mutate):
    def build(b, t):
        return _compare(b["data"], rewrite_store(b, t, mutate), t)
    return build


CASES = [
    # 4. identity: a store belongs to its images
    Case("compare-store-of-other-images", lambda b, t: _compare(other_images(b, t), _store(b, t), t), 2,
         "encoded from other images"),
    Case("bench-inr-store-of-other-images",
         lambda b, t: _bench("inr", other_images(b, t), t, "--store", str(_store(b, t))), 2,
         "encoded from other images"),
    Case("compare-unverified-store", lambda b, t: _compare(b["data"], unverified_store(b, t), t), 2,
         "records no source pixels hash"),
    Case("bench-inr-unverified-store",
         lambda b, t: _bench("inr", b["data"], t, "--store", str(unverified_store(b, t))), 2,
         "--allow-unverified-store"),
    Case("compare-unverified-store-allowed",
         lambda b, t: _compare(b["data"], unverified_store(b, t), t, "--allow-unverified-store"), 0, "wrote"),
    # 4. pixels.npy verified against the manifest
    Case("compare-damaged-pixels", lambda b, t: _compare(flip_pixel_byte(b, t), None, t), 2,
         "pixels.npy: checksum mismatch"),
    Case("bench-damaged-pixels", lambda b, t: _bench("raw", flip_pixel_byte(b, t), t), 2,
         "pixels.npy: checksum mismatch"),
    Case("encode-damaged-pixels", lambda b, t: _encode(flip_pixel_byte(b, t), t), 2, "pixels.npy: checksum mismatch"),
    # 4. a manifest with the right schema_version but the wrong shape
    *[Case(f"bench-manifest-{cid}", lambda b, t, e=edit: _bench("raw", edited_manifest(e)(b, t), t), 2, msg)
      for cid, edit, msg in [
          ("list", lambda m: [m], "manifest.json: manifest is a JSON list, expected an object"),
          ("no-image-size", lambda m: m.pop("image_size") and None, "manifest key 'image_size' is missing"),
          ("image-size-text", lambda m: m.update(image_size="16x16"), "manifest key 'image_size' is str"),
          ("no-classes", lambda m: m.pop("classes") and None, "manifest key 'classes' is missing"),
          ("splits-list", lambda m: m.update(splits=["train"]), "manifest key 'splits' is list"),
          ("no-count", lambda m: m["splits"]["train"].pop("count") and None,
           "manifest key 'splits.train.count' is missing"),
          ("count-text", lambda m: m["splits"]["train"].update(count="6"), "'splits.train.count' is str \"6\", expected an integer >= 0"),
      ]],
    Case("encode-manifest-splits-list",
         lambda b, t: _encode(edited_manifest(lambda m: m.update(splits=["train"]))(b, t), t), 2,
         "manifest key 'splits' is list"),
    Case("compare-manifest-no-classes",
         lambda b, t: _compare(edited_manifest(lambda m: m.pop("classes") and None)(b, t), None, t), 2,
         "manifest key 'classes' is missing"),
    # 5. store headers that pass their checksums but lie
    Case("store-header-missing-key", _stored(_drop_key("num_images")), 2, "header has no key 'num_images'"),
    Case("store-header-missing-arrays", _stored(_drop_key("arrays")), 2, "header has no key 'arrays'"),
    Case("store-header-wrong-arch", _stored(_wrong_arch), 2, "array 'codes0'"),
    Case("store-header-fewer-layers", _stored(_fewer_layers), 2, "'layers' lists"),
    Case("store-array-size-mismatch", _stored(_short_labels), 2, "array 'labels'"),
    # 11. a header may claim any image size: compare refuses it as bench does, before decoding (was an 80 GB decode)
    Case("compare-store-claims-huge-images", _stored(lambda h, body: h.update(image_size=[100000, 100000])), 2,
         "s.inr: store holds 6 images of 100000x100000, the split has 6 of 8x8"),
    Case("bench-inr-store-claims-huge-images",
         lambda b, t: _bench("inr", b["data"], t, "--store", str(rewrite_store(
             b, t, lambda h, body: h.update(image_size=[100000, 100000])))), 2,
         "s.inr: store holds 6 images of 100000x100000, the split has 6 of 8x8"),
    Case("inspect-meta-fit-not-an-object",
         lambda b, t: ["inspect", str(rewrite_store(b, t, _meta(fit="garbage")))], 2,
         "s.inr: store header meta 'fit' has an unexpected shape (\"garbage\")"),
    Case("inspect-meta-early-stop-wrong-types",
         lambda b, t: ["inspect", str(rewrite_store(b, t, _meta(early_stop={"recorded": True, "target_psnr": "x",
                                                                              "fit_iterations_mean": "y"})))], 2,
         "store header meta 'early_stop' has an unexpected shape"),
    Case("inspect-a-folder", lambda b, t: ["inspect", str(a_folder(b, t))], 2, "dir.inr: is a folder, not an INR store file"),
    # 5. devices
    Case("encode-cuda-7", lambda b, t: _encode(b["data"], t, "--device", "cuda:7"), 2, "--device cuda:7"),
    Case("bench-cuda-7", lambda b, t: _bench("raw", b["data"], t, "--device", "cuda:7"), 2, "--device cuda:7"),
    Case("bench-cuda-without-cuda-is-a-skip", lambda b, t: _bench("raw", b["data"], t, "--device", "cuda"), 0,
         "SKIP: unavailable"),
    Case("encode-device-bogus", lambda b, t: _encode(b["data"], t, "--device", "bogus"), 2, "not a device"),
    Case("bench-device-bogus", lambda b, t: _bench("raw", b["data"], t, "--device", "bogus"), 2, "not a device"),
    Case("perf-encode-cuda-7", lambda b, t: ["perf", "encode", "--synthetic", "--device", "cuda:7"], 2,
         "--device cuda:7"),
    # 5. labels, JPEGs
    Case("train-label-out-of-range", lambda b, t: _bench("raw", bad_label(b, t), t, "--mode", "train"), 2,
         "labels.npy: label 5 is outside the dataset's 2 classes"),
    Case("torch-jpeg-broken-jpeg", lambda b, t: _bench("torch-jpeg", broken_jpeg(b, t), t), 2,
         "000003.jpg: cannot decode JPEG"),
    Case("torch-jpeg-garbage-jpeg", lambda b, t: _bench("torch-jpeg", garbage_jpeg(b, t), t), 2,
         "000003.jpg: cannot decode JPEG (UnidentifiedImageError"),
    Case("torch-jpeg-truncated-jpeg", lambda b, t: _bench("torch-jpeg", truncated_jpeg(b, t), t), 2,
         "000003.jpg: cannot decode JPEG (OSError: image file is truncated"),
    Case("torch-jpeg-wrong-size-jpeg", lambda b, t: _bench("torch-jpeg", wrong_size_jpeg(b, t), t), 2,
         "000003.jpg: JPEG is 16x16, the prepared split is 8x8"),
    # Before the build-time check, DALI 2.4 died of SIGSEGV on the broken, garbage and headers-cut files
    # (exit 139, nothing written; at batches of 32 and more, as DALI_BATCH gives), wrote a dozen lines of
    # its decoder's errors on the truncated one, and trained on the wrong-size one. They run in a child
    # process (Case.subprocess), so a crash fails the case instead of pytest
    Case("dali-broken-jpeg", lambda b, t: _bench("dali", broken_jpeg(b, t), t, *DALI_BATCH), 2,
         "000003.jpg: no JPEG frame header (truncated, or not a JPEG)", subprocess=True),
    Case("dali-garbage-jpeg", lambda b, t: _bench("dali", garbage_jpeg(b, t), t, *DALI_BATCH), 2,
         "000003.jpg: no JPEG frame header (truncated, or not a JPEG)", subprocess=True),
    Case("dali-truncated-jpeg", lambda b, t: _bench("dali", truncated_jpeg(b, t), t, *DALI_BATCH), 2,
         "000003.jpg: truncated JPEG (no end-of-image marker)", subprocess=True),
    Case("dali-headers-cut-jpeg", lambda b, t: _bench("dali", headers_cut_jpeg(b, t), t, *DALI_BATCH), 2,
         "000003.jpg: damaged JPEG headers: no scan before the end of the file", subprocess=True),
    Case("dali-wrong-size-jpeg", lambda b, t: _bench("dali", wrong_size_jpeg(b, t), t, *DALI_BATCH), 2,
         "000003.jpg: JPEG is 16x16, the prepared split is 8x8", subprocess=True),
    # past the build-time check: DALI's own decode error, the file found and named (pipelines.dali.decode_error)
    Case("dali-bogus-huffman-jpeg", lambda b, t: _bench("dali", bogus_huffman_jpeg(b, t), t, *DALI_BATCH), 2,
         "000003.jpg: cannot decode JPEG (DALI: ", subprocess=True,
         library_lines=("Bogus Huffman table definition",)),  # libjpeg-turbo's own message, inside DALI
]


SUBPROCESS_CASES = [c for c in CASES if c.subprocess]


@pytest.fixture(scope="module")
def child_runs(base, tmp_path_factory) -> dict[str, tuple[Path, list[str], dict, tuple[int, str, str] | str]]:
    """Every ``Case.subprocess`` case built in a folder of its own and run in one child Python:
    id -> (its folder, argv, snapshot before, (exit code, stdout, stderr) or why the child died)."""
    if not SUBPROCESS_CASES:
        return {}
    if any(c.id.startswith("dali") for c in SUBPROCESS_CASES):
        pytest.importorskip("nvidia.dali", reason="DALI is not installed")
    top = tmp_path_factory.mktemp("children")
    built = {}
    for c in SUBPROCESS_CASES:
        t = top / c.id
        t.mkdir()
        argv = c.build(base, t)
        built[c.id] = (t, argv, snapshot(t))
    runs = run_children([argv for _, argv, _ in built.values()], top)
    return {cid: (*b, r) for (cid, b), r in zip(built.items(), runs, strict=True)}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input(case: Case, base, tmp_path, capsys, request):
    if case.id.startswith("dali"):
        pytest.importorskip("nvidia.dali", reason="DALI is not installed")
    if "cuda" in case.id:
        import torch

        if "cuda-7" in case.id and torch.cuda.device_count() > 7:
            pytest.skip("this machine has a cuda:7")
        if "without-cuda" in case.id and torch.cuda.is_available():
            pytest.skip("this machine has CUDA")
    if case.subprocess:
        tmp_path, argv, before, ran = request.getfixturevalue("child_runs")[case.id]
        if isinstance(ran, str):
            pytest.fail(ran)
        code, out, err = ran
        err = "".join(line for line in err.splitlines(keepends=True) if line.strip() not in case.library_lines)
    else:
        argv = case.build(base, tmp_path)
        before = snapshot(tmp_path)
        capsys.readouterr()
        code = main(argv)
        out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert code == case.code, (out, err)
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("inrbench: error: "), err
        assert case.message in lines[0], lines[0]
    else:
        assert case.message in out, out
    after = snapshot(tmp_path)
    for p, data in before.items():
        assert after.get(p) == data, f"{p} changed or vanished"
    if argv[0] == "bench" and (tmp_path / "results").is_dir():  # the error row's reason is one line too
        rows = (tmp_path / "results").glob("runs/*/rows.csv")
        for f in rows:
            import pandas as pd

            reasons = pd.read_csv(f)["reason"].dropna().astype(str)
            assert all("\n" not in r and "Traceback" not in r for r in reasons)
            assert code != 2 or any(case.message in r for r in reasons)


def test_unverified_store_library_api_is_explicit(base, tmp_path):
    """The library refuses an unverified store unless told, and says so."""
    from bench.datasets.identity import check_store_source
    from bench.datasets.prepared import open_prepared
    from bench.errors import InputError
    from inr.store import load

    ds = open_prepared(base["data"])
    assert check_store_source(load(base["store"]), ds, "train") is True
    st = load(unverified_store(base, tmp_path))
    with pytest.raises(InputError, match="records no source"):
        check_store_source(st, ds, "train")
    assert check_store_source(st, ds, "train", allow_unverified=True) is False


def test_limited_store_verifies_against_its_first_images(base, tmp_path, capsys):
    """An --limit encode is tied to the split's first N images: compare --limit N accepts it, and
    still accepts it when the dataset later differs after those N images."""
    data = _data(base, tmp_path)
    assert main(["encode", str(data), "--out", str(tmp_path / "l.inr"), "--iterations", "2", "--limit", "3",
                 "--no-progress"]) == 0
    src = json.loads(json.dumps(__import__("inr.store", fromlist=["load"]).load(tmp_path / "l.inr").meta["source"]))
    assert src["encoded_count"] == 3 and src["limit"] == 3
    px = np.load(data / "train" / "pixels.npy")
    px[4:] = 255 - px[4:]  # images after the first 3 change: the whole-split hash no longer matches
    np.save(data / "train" / "pixels.npy", px)
    _set_manifest_hash(data, "train", "pixels_sha256", px)
    capsys.readouterr()
    assert main(_compare(data, tmp_path / "l.inr", tmp_path, "--limit", "3")) == 0
    px[1] = 255 - px[1]  # now one of the encoded images differs
    np.save(data / "train" / "pixels.npy", px)
    _set_manifest_hash(data, "train", "pixels_sha256", px)
    assert main(_compare(data, tmp_path / "l.inr", tmp_path, "--limit", "3")) == 2
    assert "encoded from other images" in capsys.readouterr().err


def test_pixels_verified_once_per_process(base, monkeypatch):
    """Opening a split again does not rehash pixels.npy (cached by path, size, mtime)."""
    from bench.datasets import prepared

    calls = []
    real = prepared.sha256_array
    monkeypatch.setattr(prepared, "_VERIFIED", {})
    monkeypatch.setattr(prepared, "sha256_array", lambda a, *k: calls.append(1) or real(a, *k))
    ds = prepared.open_prepared(base["data"])
    ds.split("test")
    assert len(calls) == 2  # pixels and labels
    prepared.open_prepared(base["data"]).split("test")
    assert len(calls) == 2


def test_exception_reason_is_one_line():
    """A DataLoader worker's wrapped traceback becomes its last line plus where it was caught."""
    from bench.results import exception_reason

    wrapped = OSError("Caught OSError in DataLoader worker process 0.\nOriginal Traceback (most recent call "
                      "last):\n  File \"x.py\", line 1, in f\n    g()\nOSError: Truncated File Read\n")
    assert exception_reason(wrapped) == "OSError: Truncated File Read (Caught OSError in DataLoader worker process 0)"
    assert exception_reason(ValueError("a\n  b")) == "ValueError: a b"
    assert len(exception_reason(RuntimeError("x" * 5000))) <= 500
