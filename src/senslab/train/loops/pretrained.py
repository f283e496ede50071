"""Trainer ``"pretrained"``: measure a pretrained timm model on a sample of ImageFolder images
(low-sensitivity paper §5, used by ``imagenet``). It trains nothing.

One run: a seeded sample of ``num_images`` image files below ``root``
(``root/<class>/<image>.JPEG``; "" means ``$SENSLAB_DATA/imagenet/train``), each preprocessed
with the model's own timm evaluation transform (resize, centre crop, mean/std normalisation);
the model ``model`` from timm (``pretrained``: its published weights from the Hugging Face hub,
else a random initialisation seeded by ``seed``). The loop evaluates the clean images in batches
of ``batch_size`` (one ``metrics.jsonl`` record and one checkpoint per batch, holding the logits
so far), then the token-wise sensitivity (docs/definitions.md#token-wise-sensitivity) on all of
them at once: ``Patches(patch)`` on the normalised input, N(0, σ²) with σ = ``sigma``,
``repeats`` draws per token, ``num_tokens`` random tokens per image (0: every token), noise seed
``seed``, ``batch_size`` perturbed copies per forward pass. Accuracy (``train/acc``) is reported
when the class folders are WordNet IDs (``n01440764``…) that timm's ImageNet metadata maps to
the model's own class indices (those of its head's label set: 1k, 12k, 21k, 22k…). The summary
holds ``final`` (``sens/train``, ``sens/train_se``, ``train/acc``), the per-image flip rates
(``per_sample``) and ``num_images``.

``source="senslab"`` is a stand-in for machines without timm (the trainer's example there): a
senslab model (``model`` names it, random weights) on the images resized to 32×32 in [−1, 1].
"""

from __future__ import annotations

import tempfile
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..._seeds import noise_seed
from ...data import DataUnavailableError, data_home
from ...measure import token_sensitivity
from ...tokens import Patches
from ..config import defaults_of, one_of, ranged, seeded
from ..looprun import LoopRun
from ..trainers import register_trainer

IMAGE_SUFFIXES = {".jpeg", ".jpg", ".png"}
#: image side of the ``source="senslab"`` stand-in
STAND_IN_SIZE = 32


@dataclass
class PretrainedConfig:
    """One measured model (see the module docstring for every field)."""

    name: str = "pretrained"
    label: str = ""
    model: str = "vit_large_patch16_224.augreg_in21k_ft_in1k"
    source: str = one_of("timm", "senslab")
    pretrained: bool = True
    root: str = ""
    num_images: int = ranged(1000, ge=1)
    num_tokens: int = ranged(0, ge=0)
    patch: int = ranged(16, ge=1)
    sigma: float = ranged(0.5, ge=0)
    repeats: int = ranged(1, ge=1)
    batch_size: int = ranged(16, ge=1)
    seed: int = seeded()


def image_files(cfg: PretrainedConfig) -> tuple[list[Path], list[str]]:
    """A seeded sample of ``num_images`` image files below ``root`` and their class folders."""
    root = Path(cfg.root) if cfg.root else data_home() / "imagenet" / "train"
    files = sorted(p for p in root.glob("*/*") if p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise DataUnavailableError(
            f"no images found in {root}/<class>/*.JPEG; put an ImageFolder-style copy of the "
            "ImageNet-1k training set (or a sample of it) there, or pass --set root=/path/to/train")
    g = torch.Generator().manual_seed(cfg.seed)
    pick = torch.randperm(len(files), generator=g)[: cfg.num_images].sort().values
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


def _pil() -> Any:
    try:
        from PIL import Image
    except ImportError as err:
        raise ImportError("reading JPEGs needs Pillow: pip install -c constraints.txt pillow"
                          ) from err
    return Image


def check_source(cfg: PretrainedConfig) -> None:
    """Refuse ``pretrained=True`` with the senslab stand-in: it has no published weights, and
    measuring its random initialisation would report a random model's numbers under a
    configuration that says "pretrained"."""
    if cfg.source == "senslab" and cfg.pretrained:
        raise ValueError("the senslab stand-in has no pretrained weights: set pretrained=false")


def check(cfg: PretrainedConfig) -> None:
    """Before anything is written: the images (the error says where to put them), then timm."""
    image_files(cfg)
    if cfg.source == "timm":
        import_timm()
    check_source(cfg)


def create_pretrained(timm: Any, name: str, pretrained: bool) -> nn.Module:
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


def load_images(timm: Any, model: nn.Module, files: list[Path]) -> torch.Tensor:
    """Images preprocessed with the model's own timm evaluation transform: (N, 3, 224, 224)."""
    image = _pil()
    config = timm.data.resolve_data_config({}, model=model)
    transform = timm.data.create_transform(**config)
    out = []
    for f in files:
        with image.open(f) as im:
            out.append(transform(im.convert("RGB")))
    return torch.stack(out)


def class_indices(timm: Any, model: nn.Module, folders: list[str]) -> torch.Tensor | None:
    """Each WordNet-ID folder's index among ``model``'s own classes, or None when they are not
    all known: the ImageNet label set (1k, 12k, 21k, 22k, …) that timm infers from the model's
    number of classes, None for a head of another size (or none). The 1k indices served every
    model: an ImageNet-21k head right on every image (n01440764 is its class 359, not 0)
    scored 0.0."""
    info = getattr(timm.data, "ImageNetInfo", None)
    if info is None:
        return None
    num_classes = getattr(model, "num_classes", None)
    infer = getattr(timm.data, "infer_imagenet_subset", None)
    if infer is not None:  # from the head's width alone, not the pretrained tag's
        subset = infer({"num_classes": num_classes})
    else:  # an older timm knows the 1k label set only
        subset = "imagenet-1k" if num_classes == 1000 else None
    if subset is None:
        return None
    synsets = list(info(subset).label_names())
    if len(synsets) != num_classes:
        return None
    index = {s: i for i, s in enumerate(synsets)}
    if not all(f in index for f in folders):
        return None
    return torch.tensor([index[f] for f in folders])


def _stand_in_images(files: list[Path]) -> torch.Tensor:
    image = _pil()
    out = []
    for f in files:
        with image.open(f) as im:
            rgb = im.convert("RGB").resize((STAND_IN_SIZE, STAND_IN_SIZE))
            pixels = torch.frombuffer(bytearray(rgb.tobytes()), dtype=torch.uint8)
            out.append(pixels.view(STAND_IN_SIZE, STAND_IN_SIZE, 3).permute(2, 0, 1))
    return torch.stack(out).float() / 127.5 - 1


def model_and_images(cfg: PretrainedConfig, files: list[Path], folders: list[str]
                     ) -> tuple[nn.Module, torch.Tensor, torch.Tensor | None]:
    """The model in eval mode (a random initialisation is seeded by ``seed``), the preprocessed
    images and their class indices (None when unknown)."""
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(cfg.seed)  # CPU's alone: not the caller's CUDA ones
        if cfg.source == "senslab":
            from ...models import create_model

            model = create_model(cfg.model, image_size=STAND_IN_SIZE, in_channels=3,
                                 num_classes=10).eval()
            return model, _stand_in_images(files), None
        timm = import_timm()
        model = create_pretrained(timm, cfg.model, cfg.pretrained)
    return model, load_images(timm, model, files), class_indices(timm, model, folders)


def _example() -> PretrainedConfig:
    """Random-weight models on 12 generated images in a temporary folder: a tiny timm ViT when
    timm is installed, else the senslab stand-in (an MLP)."""
    root = Path(tempfile.gettempdir()) / "senslab-pretrained-example"
    image = _pil()
    for i in range(12):
        path = root / f"n0144{i % 2}764" / f"img{i}.png"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            image.new("RGB", (40, 30), (20 * i, 100 + 10 * i, 200 - 15 * i)).save(tmp, "PNG")
            tmp.replace(path)
    common = {"name": "example", "root": str(root), "pretrained": False, "num_images": 12,
              "batch_size": 2}
    try:
        import timm  # noqa: F401
    except ImportError:
        return PretrainedConfig(model="mlp", source="senslab", repeats=64, **common)
    return PretrainedConfig(model="vit_tiny_patch16_224", num_tokens=2, **common)


def _loop_run(cfg: PretrainedConfig, path: Path, files: list[Path]) -> LoopRun:
    """The run directory ``path`` of ``cfg``: its config.json also lists the images measured."""
    return LoopRun(path, {**asdict(cfg), "images": [str(f) for f in files]},
                   defaults=defaults_of(type(cfg)))


def check_dir(cfg: PretrainedConfig, path: Path) -> None:
    """The trainer's ``check_dir``: :meth:`~senslab.train.looprun.LoopRun.check` of the run
    directory :func:`train_pretrained` writes."""
    _loop_run(cfg, path, image_files(cfg)[0]).check()


@register_trainer("pretrained", PretrainedConfig, check=check, example=_example,
                  check_dir=check_dir)
def train_pretrained(cfg: PretrainedConfig, path: Path, *, progress: bool | None = None,
                     log: Any = print) -> dict[str, Any]:
    check_source(cfg)  # train_run does not call check(); the stand-in has no weights to load
    files, folders = image_files(cfg)
    if len(files) < cfg.num_images:  # as fit warns of a data.train_subset above the split's size
        root = cfg.root or data_home() / "imagenet" / "train"
        warnings.warn(f"num_images={cfg.num_images}, but {root} holds only {len(files):,} "
                      f"images: measuring all {len(files):,} (set "
                      f"num_images={len(files)} to say so, or add images)", UserWarning,
                      stacklevel=2)
    with _loop_run(cfg, path, files) as run:
        if run.summary is not None:
            return run.summary
        state = run.restore() or {"step": 0, "logits": None}
        model, x, targets = model_and_images(cfg, files, folders)
        starts = list(range(0, len(x), cfg.batch_size))
        done = int(state["step"])
        if done <= len(starts):  # the clean images, one batch per step
            logits = [] if state["logits"] is None else [state["logits"]]
            with torch.no_grad():
                for step, i in enumerate(starts[done:], done + 1):
                    logits.append(model(x[i:i + cfg.batch_size]))
                    run.log({"step": step, "images": min(i + cfg.batch_size, len(x))})
                    run.checkpoint(step, {"logits": torch.cat(logits)})
            clean = torch.cat(logits)
            acc = None if targets is None else float((clean.argmax(1) == targets).float().mean())
            r = token_sensitivity(model, x, Patches(cfg.patch), sigma=cfg.sigma,
                                  repeats=cfg.repeats, num_tokens=cfg.num_tokens or None,
                                  generator=noise_seed(cfg.seed), chunk_size=cfg.batch_size)
            final = {"sens/train": r.estimate, "sens/train_se": r.stderr, "train/acc": acc}
            state = {"logits": clean, "final": final, "per_sample": r.per_sample}
            run.log({"step": len(starts) + 1, "images": len(x), **final})
            run.checkpoint(len(starts) + 1, state)
        return run.finish({"label": cfg.label or cfg.name, "name": cfg.name,
                           "final": state["final"], "per_sample": state["per_sample"].tolist(),
                           "num_images": len(files)})
