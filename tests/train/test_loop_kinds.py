"""A model given data of another kind (an image model on a text set, a text model on images) is
refused before anything is loaded or written; the synthetic tasks' pairs are not kinds and pass."""

from __future__ import annotations

import pytest
import torch

from senslab.data.base import ArrayDataset
from senslab.train import loop
from senslab.train.config import RunConfig
from senslab.train.loop import build_model, fit


def config(model: str, data: str) -> RunConfig:
    cfg = RunConfig(name=f"{model}-{data}")
    cfg.model.name, cfg.data.name = model, data
    cfg.train.epochs, cfg.train.max_steps = 1, 1
    return cfg


@pytest.mark.parametrize(("model", "data", "fits"), [
    ("vit_small", "sst2", None), ("mlp", "mrpc", None), ("roberta", "mnist", None),
    ("gpt2", "corrupted", None),
    ("mlp", "digits", True), ("lstm", "sst2", True), ("resnet18", "cifar10c", True),
    # the synthetic tasks' models and data: no kind, never refused here
    ("parity_transformer", "sparse_parity", True), ("boolean_transformer", "boolean", True),
    ("modadd_transformer", "modular_addition", True), ("sparse_attention", "sparse_frequent", True),
    ("attention_model", "maxmargin_attention", True), ("mlp", "boolean", True),
    ("roberta", "sparse_frequent", True),
    # an unknown name is left to the error that lists close names
    ("no_such_model", "sst2", True), ("vit_small", "no_such_data", True),
])
def test_check_model_fits_data(model: str, data: str, fits: bool | None) -> None:
    if fits:
        loop.check_model_fits_data(config(model, data))
        return
    with pytest.raises(ValueError, match=f"^{model} is an? (image|text) model and {data} holds"):
        loop.check_model_fits_data(config(model, data))


def test_the_message_lists_the_registered_fits() -> None:
    with pytest.raises(ValueError) as err:
        loop.check_model_fits_data(config("vit_small", "sst2"))
    text = str(err.value)
    assert text.startswith("vit_small is an image model and sst2 holds text: use an image set (")
    sets, models = text.split("an image set (")[1].split(") or a text model (")
    assert {"digits", "mnist", "fashion_mnist", "cifar10"} <= set(sets.split(", "))
    assert not {"sst2", "boolean", "sparse_parity"} & set(sets.split(", "))
    assert {"roberta", "lstm", "gpt2"} <= set(models.rstrip(")").split(", "))
    assert "\n" not in text


@pytest.mark.parametrize(("model", "data"), [("vit_small", "sst2"), ("lstm", "digits")])
def test_fit_refuses_before_writing(tmp_path, model: str, data: str) -> None:
    out = tmp_path / "run"
    with pytest.raises(ValueError, match=f"^{model} is an? (image|text) model and {data}"):
        fit(config(model, data), out, progress=False)
    assert not out.exists()


def test_build_model_refuses_loaded_data_of_another_kind() -> None:
    images = ArrayDataset(torch.zeros(4, 1, 8, 8), torch.tensor([0, 1, 0, 1]), 2, name="pics")
    text = ArrayDataset({"input_ids": torch.ones(4, 6, dtype=torch.long),
                         "attention_mask": torch.ones(4, 6, dtype=torch.bool)},
                        torch.tensor([0, 1, 0, 1]), 2, name="words",
                        meta={"vocab_size": 50, "pad_id": 0})
    with pytest.raises(ValueError, match="^roberta is a text model and pics holds images: use"):
        build_model(config("roberta", "digits"), images)
    with pytest.raises(ValueError, match="^mlp is an image model and words holds text: use"):
        build_model(config("mlp", "digits"), text)
    build_model(config("mlp", "digits"), images)  # a fitting pair still builds
    build_model(config("roberta", "sst2"), text)
