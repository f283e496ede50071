"""The trainer ``fit``: the standard minibatch loop, :func:`senslab.train.loop.fit`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..config import RunConfig, apply_overrides
from ..loop import check_config, check_dir, fit, locate_data
from ..trainers import register_trainer


def example() -> RunConfig:
    """A one-block ViT on scikit-learn's digits: 4 epochs of 90 steps, a checkpoint every 7."""
    return apply_overrides(RunConfig(name="example"), [
        "model.name=vit_small", "data.name=digits", "model.overrides.patch_size=2",
        "model.overrides.depth=1", "model.overrides.dim=16", "model.overrides.heads=2",
        "model.overrides.dim_head=8", "model.overrides.mlp_dim=16", "train.batch_size=16",
        "optim.lr=0.05", "track.num_examples=32", "track.eval_examples=64", "train.epochs=4",
        "train.checkpoint_every=7", "device=cpu"])


def check(cfg: RunConfig) -> None:
    """What :func:`~senslab.train.loop.fit` refuses before it writes anything (an invalid value,
    an image model on text, a reporter whose package is missing), and the data found
    (:func:`~senslab.train.loop.locate_data`)."""
    check_config(cfg)
    locate_data(cfg)


def label(config: dict[str, Any]) -> Any:
    """The summary's label of a run whose ``label`` is empty: ``fit`` resolves it to
    ``cfg.model.name``, which config.json holds resolved (one written by an older senslab may
    not)."""
    model = config.get("model")
    return model.get("name") if isinstance(model, dict) else None


@register_trainer("fit", RunConfig, check=check, example=example, check_dir=check_dir,
                  label=label)
def train_fit(cfg: RunConfig, path: Path, *, progress: bool | None = None,
              log: Any = None) -> dict[str, Any]:
    """:func:`senslab.train.loop.fit` (it logs through its progress bar, not ``log``)."""
    return fit(cfg, path, progress=progress)
