"""Audit 80 of the model zoo: what ``load_hf`` says of a checkpoint whose weights did not all
load (tiny BERTs built from configs, saved to a temporary folder; offline)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from senslab.models import pretrained

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

BERT = {"hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
        "intermediate_size": 24, "vocab_size": 50, "max_position_embeddings": 16}


def saved_classifier(path: Path) -> torch.nn.Module:
    torch.manual_seed(0)  # test-only: HF initialises from the global RNG
    model = transformers.BertForSequenceClassification(
        transformers.BertConfig(**BERT, num_labels=2)).eval()
    model.save_pretrained(path)
    return model


def load(path: Path):
    return pretrained.load_hf(str(path), pretrained.hf_config(str(path)), 0, 2)


def test_a_checkpoint_whose_weights_carry_a_wrappers_prefix_is_refused(tmp_path: Path):
    """Every key saved under a wrapper's prefix (``encoder_wrapper.bert...``): none of the 39
    weights of the classifier's BERT was found, transformers initialised them all at random,
    and the words said "pretrained weights from DIR except ... and 35 more, newly initialised"
    while a random model was measured."""
    saved_classifier(tmp_path)
    file = tmp_path / "model.safetensors"
    weights = safetensors_torch.load_file(file)
    safetensors_torch.save_file({"encoder_wrapper." + k: v for k, v in weights.items()}, file,
                                metadata={"format": "pt"})
    with pytest.raises(ValueError) as err:
        load(tmp_path)
    message = str(err.value)
    for part in (f"--hf {tmp_path}", "39 of the 39 weights of its base model 'bert'",
                 "bert.embeddings", "other names, e.g. encoder_wrapper.bert",
                 "mostly random model would be measured as pretrained", "save_pretrained"):
        assert part in message, (part, message)


def test_an_encoder_without_its_pooler_still_loads_with_a_new_head(tmp_path: Path):
    """A masked-LM checkpoint has no pooler: 2 of the base model's weights new, the rest
    pretrained, as before (the refusal is for a mostly random body only)."""
    torch.manual_seed(0)
    transformers.BertForMaskedLM(transformers.BertConfig(**BERT)).save_pretrained(tmp_path)
    _, _, words = load(tmp_path)
    assert "except bert.pooler.dense.bias, bert.pooler.dense.weight" in words
    assert "left out" not in words  # the masked-LM head it drops is no part of the encoder


def test_encoder_weights_the_config_has_no_place_for_are_said(tmp_path: Path):
    """config.json edited to one layer, the weights of two: transformers dropped layer 1 and the
    words said "pretrained weights from DIR", the model measured another than the one saved."""
    reference = saved_classifier(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 1}))
    model, _, words = load(tmp_path)
    ids = torch.randint(3, 50, (2, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert not torch.allclose(model(ids).logits, reference(ids).logits)  # another model
    assert "bert.encoder.layer.1." in words and "and 12 more" in words
    assert "left out: a model other than the one saved is measured" in words
    assert "num_hidden_layers" in words
