"""`inrbench inspect FILE`: what an INR store holds and what it costs."""

from __future__ import annotations

import argparse
import json

from bench.errors import InputError

HELP = "show an INR store: architecture, bit widths, pruning, bytes/image, % of raw RGB, PSNR summary"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="an INR store written by `inrbench encode`")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")


def summary(path: str) -> dict:
    """Everything ``inspect`` prints, as a dict (the file is fully verified first)."""
    import numpy as np

    from inr.store import load

    st = load(path, "cpu")
    shapes = st.arch.shapes
    kept = [1.0 if ql.mask is None or not st.num_images
            else float(np.unpackbits(ql.mask.numpy(), axis=1, bitorder="little")[:, : i * o].mean())
            for ql, (i, o) in zip(st._layers, shapes, strict=True)]
    p = None if st.psnr is None or not st.num_images else st.psnr.astype(np.float64)
    disk_bpp = _bpp(st, st.bytes_on_disk)
    return {
        "file": str(st.path),
        "format_version": st.header["format_version"],
        "arch": st.arch.to_dict(),
        "params_per_image": st.arch.params_per_image,
        "image_size": list(st.image_size),
        "image_sizes": None if st.image_sizes is None else st.image_sizes.tolist(),  # native sizes: [H, W] each
        "num_images": st.num_images,
        "bits": list(st.bits),
        "per_channel": st.per_channel,
        "pruned_fraction_of_weights": 1.0 - sum(k * i * o for k, (i, o) in zip(kept, shapes, strict=True))
                                      / sum(i * o for i, o in shapes),
        "kept_fraction_per_layer": kept,
        "bytes_on_disk": st.bytes_on_disk,
        "bytes_per_image": st.bytes_per_image,
        "bits_per_pixel": disk_bpp,  # native sizes: the mean of the images' bpp
        "raw_rgb_bytes_per_image": st.raw_bytes_per_image,
        "percent_of_raw_rgb": 100.0 * st.bytes_per_image / st.raw_bytes_per_image,
        "resident_bytes": st.resident_bytes(),
        # the file (packed with --at-rest) vs the store layout vs device-resident bytes
        "at_rest": st.at_rest,
        "store_bytes": st.store_bytes,
        "disk_bits_per_pixel": disk_bpp,
        "resident_bits_per_pixel": _bpp(st, st.resident_bytes()),
        "psnr_db": None if p is None else {"mean": float(p.mean()), "min": float(p.min()), "p5": float(np.percentile(p, 5)),
                                          "median": float(np.median(p)), "max": float(p.max())},
        "meta": st.meta,
    }


def _bpp(st, total_bytes: float) -> float:
    """``total_bytes`` over all images as bits per pixel (native sizes: the mean of per-image bpp)."""
    per = total_bytes / max(1, st.num_images)
    if st.image_sizes is None:
        return per * 8 / (st.image_size[0] * st.image_size[1])
    return float((per * 8 / st.image_sizes.prod(axis=1)).mean())


def run(args: argparse.Namespace) -> int:
    s = summary(args.file)
    if args.json:
        print(json.dumps(s, indent=2, sort_keys=True))
        return 0
    meta_lines = _meta_lines(s["meta"], s["file"])  # checked before anything is printed
    a = s["arch"]
    print(f"{s['file']}  (INR store format v{s['format_version']})")
    print(f"  architecture   SIREN {a['layers']}x{a['hidden']}  w0_first={a['w0_first']:g} w0={a['w0']:g}  {s['params_per_image']} params/image")
    if s["image_sizes"]:
        px = sorted({tuple(x) for x in s["image_sizes"]}, key=lambda x: x[0] * x[1])
        print(f"  images         {s['num_images']} of native sizes ({len(px)} distinct, {px[0][0]}x{px[0][1]} .. "
              f"{px[-1][0]}x{px[-1][1]}; bpp and raw RGB below are means over images)")
    else:
        print(f"  images         {s['num_images']} of {s['image_size'][0]}x{s['image_size'][1]}")
    print(f"  bits / layer   {s['bits']}  ({'per-channel' if s['per_channel'] else 'per-layer'} scales; 32 = float32)")
    print(f"  pruned         {100 * s['pruned_fraction_of_weights']:.1f}% of weights  (kept per layer: {', '.join(f'{k:.2f}' for k in s['kept_fraction_per_layer'])})")
    print(f"  bytes/image    {s['bytes_per_image']:.1f}  ({s['bits_per_pixel']:.2f} bpp, {s['percent_of_raw_rgb']:.1f}% of raw RGB {s['raw_rgb_bytes_per_image']:.0f} B); file {s['bytes_on_disk']} B, resident {s['resident_bytes']} B")
    if s["at_rest"]:
        n = max(1, s["num_images"])
        print(f"  at rest        packed ({s['at_rest']['codec']}): disk {s['bytes_on_disk'] / n:.1f} B/image "
              f"({s['disk_bits_per_pixel']:.2f} bpp) vs store layout {s['store_bytes'] / n:.1f} B/image; resident "
              f"{s['resident_bytes'] / n:.1f} B/image ({s['resident_bits_per_pixel']:.2f} bpp), decoded once at load")
    p = s["psnr_db"]
    if p:
        print(f"  PSNR dB        mean {p['mean']:.2f}  min {p['min']:.2f}  p5 {p['p5']:.2f}  median {p['median']:.2f}  max {p['max']:.2f}")
    else:
        print("  PSNR dB        not recorded")
    for line in meta_lines:
        print(line)
    return 0


def _fit_lines(fit: dict) -> list[str]:
    sub = f", each step on {fit['pixel_fraction']:g} of the pixels" if fit.get("pixel_fraction", 1.0) < 1 else ""
    return [f"  fit            {fit.get('iterations')} iterations, lr {fit.get('lr')}, seed {fit.get('seed')}{sub}"]


def _early_stop_lines(es: dict) -> list[str]:
    got = (f"{es['fit_iterations_mean']:.0f} iterations per image on average, {es['stopped_early']} of "
           f"{es['images']} images stopped early" if es.get("recorded") else "iterations not recorded (cached fit)")
    return [f"  early stop     at {es['target_psnr']:g} dB: {got}"]


def _init_lines(init: dict) -> list[str]:
    sel = init.get("selection")
    n, split = init.get("num_images"), init.get("split")
    if sel and isinstance(n, int):  # meta-init --candidates: the validation images were not meta-trained on
        images = (f"meta-trained on {n - sel['validation_images']} {split} images, {sel['validation_images']} "
                  "more held out to choose the seed")
    elif n is not None:
        images = f"meta-trained on {n} {split} images"
    else:
        images = "its training images not recorded"
    lines = [f"  init           learned ({init.get('method', '?')}, {images}): sha256 {init.get('sha256')}"]
    if sel:
        lines.append(f"                 best of {sel['candidates']} seeds (kept seed {sel['chosen_seed']}: "
                     f"{sel['validation_saving']:.2f}x fewer iterations on {sel['validation_images']} validation "
                     "train images)")
    return lines


def _meta_lines(meta, path: str) -> list[str]:
    """The text lines of the header's ``meta`` (fit, early stop, learned init); a field of the wrong
    shape (a crafted header whose checksums are right) is an ``InputError`` naming it."""
    if not isinstance(meta, dict):
        raise InputError(f"store header 'meta' is {type(meta).__name__}, expected an object", path)
    lines = []
    for key, render in (("fit", _fit_lines), ("early_stop", _early_stop_lines), ("init", _init_lines)):
        value = meta.get(key)
        if not value:
            continue
        try:
            lines += render(value)
        except (AttributeError, KeyError, TypeError, ValueError, IndexError):
            raise InputError(f"store header meta {key!r} has an unexpected shape ({json.dumps(value)[:60]}); "
                             "inspect --json shows the header as stored", path) from None
    return lines
