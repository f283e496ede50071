"""Audit 86 of the token base machinery and the Hugging Face callback: a model whose weights
accelerate offloads (``cpu_offload``; ``device_map`` with ``"cpu"``/``"disk"`` entries) was let
through, and the user was told to move the inputs to ``meta``; a subset of one example without
its batch axis (``dataset[0]``) or of unpadded examples (a list of tensors) was taken when the
callback was made and stopped the run at its start with the model's "not enough values to
unpack" or a message that named no padding."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("tensorboard")
accelerate = pytest.importorskip("accelerate")

sys.path.insert(0, str(Path(__file__).parent))
from integrations.test_hf import TOKENS, Texts, tiny_bert  # noqa: E402

from senslab.integrations.hf import SensitivityCallback  # noqa: E402
from senslab.measure import token_sensitivity  # noqa: E402
from senslab.tokens import Embedding  # noqa: E402


def _subset(n: int) -> dict[str, torch.Tensor]:
    return {k: v for k, v in Texts(8, 2).batch(n).items() if k != "labels"}


def test_a_model_offloaded_by_accelerate_is_refused_naming_the_offload_not_meta_inputs():
    model = tiny_bert().eval()
    inputs = _subset(4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = token_sensitivity(model, inputs, Embedding(TOKENS), sigma=2.0, generator=3)
    assert 0 <= ref.estimate <= 1  # measured before the offload
    accelerate.cpu_offload(model, execution_device=torch.device("cpu"))
    assert next(model.parameters()).is_meta
    with pytest.raises(ValueError, match="offloaded by accelerate") as caught:
        token_sensitivity(model, inputs, Embedding(TOKENS), sigma=2.0, generator=3)
    assert "inputs.to('meta')" not in str(caught.value)
    assert "device_map" in str(caught.value)
    # the callback's measurement (inputs moved to the model's first parameter's device) too
    callback = SensitivityCallback(inputs, Embedding(TOKENS), sigma=2.0, generator=3)
    with pytest.raises(ValueError, match="offloaded by accelerate"):
        callback.measure(model)


def test_a_subset_of_one_example_without_its_batch_axis_is_refused_when_the_callback_is_made():
    one = {k: v[0] for k, v in _subset(1).items()}  # what dataset[0] gives: (tokens,)
    assert one["input_ids"].shape == (8,)
    with pytest.raises(ValueError, match=r"input_ids of shape \(8,\).*without its batch axis"):
        SensitivityCallback(one, Embedding(TOKENS), sigma=2.0)
    # the fix the message names is taken
    fixed = {k: v.unsqueeze(0) for k, v in one.items()}
    assert SensitivityCallback(fixed, Embedding(TOKENS), sigma=2.0).inputs["input_ids"].shape \
        == (1, 8)


def test_a_subset_of_unpadded_examples_is_refused_naming_the_padding():
    ids = Texts(8, 2).ids
    ragged = {"input_ids": [ids[0, :3], ids[1, :5]],
              "attention_mask": [torch.ones(3, dtype=torch.long), torch.ones(5, dtype=torch.long)]}
    with pytest.raises(ValueError, match=r"list of 2 tensors.*Pad them"):
        SensitivityCallback(ragged, Embedding(TOKENS), sigma=2.0)
