"""Shared pieces of the SGD vision experiments (``cifar10``, ``svhn`` and the ablations in
``cifar.py``; ``robustness``; ``sharpness``): the paper's learning rates, the CPU-sized models,
the settings of both scales (:class:`VisionSettings`; :class:`RegularizedSettings` for the
Fashion-MNIST/CIFAR-10 runs of ``robustness`` and ``sharpness``), the runs of a set of models
(:func:`vision_runs`), and the ViT-small runs trained vanilla / with noise augmentation / with
the sensitivity regularizer (:func:`vit_runs`, shared by ``robustness`` and ``sharpness``).
Every one of these experiments compares models, so both scales train 3 seeds per run.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...train.config import ranged
from ..base import Run, Rung, Settings, fit_runs

PAPER = "Transformers Learn Low Sensitivity Functions (ICLR 2025)"
LR = {"vit_small": 0.1, "vit_simple": 0.2, "convmixer": 0.06, "resnet18": 0.001,
      "densenet121": 0.005}
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
#: ViT-small's own patch size on 32×32 images (the regularizer's patch when ``patch`` is unset)
VIT_PATCH = 4


@dataclass
class VisionSettings(Settings):
    """What differs between the scales of the SGD vision runs (defaults: the paper scale).

    ``small``: the CPU-sized models (:data:`SMALL`); ``sigma``: the tracked sensitivity's noise
    std; ``epochs``: at most; ``train_subset``: seeded training images (None: all); ``target``:
    stop at this train accuracy (None: train every epoch); ``track_examples`` × ``repeats``:
    the tracking subset and noise draws per token; ``eval_examples``: accuracy on this many
    images (None: all); ``seeds``: 3 (the models are compared seed by seed)."""

    seeds: int = ranged(3, ge=1)
    small: bool = False
    sigma: float = ranged(0.1, ge=0)
    epochs: int = ranged(100, ge=1)
    train_subset: int | None = ranged(None, ge=1)
    target: float | None = ranged(None, ge=0, le=1)
    track_examples: int = ranged(5000, ge=1)
    repeats: int = ranged(5, ge=1)
    eval_examples: int | None = ranged(None, ge=1)


#: the CPU scale of the CIFAR-10/SVHN runs (the paper scale is :class:`VisionSettings`' defaults)
CPU = {"small": True, "sigma": 0.5, "epochs": 20, "train_subset": 5000, "target": 0.9,
       "track_examples": 500, "repeats": 1, "eval_examples": 2000}


@dataclass
class RegularizedSettings(VisionSettings):
    """:class:`VisionSettings` of ``robustness`` and ``sharpness``: ``dataset`` (the CPU scale
    trains on Fashion-MNIST), ``patch``: the ViT's patch size and the regularizer's (None:
    ViT-small's own, 4)."""

    dataset: str = "cifar10"
    patch: int | None = ranged(None, ge=1)


#: the CPU scale of ``robustness`` and ``sharpness`` (paper: :class:`RegularizedSettings`'
#: defaults). Always Fashion-MNIST: where its files are is decided when the experiment runs, by
#: the data package's rule; missing files are an error, never a silent switch to another dataset.
CPU_FASHION = {"small": True, "sigma": 1.0, "epochs": 20, "train_subset": 3000, "target": 0.85,
               "track_examples": 300, "repeats": 1, "eval_examples": 1000,
               "dataset": "fashion_mnist", "patch": 7}


def vision_runs(models: dict[str, tuple[str, list[str]]], s: VisionSettings,
                data: str = "cifar10") -> list[Run]:
    """SGD runs (batch 100) of ``{run name: (model, extra overrides)}`` at settings ``s``: the
    model's learning rate from :data:`LR` (unless ``extra`` sets one), its CPU size with
    ``s.small``; ``s.seeds`` replicates."""
    common = [f"data.name={data}", "train.batch_size=100", f"track.sigma={s.sigma}",
              f"train.epochs={s.epochs}", f"track.repeats={s.repeats}",
              f"track.num_examples={s.track_examples}"]
    common += [f"{key}={value}" for key, value in (
        ("data.train_subset", s.train_subset), ("train.target_train_acc", s.target),
        ("track.eval_examples", s.eval_examples)) if value is not None]
    return fit_runs({name: [f"model.name={m}", *([f"optim.lr={LR[m]}"] if m in LR else []),
                            *(SMALL.get(m, []) if s.small else []), *extra]
                     for name, (m, extra) in models.items()}, common, s.seeds)


def vit_runs(s: RegularizedSettings) -> list[Run]:
    """ViT-small trained vanilla, with noise augmentation and with the MSE regularizer (shared
    with the sharpness experiment)."""
    patch = [f"model.overrides.patch_size={s.patch}"] if s.patch else []
    mse = [f"train.reg_patch={s.patch or VIT_PATCH}",
           f"optim.lr={LR['vit_small'] * PATCH_MSE_LR_FACTOR}"]
    models = {"vit_small": ("vit_small", patch), **{
        f"vit_small-{k}": ("vit_small", patch + v + (mse if k == "patch_mse" else []))
        for k, v in REGULARIZED.items()}}
    return vision_runs(models, s, data=s.dataset)


#: the scale ladder of ``robustness`` and ``sharpness`` (the same rung names and overrides, so
#: a sharpness rung reuses the ViT runs of the robustness rung of the same name)
REGULARIZED_LADDER = (
    Rung("cpu", "cpu", size=20, note="stop at 85% train accuracy, at most 20 epochs"),
    Rung("longer", "cpu", ("epochs=40",), size=40,
         note="the same target, at most 40 epochs: every run reaches it"),
    Rung("plateau", "cpu", ("target=0.9", "epochs=60"), size=60,
         note="stop at 90% train accuracy, at most 60 epochs"),
    Rung("paper", "paper", size=100, cpu=False,
         note="the paper scale: CIFAR-10 / CIFAR-10-C, full models, 100 epochs"),
)
