"""Audit 77, area ``loops``: the registered trainers ``boolean``, ``attention`` and ``pretrained``
take no setting they would silently not apply, and log ``epoch`` as passes over the data."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import pytest

from senslab.train.loops.attention import AttentionConfig, AttentionData
from senslab.train.loops.boolean import BooleanRunConfig
from senslab.train.loops.boolean import example as boolean_example
from senslab.train.loops.pretrained import PretrainedConfig
from senslab.train.rundir import RunDir
from senslab.train.trainers import get_trainer, train_run


def quiet(_: str) -> None:
    pass


def images(root: Path, count: int) -> Path:
    """``count`` tiny PNGs in two class folders below ``root``."""
    image = pytest.importorskip("PIL.Image")
    for i in range(count):
        path = root / f"n0144{i % 2}764" / f"img{i}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        image.new("RGB", (8, 8), (30 * i, 90, 200 - 20 * i)).save(path, "PNG")
    return root


def stand_in(root: Path, **kw: object) -> PretrainedConfig:
    return PretrainedConfig(**{"name": "t", "model": "mlp", "source": "senslab",
                               "pretrained": False, "root": str(root), "num_images": 4,
                               "batch_size": 2, "repeats": 2, "seed": 1, **kw})


# -- pretrained --------------------------------------------------------------------------------
def test_pretrained_stand_in_through_train_run_refuses_pretrained_weights(tmp_path: Path) -> None:
    """train_run does not call the trainer's check(): pretrained=True on the senslab stand-in
    measured a random initialisation under a config that says "pretrained"."""
    cfg = stand_in(images(tmp_path / "img", 4), pretrained=True)
    with pytest.raises(ValueError, match="no pretrained weights: set pretrained=false"):
        train_run("pretrained", cfg, tmp_path / "run", log=quiet)
    assert not (tmp_path / "run" / "summary.json").exists()


def test_pretrained_warns_when_the_root_holds_fewer_images_than_num_images(
        tmp_path: Path) -> None:
    cfg = stand_in(images(tmp_path / "img", 4), num_images=50)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the few-flips note
        with pytest.warns(UserWarning, match=r"num_images=50, but .* holds only 4 images"):
            summary = train_run("pretrained", cfg, tmp_path / "run", log=quiet)
    assert summary["num_images"] == 4


# -- attention ---------------------------------------------------------------------------------
def attention(**kw: object) -> AttentionConfig:
    return AttentionConfig(**{"name": "t", "data": AttentionData(num_samples=8, seq_len=4, dim=8),
                              "optimizer": "sgd", "steps": 4, "per_decade": 1, **kw})


def test_attention_epoch_counts_passes_when_the_ragged_end_is_dropped(tmp_path: Path) -> None:
    """8 sequences in minibatches of 3: two steps per epoch (the last 2 are dropped, then a
    fresh permutation), so step 4 ends epoch 2 — it was logged as 4·3/8 = 1.5."""
    train_run("attention", attention(batch_size=3), tmp_path / "run", log=quiet)
    rows = RunDir(tmp_path / "run").metrics()
    assert [(r["step"], r["epoch"]) for r in rows] == [(0, 0.0), (1, 0.5), (4, 2.0)]


def test_attention_epoch_with_whole_batches_is_unchanged(tmp_path: Path) -> None:
    train_run("attention", attention(batch_size=4), tmp_path / "run", log=quiet)
    assert RunDir(tmp_path / "run").metrics()[-1]["epoch"] == 2.0


def test_attention_minibatches_larger_than_the_data_are_refused(tmp_path: Path) -> None:
    """batch_size=64 on 8 sequences trained full batch, identically to batch_size=None, and
    logged epoch 32 at step 4."""
    cfg = attention(batch_size=64)
    with pytest.raises(ValueError, match=r"batch_size=64 is larger than the training set"):
        get_trainer("attention").check(cfg)
    with pytest.raises(ValueError, match=r"data.num_samples=8"):
        train_run("attention", cfg, tmp_path / "run", log=quiet)
    assert not (tmp_path / "run" / "config.json").exists()


# -- boolean -----------------------------------------------------------------------------------
def test_boolean_random_completion_without_a_training_subset_is_refused(tmp_path: Path) -> None:
    """Fresh sampling has no unseen strings to complete: completion=random trained the learned
    completion while config.json said random."""
    cfg: BooleanRunConfig = dataclasses.replace(boolean_example(), completion="random", steps=2)
    with pytest.raises(ValueError, match="completion=random completes a training subset"):
        get_trainer("boolean").check(cfg)
    with pytest.raises(ValueError, match="give train_size"):
        train_run("boolean", cfg, tmp_path / "run", log=quiet)
    assert not (tmp_path / "run" / "config.json").exists()
