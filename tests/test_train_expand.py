"""Network expansion (``bench.train.expand``) and the trainer registry (``bench.train.trainers``).

Growth preserves the function on a fixed batch (bound: max |diff| <= 1e-4 x max |logit|, the
floating-point summation order; exact in real arithmetic), parameters and FLOPs follow the schedule,
optimizer state of pre-existing parameters survives growth, a schedule that does not end at the
dense model is refused (exit 2, one line), and ``--method expand`` trains end to end. small-cnn
depth growth (Net2DeeperNet identity layers) preserves the eval-mode logits to 1e-5 relative.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from bench.train.backbones import create_backbone, num_parameters
from bench.train.expand import ExpandConfig, ExpandTrainer, Stage, check_schedule, subnet
from bench.train.loop import TrainConfig, Trainer
from bench.train.trainers import check_method, create_trainer, trainer_names
from pipelines.base import Batch
from tests.cli_helpers import assert_one_line_error, run_cli

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SCHEDULES = {  # backbone -> a schedule with width and (where there are residual stages) depth growth
    "resnet18-cifar": "0.25:1:1,0.5:1:1,0.75:2:1,1:2:1",
    "small-cnn": "0.5:-:1,0.75:-:1,1:-:1",
}
TOL = 1e-4


def _batch(n: int = 8, size: int = 16, seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    return Batch(images=torch.randn(n, 3, size, size, generator=g), labels=torch.randint(0, 10, (n,), generator=g))


def eval_logits(model: torch.nn.Module, images: torch.Tensor) -> torch.Tensor:
    """``model``'s logits ``[N, classes]`` on ``images [N, 3, H, W]``, in eval mode and without autograd."""
    model.eval()
    with torch.no_grad():
        return model(images)


def momentum_snapshot(tr: ExpandTrainer) -> tuple[dict[str, torch.nn.Parameter], dict[str, torch.Tensor]]:
    """Before a growth: the model's parameters by name, and a copy of each one's SGD momentum buffer."""
    params = dict(tr.model.named_parameters())
    return params, {n: tr.opt.state[p]["momentum_buffer"].clone() for n, p in params.items()}


def _trained_expand(backbone: str) -> ExpandTrainer:
    torch.manual_seed(0)
    tr = ExpandTrainer(create_backbone(backbone, 10), TrainConfig(lr=0.05), "cpu", 40, ExpandConfig.parse(SCHEDULES[backbone]))
    return tr


@pytest.mark.parametrize("backbone", sorted(SCHEDULES))
def test_growth_preserves_function_and_optimizer_state(backbone):
    tr = _trained_expand(backbone)
    fixed, b = _batch(seed=1), _batch()
    dense_params = num_parameters(create_backbone(backbone, 10))
    for stage in range(len(tr.expand.stages) - 1):
        for _ in range(2):  # train a little so the weights, BN statistics and momentum are not the init
            tr.step(b)
        before = eval_logits(tr.model, fixed.images)
        old, momentum = momentum_snapshot(tr)
        lr = tr.opt.param_groups[0]["lr"]
        tr.grow()
        assert tr.stage == stage + 1
        after = eval_logits(tr.model, fixed.images)
        bound = TOL * float(before.abs().max())
        assert float((after - before).abs().max()) <= bound, f"{backbone} growth {stage}->{stage + 1}"
        new = dict(tr.model.named_parameters())
        assert set(old) <= set(new)
        for n, m in momentum.items():  # momentum moved into the leading slice of the new tensor
            got = tr.opt.state[new[n]]["momentum_buffer"]
            assert got.shape == new[n].shape
            assert torch.equal(got[tuple(slice(0, k) for k in m.shape)], m), n
        assert {id(p) for p in tr.opt.param_groups[0]["params"]} == {id(p) for p in new.values()}
        assert tr.opt.param_groups[0]["lr"] == lr  # schedule kept
        tr.step(b)  # the grown model trains: every parameter gets a gradient
        assert all(p.grad is not None for p in tr.model.parameters())
    assert num_parameters(tr.model) == dense_params  # ends at the dense model


def test_params_and_flops_follow_the_schedule():
    """Per stage: parameters and forward FLOPs per image grow monotonically to the dense model's;
    FLOPs scale ~width^2 (x depth fraction for the blocks)."""
    tr = _trained_expand("resnet18-cifar")
    dense = Trainer(create_backbone("resnet18-cifar", 10), TrainConfig(), "cpu", 1)
    dense.step(_batch())
    dense_m = dict((k, v) for k, v, _ in dense.epoch_metrics())
    seen = []
    for stage in range(len(tr.expand.stages)):
        tr.step(_batch())
        m = dict((k, v) for k, v, _ in tr.epoch_metrics())
        s = tr.expand.stages[stage]
        assert m["expand_stage"] == stage and m["expand_width"] == s.width and m["expand_depth"] == s.depth
        assert m["model_params"] == num_parameters(subnet(create_backbone("resnet18-cifar", 10), s.width, s.depth))
        seen.append((m["model_params"], m["model_flops_per_image"]))
        tr.end_epoch()
        if stage < len(tr.expand.stages) - 1:
            tr.grow()
    assert seen == sorted(seen) and len(set(seen)) == len(seen)
    assert seen[-1] == (dense_m["model_params"], dense_m["model_flops_per_image"])
    # width 0.75 at full depth: FLOPs ~0.5625 of dense (the stem's 3 input channels do not scale)
    assert seen[2][1] / seen[-1][1] == pytest.approx(0.75**2, rel=0.02)


SMALL_CNN_DEPTH = ["1:1:1,1:2:1,1:4:1", "0.5:2:1,0.75:3:1,1:4:1", "0.25:1:1,1:-:1"]
DEPTH_TOL = 1e-5


@pytest.mark.parametrize("schedule", SMALL_CNN_DEPTH)
def test_small_cnn_depth_growth_preserves_the_eval_function(schedule):
    """Net2DeeperNet: inserted conv/BN/ReLU layers are the identity in eval mode (max |diff| <=
    1e-5 x max |logit| on a fixed batch); momentum of pre-existing parameters carries over; the
    last stage is exactly ``small_cnn`` (same parameter names and shapes)."""
    torch.manual_seed(0)
    tr = ExpandTrainer(create_backbone("small-cnn", 10), TrainConfig(lr=0.05), "cpu", 40, ExpandConfig.parse(schedule))
    fixed, b = _batch(seed=1), _batch()
    for stage in range(len(tr.expand.stages) - 1):
        for _ in range(3):
            tr.step(b)
        before = eval_logits(tr.model, fixed.images)
        old, momentum = momentum_snapshot(tr)
        tr.grow()
        after = eval_logits(tr.model, fixed.images)
        err = float((after - before).abs().max()) / float(before.abs().max())
        assert err <= DEPTH_TOL, f"{schedule}: growth {stage}->{stage + 1} relative error {err:.2e}"
        new = dict(tr.model.named_parameters())
        assert set(old) <= set(new)
        for n, m in momentum.items():
            got = tr.opt.state[new[n]]["momentum_buffer"]
            assert torch.equal(got[tuple(slice(0, k) for k in m.shape)], m), n
        assert {id(p) for p in tr.opt.param_groups[0]["params"]} == {id(p) for p in new.values()}
        tr.step(b)
        assert all(p.grad is not None for p in tr.model.parameters())
    dense = create_backbone("small-cnn", 10)
    assert {k: v.shape for k, v in tr.model.state_dict().items()} == {k: v.shape for k, v in dense.state_dict().items()}
    assert num_parameters(tr.model) == num_parameters(dense)


def test_small_cnn_depth_params_and_flops_follow_the_schedule():
    torch.manual_seed(0)
    cfg = ExpandConfig.parse("0.5:1:1,0.5:2:1,0.75:3:1,1:4:1")
    tr = ExpandTrainer(create_backbone("small-cnn", 10), TrainConfig(), "cpu", 40, cfg)
    dense = Trainer(create_backbone("small-cnn", 10), TrainConfig(), "cpu", 1)
    dense.step(_batch())
    dense_m = dict((k, v) for k, v, _ in dense.epoch_metrics())
    seen = []
    for stage, s in enumerate(cfg.stages):
        tr.step(_batch())
        m = dict((k, v) for k, v, _ in tr.epoch_metrics())
        assert m["expand_stage"] == stage and m["expand_depth"] == s.depth
        assert m["model_params"] == num_parameters(subnet(create_backbone("small-cnn", 10), s.width, s.depth))
        seen.append((m["model_params"], m["model_flops_per_image"]))
        tr.end_epoch()
        if stage < len(cfg.stages) - 1:
            tr.grow()
    assert seen == sorted(seen) and len(set(seen)) == len(seen)
    assert seen[-1] == (dense_m["model_params"], dense_m["model_flops_per_image"])


def test_growth_runs_at_the_first_step_after_a_stage_ends():
    tr = _trained_expand("small-cnn")
    tr.step(_batch())
    tr.end_epoch()  # stage 0 had 1 epoch: growth pending, not done yet
    assert tr.stage == 0
    tr.step(_batch())
    assert tr.stage == 1


def test_restart_lr_restarts_the_cosine():
    torch.manual_seed(0)
    cfg = ExpandConfig.parse("0.5:-:1,1:-:1", restart_lr=True)
    tr = ExpandTrainer(create_backbone("small-cnn", 10), TrainConfig(lr=0.1), "cpu", 4, cfg)
    for _ in range(2):
        tr.step(_batch())
    assert tr.opt.param_groups[0]["lr"] < 0.1
    tr.grow()
    assert tr.opt.param_groups[0]["lr"] == pytest.approx(0.1)


@pytest.mark.parametrize("text, backbone, fragment", [
    ("0.5:1:2,0.75:2:2", "resnet18-cifar", "must end at the dense model (width 1)"),
    ("0.5:1:2,1:1:2", "resnet18-cifar", "must end at the dense model (depth 2)"),
    ("0.5:2:2,1:1:2", "resnet18-cifar", "must not shrink"),
    ("0.5:5:2,1:-:2", "small-cnn", "small-cnn stage depth 5 is not in 1..4"),
    ("0.5:2:2,1:3:2", "small-cnn", "must end at the dense model (depth 4)"),
    ("0.5:3:2,1:2:2", "small-cnn", "must not shrink"),
    ("0.5:1", "small-cnn", "WIDTH:DEPTH:EPOCHS"),
])
def test_bad_schedules_are_refused(text, backbone, fragment):
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        check_schedule(ExpandConfig.parse(text), create_backbone(backbone, 10))


def test_registry_and_method_checks():
    assert trainer_names() == ["dense", "expand"]
    cfg = ExpandConfig(stages=(Stage(0.5, 1), Stage(1.0, 2)))
    check_method("expand", cfg, 3)
    with pytest.raises(ValueError, match="trains 3 epochs but the run trains 4"):
        check_method("expand", cfg, 4)
    with pytest.raises(ValueError, match="needs a ExpandConfig"):
        check_method("expand", None, 3)
    with pytest.raises(ValueError, match="unknown training method"):
        check_method("sparse", None, 3)
    assert isinstance(create_trainer("dense", create_backbone("small-cnn", 4), TrainConfig(), "cpu", 1), Trainer)


def synthetic16(tmp_path_factory, per_class: int):
    """A prepared ``synthetic`` dataset of 16 px images, 4 classes of ``per_class`` images; its folder."""
    from bench.datasets.config import PrepareConfig
    from bench.datasets.prepare import prepare_config

    out = tmp_path_factory.mktemp("syn") / "synthetic16"
    prepare_config(PrepareConfig(source="synthetic", size=16, num_classes=4, per_class=per_class), out)
    return out


def train_argv(backbone: str) -> list[str]:
    """``inrbench bench`` arguments of a tiny CPU train run of ``backbone`` (2 epochs, 1 repeat, 1 thread)."""
    return ["bench", "--pipeline", "raw", "--mode", "train", "--device", "cpu", "--backbone", backbone,
            "--crop", "random-pad", "--repeats", "1", "--warmup", "1", "--epochs", "2", "--batch-size", "16",
            "--workers", "0", "--threads", "1", "--min-seconds", "0"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return synthetic16(tmp_path_factory, per_class=16)


BASE = train_argv("small-cnn")


def test_cli_refuses_a_schedule_not_ending_dense(tiny, tmp_path, capsys):
    rc, _, err = run_cli(capsys, *BASE, "--data", tiny, "--method", "expand", "--schedule", "0.5:-:2,0.75:-:1",
                         "--out", tmp_path / "r")
    assert_one_line_error(rc, err, "must end at the dense model")
    rc, _, err = run_cli(capsys, *BASE, "--data", tiny, "--method", "expand", "--schedule", "0.5:-:1,1:-:1",
                         "--out", tmp_path / "r")
    assert_one_line_error(rc, err, "trains 2 epochs but the run trains 3")
    rc, _, err = run_cli(capsys, *BASE, "--data", tiny, "--method", "expand", "--schedule", "0.5:5:2,1:-:1",
                         "--out", tmp_path / "r")
    assert_one_line_error(rc, err, "small-cnn stage depth 5 is not in 1..4")


def test_small_cnn_depth_growth_trains_end_to_end_through_the_cli(tiny, tmp_path, capsys):
    from bench.results import read_results

    out = tmp_path / "res"
    rc, _, err = run_cli(capsys, *BASE, "--data", tiny, "--method", "expand", "--schedule", "0.5:2:1,0.75:3:1,1:4:1",
                         "--out", out)
    assert rc == 0, err
    ok = read_results(out).query("status == 'ok'")
    assert ok[ok.metric == "expand_depth"].sort_values("epoch")["value"].tolist() == [2, 3, 4]
    params = ok[ok.metric == "model_params"].sort_values("epoch")["value"].tolist()
    assert params[0] < params[1] < params[2] == num_parameters(create_backbone("small-cnn", 4))
    assert np.isfinite(ok[ok.metric == "model_flops_per_image"]["value"]).all()


def test_expand_trains_end_to_end_through_the_cli(tiny, tmp_path, capsys):
    from bench.results import read_results

    out = tmp_path / "res"
    rc, text, err = run_cli(capsys, *BASE, "--data", tiny, "--method", "expand", "--schedule", "0.5:-:2,1:-:1",
                            "--eval-every-epoch", "--out", out)
    assert rc == 0, err
    assert "test acc" in text
    df = read_results(out)
    ok = df[df.status == "ok"]
    stage = ok[ok.metric == "expand_stage"].sort_values("epoch")["value"].tolist()
    assert stage == [0, 0, 1]
    params = ok[ok.metric == "model_params"].sort_values("epoch")["value"].tolist()
    assert params[0] == params[1] < params[2] == num_parameters(create_backbone("small-cnn", 4))
    assert len(ok[ok.metric == "epoch_test_acc"]) == 3 and len(ok[ok.metric == "test_acc"]) == 1
    assert np.isfinite(ok[ok.metric == "model_flops_per_image"]["value"]).all()
    cfg = json.loads(next((out / "runs").glob("*/config.json")).read_text())
    assert cfg["method"] == "expand" and [s["width"] for s in cfg["expand"]["stages"]] == [0.5, 1.0]


def test_report_has_dense_vs_expand_table_and_time_to_accuracy(tiny, tmp_path):
    from bench.harness.runner import BenchConfig, run_bench
    from bench.report.build import build_report
    from bench.train.loop import TrainConfig as TC
    from pipelines.base import Augment, PipelineConfig

    pipe = PipelineConfig(batch_size=16, augment=Augment(crop="random-pad", size=16), device="cpu", workers=0)
    base = dict(pipeline="raw", data=str(tiny), mode="train", epochs=1, warmup=1, repeats=1, min_seconds=0.0,
                pipe=pipe, backbone="small-cnn", train=TC(lr=0.05), torch_threads=1, eval_every_epoch=True)
    out = tmp_path / "res"
    for _ in range(2):  # two runs of each method: the units of the speedup's interval
        assert run_bench(BenchConfig(**base), out).exit_code == 0
        assert run_bench(BenchConfig(**base, method="expand", expand=ExpandConfig.parse("0.5:-:1,1:-:1")),
                         out).exit_code == 0
    assert run_bench(BenchConfig(**{**base, "eval_every_epoch": False, "repeats": 1}), out).exit_code == 0
    rep = build_report(out, tmp_path / "rep")
    text = (rep / "README.md").read_text()
    assert "## Training method: dense vs expand" in text
    section = text.split("## Training method: dense vs expand")[1]
    assert "No CPU-s columns: every run here had warm-up epochs" in section  # not two columns of dashes
    assert "| CPU-s (median) |" not in section
    line = next(ln for ln in text.splitlines() if ln.startswith("| synthetic16 | raw | expand |"))
    assert "x [" in line or "no difference detected [" in line  # the speedup carries its interval
    dense_line = next(ln for ln in text.splitlines() if ln.startswith("| synthetic16 | raw | dense |"))
    assert dense_line.rstrip().endswith("| 2 x 1 |"), dense_line  # the pair's dense runs, not the plain one
    assert "vs dense" in text and (rep / "time_to_accuracy_synthetic16.png").is_file()
    # the pipeline sections see only the plain dense run (1 repeat), not the pairs' runs
    acc_line = next(ln for ln in text.split("## Accuracy")[1].splitlines() if ln.startswith("| synthetic16 | raw"))
    assert acc_line.rstrip().endswith("| 1 |"), acc_line
