"""Pretrained ViT-L/16 vs ConvNeXtV2-T on ImageNet-1k training images (main paper §5).

Paper: "Transformers Learn Low Sensitivity Functions" (ICLR 2025), §5 ("Do these observations
generalize to pre-trained models?"). Claim: at comparable accuracy, the pretrained ViT-L/16 has
lower token-wise sensitivity than the pretrained ConvNeXtV2-Tiny on a sample of ImageNet-1k
training images.

Command: ``senslab run imagenet --set root=/path/to/imagenet/train`` (``--scale paper`` for
the full measurement). Needs the optional extra ``pip install timm`` (with
``-c constraints.txt``), network access the first time the weights are fetched from the
Hugging Face hub (or a warm ``$HF_HOME`` cache), and Pillow.

Data: an ImageFolder-style directory (``root/<class>/<image>.JPEG``); default
``$SENSLAB_DATA/imagenet/train``. A seeded sample of ``num_images`` files is drawn from it and
each is preprocessed with the model's own timm evaluation transform (resize, centre crop 224,
mean/std normalisation). Accuracy is reported when the class folders are WordNet IDs
(``n01440764``…) that timm's ImageNet metadata maps to class indices.

Sensitivity: ``Patches(16)`` on the **normalised** input (the 14×14 grid of ViT-L/16's own
patches), N(0, σ²) with σ = 0.5 *(ours: the paper's value was lost)*, the same images, tokens
and noise seed for both models, so the verdict compares per-image flip rates in pairs: ViT
lower by more than 2 s.e. of the paired difference. Scales: ``paper`` — 1,000 images *(ours)*,
every patch, 1 draw; ``cpu`` — 32 images, 16 random patches per image (ViT-L/16 is ~60 GFLOPs a
forward pass). ``pretrained=false`` builds random-weight models, initialised from ``seed``
(for tests, or to check the pipeline offline).

Each model is one run of the registered trainer ``"pretrained"``
(:mod:`senslab.train.loops.pretrained`: the image sample, the transform, the measurement, the
run directory); this module holds the settings, the two runs and the verdict.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from ...train.config import ranged
from ...train.loops.pretrained import PretrainedConfig
from ..base import Experiment, Run, Settings, register_experiment, seeded_name

MAX_ACC_GAP = 0.05


@dataclass
class ImageNetSettings(Settings):
    """``root``: the ImageFolder root ("" means $SENSLAB_DATA/imagenet/train); ``num_images``
    sampled images; ``num_tokens`` random patches per image (0: every patch); ``sigma``,
    ``repeats``: the noise; ``vit``, ``convnext``: the two timm models; ``pretrained``: their
    published weights (else seeded random ones); ``batch_size``: images (and perturbed copies)
    per forward pass; ``seed``: the image sample's, the tokens' and the noise's (seed replicate
    k uses ``seed + k``)."""

    root: str = ""
    num_images: int = ranged(1000, ge=1)
    num_tokens: int = ranged(0, ge=0)
    sigma: float = ranged(0.5, ge=0)
    repeats: int = ranged(1, ge=1)
    vit: str = "vit_large_patch16_224.augreg_in21k_ft_in1k"
    convnext: str = "convnextv2_tiny.fcmae_ft_in1k"
    pretrained: bool = True
    batch_size: int = ranged(16, ge=1)
    seed: int = ranged(0, ge=0)


@register_experiment("imagenet")
class ImageNet(Experiment):
    paper = "Transformers Learn Low Sensitivity Functions (ICLR 2025), §5"
    claim = ("On ImageNet-1k training images, pretrained ViT-L/16 has lower token-wise "
             "sensitivity than pretrained ConvNeXtV2-Tiny at comparable accuracy.")
    cpu_scale_note = "32 images, 16 random 16×16 patches per image instead of all 196"
    requires = ("pip install -c constraints.txt timm; pretrained weights from the Hugging Face "
                "hub (network or a warm $HF_HOME); ImageNet train images as "
                "root/<wnid>/*.JPEG (--set root=...)")
    scales = {"cpu": ImageNetSettings(num_images=32, num_tokens=16),
              "paper": ImageNetSettings()}

    def runs(self, s: ImageNetSettings) -> list[Run]:
        out = []
        for k in range(s.seeds):
            for label, model in (("vit", s.vit), ("convnext", s.convnext)):
                cfg = PretrainedConfig(
                    name=seeded_name(label, k), label=label, model=model, root=s.root,
                    num_images=s.num_images, num_tokens=s.num_tokens, sigma=s.sigma,
                    repeats=s.repeats, pretrained=s.pretrained, batch_size=s.batch_size,
                    seed=s.seed + k)
                out.append(Run(cfg.name, cfg, trainer="pretrained", info={"seed": cfg.seed}))
        return out

    def verdict(self, summaries: list[dict[str, Any]]) -> dict[str, Any]:
        return imagenet_verdict(summaries)


def imagenet_verdict(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """Paired per-image comparison: ViT's flip rate below ConvNeXt's by more than 2 s.e."""
    by = {s["label"]: s for s in summaries}
    vit, cnx = by["vit"], by["convnext"]
    evidence = {k: {"sensitivity": s["final"]["sens/train"], "stderr": s["final"]["sens/train_se"],
                    "accuracy": s["final"].get("train/acc")} for k, s in by.items()}
    accs = [vit["final"].get("train/acc"), cnx["final"].get("train/acc")]
    if None not in accs and abs(accs[0] - accs[1]) > MAX_ACC_GAP:
        return {"verdict": "not comparable", "evidence": evidence,
                "reason": f"accuracies differ by {abs(accs[0] - accs[1]):.3f} (> {MAX_ACC_GAP})"}
    d = torch.tensor(cnx["per_sample"]) - torch.tensor(vit["per_sample"])
    diff = float(d.mean())
    se = float(d.std() / math.sqrt(len(d))) if len(d) > 1 else math.nan
    ok = diff > 2 * se
    acc_note = "" if None in accs else f" at accuracies {accs[0]:.3f} vs {accs[1]:.3f}"
    return {"verdict": "holds" if ok else "does not hold",
            "reason": (f"ConvNeXtV2-T − ViT-L/16 = {diff:+.4f} (±{2 * se:.4f}, paired over "
                       f"{len(d)} images){acc_note}"),
            "evidence": evidence}
