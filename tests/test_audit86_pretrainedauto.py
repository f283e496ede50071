"""``pretrained.load_hf``'s seed and label count, checked before a new head is drawn (tiny BERT
built from a config and saved locally, offline)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from senslab.models import pretrained

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def encoder(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A bare BERT encoder (no head): load_hf builds a new, seeded classification head."""
    path = tmp_path_factory.mktemp("bert")
    torch.manual_seed(0)  # test-only: the Hugging Face model initialises from the global RNG
    transformers.BertModel(transformers.BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=20)).save_pretrained(path)
    return str(path)


def _head(name: str, seed, num_labels=2) -> torch.Tensor:
    model, _, _ = pretrained.load_hf(name, pretrained.hf_config(name), seed, num_labels)
    return model.classifier.weight.detach().clone()


@pytest.mark.parametrize("seed", [-1, 2**32 + 3, 2**64, True, 1.5],
                         ids=["negative", "2**32+3", "2**64", "bool", "float"])
def test_seeds_that_alias_another_or_fail_in_torch_are_refused(encoder: str, seed) -> None:
    """Before, -1 drew the head of 2**64 - 1 and 2**32 + 3 that of seed 3 (torch's CPU
    generator keeps a seed's low 32 bits), while the words said "seed -1"; a bool or a float
    failed in manual_seed with a RuntimeError naming neither the seed nor the fix."""
    with pytest.raises(ValueError, match=r"seed must be an int in \[0, 2\*\*32\).*got "
                                         + repr(seed).replace(".", r"\.")
                                         + r".*Pass an int from 0 to 4294967295"):
        pretrained.load_hf(encoder, pretrained.hf_config(encoder), seed, 2)


def test_seeds_in_range_still_draw_their_own_head(encoder: str) -> None:
    three = _head(encoder, 3)
    assert torch.equal(_head(encoder, np.int64(3)), three)  # a NumPy integer is that int
    assert not torch.equal(_head(encoder, 4), three)
    assert _head(encoder, 2**32 - 1).shape == (2, 16)  # the top of the range is taken


@pytest.mark.parametrize("num_labels", [0, -1, True, 2.0], ids=["zero", "negative", "bool",
                                                                  "float"])
def test_label_counts_that_build_no_classifier_are_refused(encoder: str, num_labels) -> None:
    """Before, 0 and -1 built a head of no outputs (-1 as config.num_labels=0, refused later as
    "no classifier", a count the user never gave), True a one-output regression head, and 2.0
    failed in transformers naming neither num_labels nor the fix."""
    with pytest.raises(ValueError, match=r"num_labels must be an int of at least 1.*got "
                                         + repr(num_labels).replace(".", r"\.")):
        pretrained.load_hf(encoder, pretrained.hf_config(encoder), 0, num_labels)


def test_label_counts_in_range_shape_the_head(encoder: str) -> None:
    assert _head(encoder, 0, num_labels=np.int64(3)).shape == (3, 16)
    assert _head(encoder, 0, num_labels=1).shape == (1, 16)
