"""``build_model``: data-determined config fields, seeded weights, one model built (no probe)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from senslab.data.base import ArrayDataset
from senslab.models import create_model
from senslab.train import loop
from senslab.train.config import RunConfig
from senslab.train.loop import build_model

IMAGES = ArrayDataset(torch.zeros(4, 1, 8, 8), torch.tensor([0, 1, 0, 1]), 2)
TEXT = ArrayDataset(
    {"input_ids": torch.ones(4, 12, dtype=torch.long),
     "attention_mask": torch.ones(4, 12, dtype=torch.bool)},
    torch.tensor([0, 1, 0, 1]), 2, meta={"vocab_size": 50, "pad_id": 0},
)


def config(name: str, seed: int = 3, **overrides) -> RunConfig:
    cfg = RunConfig(seed=seed)
    cfg.model.name, cfg.model.overrides = name, overrides
    return cfg


def reference(cfg: RunConfig, data: ArrayDataset) -> torch.nn.Module:
    """The former build_model, which built a probe model first to learn the config fields."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        probe = create_model(cfg.model.name)
        names = {f.name for f in dataclasses.fields(probe.config)}
        auto = {k: v for k, v in loop._data_fields(data).items() if k in names}
        if "num_classes" in auto and data.num_classes == 2 and probe.config.num_classes == 1:
            auto.pop("num_classes")
        if "seed" in names:
            auto["seed"] = cfg.seed
        torch.manual_seed(cfg.seed)
        return create_model(cfg.model.name, **{**auto, **cfg.model.overrides})


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("name, data, overrides, expected", [
    ("mlp", IMAGES, {"widths": (8,)},
     dict(num_classes=2, in_channels=1, image_size=8, seed=3, widths=(8,))),
    ("vit_simple", IMAGES, {"patch_size": 2, "dim": 16, "depth": 1, "mlp_dim": 16},
     dict(num_classes=2, in_channels=1, image_size=8, seed=3, patch_size=2, dim=16, depth=1,
          mlp_dim=16)),
    ("lstm", TEXT, {"dim": 16, "layers": 1},
     dict(num_classes=2, vocab_size=50, pad_id=0, max_len=12, seed=3, dim=16, layers=1)),
    ("roberta_relu", TEXT, {"dim": 16, "layers": 1, "heads": 2},
     dict(num_classes=2, vocab_size=50, pad_id=0, max_len=12, seed=3, dim=16, layers=1,
          heads=2)),
    ("attention_model", IMAGES, {}, dict(seed=3)),  # no data-determined fields but the seed
])
def test_build_model_weights_are_unchanged(name, data, overrides, expected):
    cfg = config(name, **overrides)
    rng = torch.get_rng_state()
    model = build_model(cfg, data)
    assert torch.equal(torch.get_rng_state(), rng)  # the caller's RNG is untouched
    assert same_weights(model, reference(cfg, data))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        direct = create_model(name, **expected)
    assert model.config == direct.config and same_weights(model, direct)


def test_build_model_builds_one_model(monkeypatch):
    built = []

    def counting(name, **overrides):
        built.append(name)
        return create_model(name, **overrides)

    monkeypatch.setattr(loop, "create_model", counting)
    build_model(config("mlp", widths=(8,)), IMAGES)
    assert built == ["mlp"]


@pytest.mark.parametrize("name, data, overrides", [
    ("mlp", IMAGES, {"widths": (8,)}),
    ("lstm", TEXT, {"dim": 16, "layers": 1}),
])
def test_build_model_leaves_the_cuda_generators_alone(monkeypatch, name, data, overrides):
    # torch.manual_seed also seeds (or, before CUDA starts, queues a seeding of) every CUDA
    # generator, which fork_rng(devices=[]) does not put back: building a model reset a GPU
    # caller's CUDA stream to the run's seed. Seeding CUDA is spied on (no GPU here).
    calls = []
    monkeypatch.setattr(torch.cuda, "manual_seed_all", lambda seed: calls.append(seed))
    monkeypatch.setattr(torch.cuda, "manual_seed", lambda seed: calls.append(seed))
    cfg = config(name, **overrides)
    model = build_model(cfg, data)
    assert calls == []
    assert same_weights(model, reference(cfg, data))  # the weights drawn are the same


def test_pretrained_stand_in_leaves_the_cuda_generators_alone(monkeypatch, tmp_path):
    # the pretrained loop's random-weight stand-in was seeded with torch.manual_seed as well
    pytest.importorskip("PIL")
    from PIL import Image

    from senslab.train.loops.pretrained import PretrainedConfig, model_and_images

    files = []
    for i in range(2):
        path = tmp_path / f"n0144{i}764" / "a.png"
        path.parent.mkdir()
        Image.new("RGB", (40, 30), (30 * i, 90, 200)).save(path)
        files.append(path)
    calls = []
    monkeypatch.setattr(torch.cuda, "manual_seed_all", lambda seed: calls.append(seed))
    cfg = PretrainedConfig(model="mlp", source="senslab", root=str(tmp_path), seed=5)
    model, images, _ = model_and_images(cfg, files, ["n01440764", "n01441764"])
    assert calls == [] and images.shape[0] == 2
    again, _, _ = model_and_images(cfg, files, ["n01440764", "n01441764"])
    assert same_weights(model, again)  # seeded by cfg.seed alone
