"""Low sensitivity and robustness to common corruptions (main paper §7.1;
docs/definitions.md#robustness).

Paper: "Transformers Learn Low Sensitivity Functions" (ICLR 2025), §7.1, Fig. 9, Figs. 20–21.
Claims: (a) ViTs are more accurate than CNNs on most corruptions; (b) training ViT-small with
Gaussian-noise augmentation (``train.regularizer=noise``) or with the sensitivity regularizer
(``train.regularizer=patch_mse``: loss = ½·CE + ½·MSE(f(x̃), f(x)), x̃ = x with N(0, 1) noise in
one random patch, paper code) lowers its sensitivity and raises its accuracy on the noise and
blur corruptions, compared with vanilla training.

Command: ``senslab run robustness --out runs/robustness`` (``--scale paper`` for CIFAR-10/-C).

Every run is trained with :func:`senslab.train.loop.fit` (SGD, batch 100) until a common train
accuracy, so the comparison is at comparable fit; the final model is then evaluated on the clean
test images and on every corruption × severity 1–5. Verdict: (a) every ViT beats every CNN on
more than half of the corruptions (accuracy averaged over severities); (b) for each regularized
model, at train accuracies within 0.03 of vanilla's: the final model's sensitivity below
vanilla's, and its accuracy on the noise + blur corruptions above vanilla's, each by more than
2 s.e. of paired differences. Sensitivity is measured once more on the final models, on more
training images than tracked (1,000 at CPU scale, a superset of the tracking subset, 2 noise
draws per patch) with the same noise seed for every model, and compared image by image; the
accuracy pairs are test images (each image's mean correctness over the corrupted copies).

Scales: ``paper`` — CIFAR-10, ViT-small / ViT-simple vs ResNet-18 / DenseNet-121 (part a) and
ViT-small vanilla / noise / patch_mse (part b), 100 epochs, σ = 0.1, CIFAR-10-C (19 corruptions,
all 10,000 test images; files in ``$SENSLAB_DATA/cifar10c/CIFAR-10-C``, checked before any
training). ``cpu`` — Fashion-MNIST, a 3,000-image training subset, a small ViT-small (patch 7,
depth 4, 4 heads) and the small 3-layer CNN, all stopped at 85% train accuracy (≤ 20 epochs), σ = 1
on 300 training images, and our own corruptions (``data/corruptions.py``: 4 noise, 3 blur, 4
digital, severities 1–5) on 1,000 test images. Augmentation noise std 0.2 on the [−1, 1] scale
(ours: the paper's variance was lost; it is the strongest CIFAR-10-C Gaussian noise on that scale);
CNN lr 0.05 instead of the paper's 0.005 so that it reaches the common train accuracy within the
budget; regularized ViT lr 0.2 (vanilla 0.1): its loss weighs CE by ½, so with lr 0.1 it fell far
behind vanilla's train accuracy.

Data: found by the one rule of :mod:`senslab.data._roots` — ``--set data.root=DIR``, else
``$SENSLAB_DATA/<name>`` (``~/.cache/senslab/data/<name>`` without ``SENSLAB_DATA``) — and
recorded in each run's config.json. Fashion-MNIST missing is an error before any training that
names the files, the places looked in and the fixes; there is no fallback to another dataset.

The trained ViT-small runs are shared with ``sharpness`` (it copies them when it finds
``runs/robustness/<run>`` trained with the same configuration).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ...data import ArrayDataset, create_dataset, locate
from ...data.corruptions import corrupt, list_corruptions
from ...data.images import CIFAR10C_CORRUPTIONS, denormalize
from ...measure import token_sensitivity
from ...tokens.base import model_device
from ...train.config import RunConfig, ranged
from ..base import Run, register_experiment
from ._posthoc import FinalMeasureExperiment
from ._vision import (
    CPU_FASHION,
    PAPER,
    RegularizedSettings,
    combine,
    vision_runs,
    vit_runs,
)

NOISE_BLUR_CIFAR10C = ("gaussian_noise", "shot_noise", "impulse_noise", "speckle_noise",
                       "defocus_blur", "glass_blur", "motion_blur", "zoom_blur", "gaussian_blur")
#: noise draws per token of the final-model sensitivity
SENS_REPEATS = 2
#: the CPU scale's CNN: the small 3-layer CNN, lr 0.05 (paper: 0.005, too slow for the budget)
CPU_CNN = ["optim.lr=0.05", "model.overrides.channels=[16, 32]", "model.overrides.hidden=64"]


@dataclass
class RobustnessSettings(RegularizedSettings):
    """:class:`~._vision.RegularizedSettings` and: ``others``: the models part (a) compares the
    ViTs with (``cnn``: :data:`CPU_CNN`); ``test_images``: clean/corrupted test images (None:
    all); ``sens_examples``: training images of the final-model sensitivity (a superset of the
    tracking subset)."""

    others: tuple[str, ...] = ("vit_simple", "resnet18", "densenet121")
    test_images: int | None = ranged(None, ge=1)
    sens_examples: int = ranged(5000, ge=1)


@torch.no_grad()
def correct(model: nn.Module, x: Tensor, y: Tensor, batch: int = 500) -> Tensor:
    """Per-example correctness (bool, on the CPU) of ``model`` in eval mode; batches go to the
    model's device."""
    model.eval()
    dev = model_device(model) or x.device
    return torch.cat([(model(x[i:i + batch].to(dev)).argmax(1) == y[i:i + batch].to(dev)).cpu()
                      for i in range(0, len(y), batch)])


def corrupted_sets(cfg: RunConfig, test: ArrayDataset, n: int | None):
    """Yield (corruption, family, severity, inputs, targets): CIFAR-10-C for CIFAR-10 runs, our
    own corruptions of the first ``n`` test images (seeded) otherwise."""
    if cfg.data.name == "cifar10":
        for c in CIFAR10C_CORRUPTIONS:
            family = "noise/blur" if c in NOISE_BLUR_CIFAR10C else "other"
            for sev in range(1, 6):
                ds = create_dataset("cifar10c", "test", corruption=c, severity=sev,
                                    normalize=test.meta["normalize"])
                yield c, family, sev, ds.inputs[:n], ds.targets[:n]
        return
    x, y = test.batch(slice(0, n))
    clean = denormalize(x, test.meta).clamp(0, 1)
    c_ = len(test.meta["mean"])
    mean = torch.tensor(test.meta["mean"]).view(1, c_, 1, 1)
    std = torch.tensor(test.meta["std"]).view(1, c_, 1, 1)
    blur_noise = set(list_corruptions("noise")) | set(list_corruptions("blur"))
    for c in list_corruptions():
        for sev in range(1, 6):
            xc = corrupt(clean, c, sev, torch.Generator().manual_seed(1000 * sev + cfg.seed))
            yield c, "noise/blur" if c in blur_noise else "other", sev, (xc - mean) / std, y


@register_experiment("robustness")
class Robustness(FinalMeasureExperiment):
    paper = f"{PAPER}, §7.1 Fig. 9"
    claim = ("(a) ViTs are more accurate than CNNs on most corruptions; (b) noise augmentation "
             "and the sensitivity regularizer lower ViT-small's sensitivity and raise its "
             "accuracy on noise and blur corruptions.")
    cpu_scale_note = ("Fashion-MNIST instead of CIFAR-10(-C): 3,000 training images, small "
                      "ViT-small (patch 7, depth 4) vs the small CNN, all to 85% train accuracy; "
                      "11 locally generated corruptions × 5 severities on 1,000 test images; "
                      "augmentation std 0.2, regularizer std 1, α 0.5")
    requires = ("paper scale: CIFAR-10 in data.root and CIFAR-10-C in "
                "$SENSLAB_DATA/cifar10c/CIFAR-10-C; cpu scale: Fashion-MNIST's idx files in "
                "$SENSLAB_DATA/fashion_mnist or --set data.root=DIR")

    scales = {"cpu": RobustnessSettings(**CPU_FASHION, others=("cnn",), test_images=1000,
                                        sens_examples=1000),
              "paper": RobustnessSettings()}

    def runs(self, s: RobustnessSettings) -> list[Run]:
        others = {m: (m, CPU_CNN + [f"model.overrides.sens_patch={s.patch}"] if m == "cnn"
                      else []) for m in s.others}
        return vit_runs(s) + vision_runs(others, s, data=s.dataset)

    def before_training(self, s: RobustnessSettings) -> None:
        if s.dataset == "cifar10":  # CIFAR-10-C is read after training: find it before
            locate("cifar10c")

    def final_settings(self, s: RobustnessSettings) -> dict[str, Any]:
        return {"test_images": s.test_images, "sens_examples": s.sens_examples,
                "sens_repeats": SENS_REPEATS}

    def measure_final(self, cfg: RunConfig, model: nn.Module, train: ArrayDataset,
                      test: ArrayDataset, s: RobustnessSettings) -> dict[str, Any]:
        n = s.test_images
        x, y = test.batch(slice(0, n))
        acc: dict[str, list[float]] = {}
        per_image = torch.zeros(len(y), dtype=torch.float64)
        count = 0
        for c, family, _, xc, yc in corrupted_sets(cfg, test, n):
            ok = correct(model, xc, yc)
            acc.setdefault(c, []).append(float(ok.float().mean()))
            if family == "noise/blur":
                per_image += ok.double()
                count += 1
        # same images (the Tracker's generator, so its subset comes first) and the same noise
        # seed for every model: the verdict compares per-image flip rates in pairs
        g = torch.Generator().manual_seed(cfg.seed + 1)
        data = train.first(min(s.sens_examples, len(train)), generator=g)
        data = data.to(model_device(model) or "cpu")
        r = token_sensitivity(model, data.inputs, sigma=cfg.track.sigma, repeats=SENS_REPEATS,
                              generator=cfg.seed, chunk_size=256)
        return {"clean_acc": float(correct(model, x, y).float().mean()), "corrupted_acc": acc,
                "noise_blur_per_image": (per_image / max(count, 1)).tolist(),
                "sensitivity": {"estimate": r.estimate, "stderr": r.stderr,
                                "per_sample": r.per_sample.tolist()}}

    def verdict(self, summaries: list[dict[str, Any]]) -> dict[str, Any]:
        by = {s["label"]: s for s in summaries}
        mean_acc = {k: {c: sum(v) / len(v) for c, v in s["final_measure"]["corrupted_acc"].items()}
                    for k, s in by.items()}
        vits = [k for k in by if k in ("vit_small", "vit_simple")]
        cnns = [k for k in by if not k.startswith("vit")]
        parts: dict[str, dict[str, Any]] = {}
        wins = {}
        for v in vits:
            for c in cnns:
                won = sum(mean_acc[v][k] > mean_acc[c][k] for k in mean_acc[v])
                wins[f"{v} vs {c}"] = (won, len(mean_acc[v]))
        ok = all(w > n / 2 for w, n in wins.values())
        parts["a"] = {"verdict": "holds" if ok else "does not hold",
                      "reason": ", ".join(f"{k}: ViT better on {w}/{n}"
                                          for k, (w, n) in wins.items()),
                      "evidence": {"mean_acc_over_severities": mean_acc,
                                   "clean_acc": {k: s["final_measure"]["clean_acc"]
                                                 for k, s in by.items()}}}
        for reg in [k for k in by if k.startswith("vit_small-")]:
            parts[reg] = regularized_part(by[reg], by["vit_small"])
        return combine(parts)


def paired(a: list[float], b: list[float]) -> tuple[float, float]:
    """Mean of a − b and its standard error, the pairs being the sampling unit."""
    d = torch.tensor(a, dtype=torch.float64) - torch.tensor(b, dtype=torch.float64)
    return float(d.mean()), float(d.std() / math.sqrt(len(d)))


def regularized_part(reg: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """(b) for one regularized run: final-model sensitivity below vanilla's and noise/blur
    accuracy above it, each by more than 2 s.e. of the paired differences, at train accuracies
    within 0.03."""
    label, m, m0 = reg["label"], reg["final_measure"], base["final_measure"]
    accs = (reg["final"].get("train/acc", math.nan), base["final"].get("train/acc", math.nan))
    ds, ds_se = paired(m["sensitivity"]["per_sample"], m0["sensitivity"]["per_sample"])
    da, da_se = paired(m["noise_blur_per_image"], m0["noise_blur_per_image"])
    evidence = {"train_acc": list(accs), "sensitivity": m["sensitivity"]["estimate"],
                "vanilla_sensitivity": m0["sensitivity"]["estimate"], "sens_diff": ds,
                "sens_diff_se": ds_se, "noise_blur_acc_diff": da, "noise_blur_acc_diff_se": da_se}
    if not abs(accs[0] - accs[1]) <= 0.03:
        return {"verdict": "not comparable", "evidence": evidence,
                "reason": f"train accuracies {accs[0]:.3f} vs {accs[1]:.3f} differ by > 0.03"}
    ok = ds < -2 * ds_se and da > 2 * da_se
    return {"verdict": "holds" if ok else "does not hold", "evidence": evidence,
            "reason": (f"sensitivity {m['sensitivity']['estimate']:.4f} vs vanilla "
                       f"{m0['sensitivity']['estimate']:.4f} (paired diff {ds:+.4f} ± "
                       f"{2 * ds_se:.4f}); noise/blur accuracy {label} − vit_small = "
                       f"{da:+.4f} (± {2 * da_se:.4f})")}
