"""Shared pieces of the SGD vision experiments (``cifar10``, ``svhn`` and the ablations in
``cifar.py``; ``robustness``; ``sharpness``): the paper's learning rates, the CPU-sized models,
one run per model (:func:`vision_run`), the ViT-small runs trained vanilla / with noise
augmentation / with the sensitivity regularizer (:func:`vit_runs`, shared by ``robustness`` and
``sharpness``), the CNN runs of ``robustness`` (:func:`cnn_runs`), and :func:`combine` (one
verdict from several parts).
"""

from __future__ import annotations

from typing import Any

from ...train.config import RunConfig, apply_overrides
from ..base import check_scale

PAPER = "Transformers Learn Low Sensitivity Functions (ICLR 2025)"
LR = {"vit_small": 0.1, "vit_simple": 0.2, "convmixer": 0.06, "resnet18": 0.001,
      "densenet121": 0.005}
#: token-wise noise std of the CIFAR-10/SVHN runs, by scale
SIGMA = {"paper": 0.1, "cpu": 0.5}
#: CPU-sized model overrides (paper scale uses each model's defaults)
SMALL: dict[str, list[str]] = {
    "vit_small": ["model.overrides.depth=4", "model.overrides.heads=4",
                  "model.overrides.dim_head=16", "model.overrides.mlp_dim=128"],
    "vit_simple": ["model.overrides.dim=64", "model.overrides.depth=4", "model.overrides.heads=4",
                   "model.overrides.dim_head=16", "model.overrides.mlp_dim=128"],
    "resnet18": ["model.overrides.width=0.25"],
    "densenet121": ["model.overrides.growth_rate=12", "model.overrides.blocks=[2, 4, 6, 4]"],
    "convmixer": ["model.overrides.dim=64", "model.overrides.depth=4"],
}
#: std of the Gaussian-noise augmentation (``robustness``/``sharpness``), on the [−1, 1] scale
AUGMENT_SIGMA = 0.2
REGULARIZED = {"noise": ["train.regularizer=noise", f"train.reg_sigma={AUGMENT_SIGMA}"],
               "patch_mse": ["train.regularizer=patch_mse", "train.reg_alpha=0.5",
                             "train.reg_sigma=1.0"]}
#: learning rate of the regularized run relative to vanilla's: (1 − α) = ½ halves the CE
#: gradient, so the step on CE is kept equal (the paper, too, set its own lr for it; value lost)
PATCH_MSE_LR_FACTOR = 2.0


def cpu_data() -> tuple[list[str], int]:
    """Data overrides and patch size of the CPU runs: always Fashion-MNIST (where its files are
    is decided when the experiment runs, by the data package's rule; missing files are an
    error, never a silent switch to another dataset)."""
    return ["data.name=fashion_mnist"], 7


def _cpu_run(name: str, model: str, lr: float, extra: list[str]) -> RunConfig:
    data, patch = cpu_data()
    cfg = RunConfig(name=name, label=name)
    cfg.model.name = model
    common = data + ["data.train_subset=3000", "train.batch_size=100", "train.epochs=20",
                     "train.target_train_acc=0.85", f"optim.lr={lr}", "track.sigma=1.0",
                     "track.num_examples=300", "track.eval_examples=1000"]
    return apply_overrides(cfg, common + extra + (
        [f"train.reg_patch={patch}"] if any("patch_mse" in e for e in extra) else []))


def vit_runs(scale: str) -> list[RunConfig]:
    """ViT-small trained vanilla, with noise augmentation and with the MSE regularizer (shared
    with the sharpness experiment)."""
    if scale == "paper":
        extra: dict[str, list[str]] = {"vit_small": [], **{
            f"vit_small-{k}": v + ["train.reg_patch=4", f"optim.lr={0.1 * PATCH_MSE_LR_FACTOR}"]
            * (k == "patch_mse") for k, v in REGULARIZED.items()}}
        return [vision_run(n, "vit_small", scale, extra=e) for n, e in extra.items()]
    _, patch = cpu_data()
    small = ["model.overrides.depth=4", "model.overrides.heads=4", "model.overrides.dim_head=16",
             "model.overrides.mlp_dim=128", f"model.overrides.patch_size={patch}"]
    lr = {"noise": 0.1, "patch_mse": 0.1 * PATCH_MSE_LR_FACTOR}
    return [_cpu_run("vit_small", "vit_small", 0.1, small)] + [
        _cpu_run(f"vit_small-{k}", "vit_small", lr[k], small + v) for k, v in REGULARIZED.items()]


def cnn_runs(scale: str) -> list[RunConfig]:
    if scale == "paper":
        return [vision_run(m, m, scale) for m in ("vit_simple", "resnet18", "densenet121")]
    _, patch = cpu_data()
    return [_cpu_run("cnn", "cnn", 0.05, [f"model.overrides.sens_patch={patch}",
                                          "model.overrides.channels=[16, 32]",
                                          "model.overrides.hidden=64"])]


def vision_run(name: str, model: str, scale: str, data: str = "cifar10", label: str = "",
               extra: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """One SGD run of ``model`` with the paper's learning rate, at ``scale`` ("cpu"/"paper")."""
    check_scale(scale)
    common = [f"data.name={data}", "train.batch_size=100", f"optim.lr={LR[model]}",
              f"track.sigma={SIGMA[scale]}"]
    if scale == "paper":
        common += ["train.epochs=100", "track.repeats=5", "track.num_examples=5000"]
    else:
        common += ["data.train_subset=5000", "train.epochs=20", "train.target_train_acc=0.9",
                   "track.num_examples=500", "track.eval_examples=2000"] + SMALL[model]
    cfg = RunConfig(name=name, label=label or name)
    cfg.model.name = model
    return apply_overrides(cfg, common + list(extra))


def combine(parts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One verdict from several: the worst of them ("not comparable" beats "does not hold")."""
    order = ["not comparable", "does not hold", "holds"]
    worst = min((p["verdict"] for p in parts.values()), key=order.index)
    reason = " | ".join(f"{k}: {p['verdict']} ({p['reason']})" for k, p in parts.items())
    return {"verdict": worst, "reason": reason,
            "evidence": {k: p["evidence"] for k, p in parts.items()}}
