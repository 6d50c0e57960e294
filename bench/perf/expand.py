"""`inrbench perf expand`: training time and test accuracy of ``expand`` vs ``dense`` on the same data,
``--repeats`` runs alternating order, on point estimates (one seed each; docs/training-methods.md)."""

from __future__ import annotations

import argparse
import math
import tempfile
from pathlib import Path

from bench import jsontext
from bench.argtypes import positive_float, positive_int
from bench.errors import InputError

HELP = "training time and accuracy of network expansion (--method expand) against dense, with intervals"
DEFAULT_SCHEDULE = "0.5:1:2,0.75:1:2,1:2:4"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--source", choices=("photos", "synthetic"), default="photos")
    p.add_argument("--per-class", type=positive_int, default=200, help="images per class (photos: crops per photo; default 200)")
    p.add_argument("--size", type=positive_int, default=16, help="image side (default 16)")
    p.add_argument("--backbone", default="resnet18-cifar")
    p.add_argument("--schedule", default=DEFAULT_SCHEDULE,
                   help=f"expand schedule WIDTH:DEPTH:EPOCHS,... (default {DEFAULT_SCHEDULE}); the dense run "
                        "trains as many epochs")
    p.add_argument("--restart-lr", action="store_true")
    p.add_argument("--repeats", type=positive_int, default=2, help="runs per method (default 2; >= 2 for an interval)")
    p.add_argument("--batch-size", type=positive_int, default=128)
    p.add_argument("--lr", type=positive_float, default=0.1)
    p.add_argument("--threads", type=positive_int, default=2, help="torch threads (default 2)")
    p.add_argument("--pipeline", default="raw", help="input pipeline of both methods (default raw)")
    p.add_argument("--out", help="results folder to keep (default: a temporary one)")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of tables")


def run(args: argparse.Namespace) -> int:
    from bench.train.expand import ExpandConfig

    try:
        expand = ExpandConfig.parse(args.schedule, restart_lr=args.restart_lr)
    except ValueError as e:
        raise InputError(f"bad schedule: {e}") from None
    with tempfile.TemporaryDirectory(prefix="perf-expand-") as tmp:
        out = Path(args.out) if args.out else Path(tmp) / "results"
        return _run(args, expand, Path(tmp), out)


def _run(args: argparse.Namespace, expand, tmp: Path, out: Path) -> int:
    from bench.datasets.prepare import prepare_dataset
    from bench.harness.runner import BenchConfig, run_bench
    from bench.report import methods as M
    from bench.report.load import load
    from bench.report.markdown import table
    from bench.train.loop import TrainConfig
    from pipelines.base import Augment, PipelineConfig

    kw = {"per_class": args.per_class} if args.source == "photos" else {"per_class": args.per_class, "num_classes": 10}
    data = prepare_dataset(args.source, tmp / f"{args.source}{args.size}", size=args.size, **kw)
    pipe = PipelineConfig(batch_size=args.batch_size, augment=Augment(crop="random-pad", size=args.size),
                          device="cpu", workers=0, seed=0)
    base = dict(pipeline=args.pipeline, data=str(data), mode="train", epochs=expand.epochs, warmup=0, repeats=1,
                min_seconds=0.0, pipe=pipe, backbone=args.backbone, train=TrainConfig(lr=args.lr),
                torch_threads=args.threads, eval_every_epoch=True)
    for r in range(args.repeats):
        order = [("dense", None), ("expand", expand)]
        for method, mcfg in (order if r % 2 == 0 else order[::-1]):
            o = run_bench(BenchConfig(**base, method=method, expand=mcfg), out)
            if o.exit_code != 0:
                print(f"{method} run {r} failed: {o.rows.rows()[-1].get('reason')}")
                return o.exit_code
    x = load(out)
    comp = M.comparison(x.rows, x.predictions)
    st = M.stages(x.rows)
    dense = comp[comp["method"] == "dense"].iloc[0]
    exp = comp[comp["method"] == "expand"].iloc[0]
    drop = 100 * (dense["acc"] - exp["acc"])
    met = bool(exp["speedup"] >= 1.3 and drop <= 1.0)
    mc = exp["mcnemar"]
    if args.json:
        print(jsontext.dumps({"comparison": M.fmt_comparison(comp, UNITS).to_dict("records"),
                          "stages": st.to_dict("records"), "speedup": exp["speedup"],
                          "speedup_ci": [exp["lo"], exp["hi"]],
                          "cpu_ratio": exp["cpu_ratio"], "cpu_ratio_ci": [exp["cpu_lo"], exp["cpu_hi"]], "accuracy_drop_points": drop,
                          "accuracy_drop_note": ACCURACY_NOTE, "accuracy_mcnemar_p": None if mc is None else mc.p_value,
                          "flops_rel": exp["flops_rel"], "goal_met": met, "goal_note": GOAL_NOTE}, default=str))
        return 0
    print(f"{args.backbone} on {args.source} {args.size}px ({args.per_class}/class), pipeline {args.pipeline}, "
          f"{expand.epochs} epochs, schedule {args.schedule}, {args.repeats} in-process run{'s' if args.repeats > 1 else ''} per method "
          f"(interleaved, one Python process: units are runs, not OS processes), {args.threads} threads")
    print(table(M.fmt_comparison(comp, UNITS), index=False))
    print(table(st, index=False))
    print(f"expand vs dense: total training time: {_ratio(exp['speedup'], exp['lo'], exp['hi'], 'shorter', exp.get('why'))} "
          f"(CPU seconds: {_ratio(exp['cpu_ratio'], exp['cpu_lo'], exp['cpu_hi'], 'fewer', exp.get('cpu_why'))}), "
          f"FLOPs per image {1 / exp['flops_rel']:.2f}x fewer (counted, no noise), test accuracy {-drop:+.1f} points "
          f"({ACCURACY_NOTE}; these two models on the same test images, McNemar: {_mcnemar(mc)}); goal (>= 1.3x "
          f"shorter, <= 1 point lower): the point estimates {'meet' if met else 'do not meet'} it ({GOAL_NOTE}; "
          "wall time on a shared machine moves with other jobs' load, CPU seconds much less)")
    return 0


UNITS = ("in-process run", "in-process runs")  # bench.report.methods.fmt_comparison: what a unit is here
ACCURACY_NOTE = ("one trained model per method, both from seed 0 (runs repeat the timing, not the training): "
                 "no interval over training randomness, not a result")
GOAL_NOTE = ("not a result: the accuracy drop is one model each, and the time ratio's interval is the one "
             "printed beside it")


def _ratio(value: float, lo: float, hi: float, what: str, why: str | None = None) -> str:
    """``1.42x shorter [95% CI 1.20-1.68]``, ``no difference detected [95% CI 0.99-1.08]``, or without an
    interval (one run a side, no spread: ``why``) the ratio said to be no result."""
    from bench import stats as S

    if not (math.isfinite(lo) and math.isfinite(hi)):
        reason = "no ratio" if not math.isfinite(value) else S.NO_SPREAD if why == S.NO_SPREAD else "one run a side"
        return f"{value:.2f}x {what} ({reason}: no interval, not a result)"
    iv = S.Interval(value, lo, hi, 2)
    text = S.fmt_ratio(iv)
    if not iv.excludes(1.0):
        return f"{S.NO_DIFFERENCE} [95% CI {text.split('[', 1)[1]}"
    head, span = text.split(" [", 1)
    return f"{head} {what} [95% CI {span}"


def _mcnemar(mc) -> str:
    from bench import stats as S

    if mc is None:
        return "not available"
    return (f"{S.NO_DIFFERENCE} (p={mc.p_value:.2g})" if not mc.significant()
            else f"{'better' if mc.only_a > mc.only_b else 'worse'} (p={mc.p_value:.2g})")
