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
forward pass). ``pretrained=false`` builds random-weight models (for tests, or to check the
pipeline offline).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from ...data import DataUnavailableError, data_home
from ...measure import token_sensitivity
from ...tokens import Patches
from ...train.config import ranged
from .._manual import ManualRun, run_all
from ..base import Experiment, register_experiment, write_experiment_json

IMAGE_SUFFIXES = {".jpeg", ".jpg", ".png"}
MAX_ACC_GAP = 0.05


@dataclass
class ImageNetSettings:
    root: str = ""  # ImageFolder root; "" means $SENSLAB_DATA/imagenet/train
    num_images: int = ranged(1000, ge=1)
    num_tokens: int = ranged(0, ge=0)  # 0: every patch
    sigma: float = ranged(0.5, ge=0)
    repeats: int = ranged(1, ge=1)
    vit: str = "vit_large_patch16_224.augreg_in21k_ft_in1k"
    convnext: str = "convnextv2_tiny.fcmae_ft_in1k"
    pretrained: bool = True
    batch_size: int = ranged(16, ge=1)
    seed: int = ranged(0, ge=0)


SCALES = {"paper": ImageNetSettings(),
          "cpu": ImageNetSettings(num_images=32, num_tokens=16)}


def image_files(st: ImageNetSettings) -> tuple[list[Path], list[str]]:
    """A seeded sample of ``num_images`` image files below ``root`` and their class folders."""
    root = Path(st.root) if st.root else data_home() / "imagenet" / "train"
    files = sorted(p for p in root.glob("*/*") if p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise DataUnavailableError(
            f"no images found in {root}/<class>/*.JPEG; put an ImageFolder-style copy of the "
            "ImageNet-1k training set (or a sample of it) there, or pass --set root=/path/to/train")
    g = torch.Generator().manual_seed(st.seed)
    pick = torch.randperm(len(files), generator=g)[: st.num_images].sort().values
    chosen = [files[int(i)] for i in pick]
    return chosen, [p.parent.name for p in chosen]


def import_timm() -> Any:
    try:
        import timm
    except ImportError as err:
        raise ImportError(
            "the imagenet experiment needs the optional package timm for the pretrained models: "
            "pip install -c constraints.txt timm") from err
    return timm


def create_pretrained(timm: Any, name: str, pretrained: bool) -> torch.nn.Module:
    try:
        return timm.create_model(name, pretrained=pretrained).eval()
    except Exception as err:  # hub/network/cache errors come in many types
        if not pretrained:
            raise
        raise DataUnavailableError(
            f"could not load the pretrained weights of {name} ({type(err).__name__}: {err}). "
            "timm downloads them from the Hugging Face hub: run once with network access, or "
            "copy a warm cache into $HF_HOME on this machine (HF_HUB_OFFLINE=1 then uses it)"
        ) from err


def load_images(timm: Any, model: torch.nn.Module, files: list[Path]) -> torch.Tensor:
    """Images preprocessed with the model's own timm evaluation transform: (N, 3, 224, 224)."""
    try:
        from PIL import Image
    except ImportError as err:
        raise ImportError("reading JPEGs needs Pillow: pip install -c constraints.txt pillow"
                          ) from err
    config = timm.data.resolve_data_config({}, model=model)
    transform = timm.data.create_transform(**config)
    out = []
    for f in files:
        with Image.open(f) as im:
            out.append(transform(im.convert("RGB")))
    return torch.stack(out)


def class_indices(timm: Any, folders: list[str]) -> torch.Tensor | None:
    """ImageNet-1k class index of each WordNet-ID folder, or None when they are not all known."""
    info = getattr(timm.data, "ImageNetInfo", None)
    if info is None:
        return None
    synsets = list(info().label_names())
    index = {s: i for i, s in enumerate(synsets)}
    if not all(f in index for f in folders):
        return None
    return torch.tensor([index[f] for f in folders])


@register_experiment("imagenet")
class ImageNet(Experiment):
    paper = "Transformers Learn Low Sensitivity Functions (ICLR 2025), §5"
    claim = ("On ImageNet-1k training images, pretrained ViT-L/16 has lower token-wise "
             "sensitivity than pretrained ConvNeXtV2-Tiny at comparable accuracy.")
    cpu_scale_note = "32 images, 16 random 16×16 patches per image instead of all 196"
    requires = ("pip install -c constraints.txt timm; pretrained weights from the Hugging Face "
                "hub (network or a warm $HF_HOME); ImageNet train images as "
                "root/<wnid>/*.JPEG (--set root=...)")

    scales = SCALES

    def execute(self, out: Path, scale: str, overrides: list[str], progress: bool | None,
                log: Any) -> list[dict[str, Any]]:
        st = self.settings(scale, overrides)
        files, folders = image_files(st)  # data first: its error says where to put the images
        timm = import_timm()
        names = {"vit": st.vit, "convnext": st.convnext}
        write_experiment_json(out, self, scale, list(names))
        return run_all(out, list(names),
                       lambda _, label: self._measure(out / label, label, names[label], st,
                                                      files, folders, timm), log)

    def _measure(self, path: Path, label: str, model_name: str, st: ImageNetSettings,
                 files: list[Path], folders: list[str], timm: Any) -> dict[str, Any]:
        model = create_pretrained(timm, model_name, st.pretrained)
        run = ManualRun(path, label, label)
        run.start({"settings": asdict(st), "model": model_name, "seed": st.seed,
                   "images": [str(f) for f in files]})
        x = load_images(timm, model, files)
        with torch.no_grad():
            logits = torch.cat([model(x[i:i + st.batch_size])
                                for i in range(0, len(x), st.batch_size)])
        targets = class_indices(timm, folders)
        acc = None if targets is None else float((logits.argmax(1) == targets).float().mean())
        r = token_sensitivity(model, x, Patches(16), sigma=st.sigma, repeats=st.repeats,
                              num_tokens=st.num_tokens or None, generator=st.seed,
                              chunk_size=st.batch_size)
        final = {"sens/train": r.estimate, "sens/train_se": r.stderr, "train/acc": acc}
        run.log({"step": 0, "epoch": 0, **final})
        return run.finish(final, per_sample=r.per_sample.tolist(), num_images=len(files))

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
