"""Which head of a Hugging Face checkpoint ``senslab measure --hf`` reads, and what it says about
it: a head of another kind that fits the new classification head, a config whose labels
disagree with its head's weights, an image processor that fails to load, a config saved with
``return_dict=False`` and a causal LM's next-token prediction (tiny models built from configs,
saved to a temporary folder and loaded as the command loads them; offline)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

from senslab import token_sensitivity
from senslab.models import pretrained
from senslab.tokens import auto_tokens

transformers = pytest.importorskip("transformers")

BERT = {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
        "intermediate_size": 24, "vocab_size": 50, "max_position_embeddings": 16,
        "initializer_range": 0.5}


def load(path: Path, labels: int = 2):
    return pretrained.load_hf(str(path), pretrained.hf_config(str(path)), 0, labels)


def saved(cls, config, path: Path):
    torch.manual_seed(0)  # test-only: HF initialises from the global RNG
    model = cls(config).eval()
    model.save_pretrained(path)
    return model


def batch(rows: int = 4, width: int = 8, vocab: int = 50) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return {"input_ids": torch.randint(3, vocab, (rows, width), generator=g),
            "attention_mask": torch.ones(rows, width, dtype=torch.long)}


@pytest.mark.parametrize("kind", ["bert", "distilbert"])
def test_a_token_classifier_whose_head_fits_the_new_head_is_refused(tmp_path: Path, kind: str):
    """A 2-label token classifier has a ``classifier`` of the new 2-label sequence head's name
    and shape. Before: it was loaded into that head and applied to the pooled output it was
    never trained on, while the words said "pretrained weights" (nothing newly initialised but
    the pooler). Its encoder alone, saved as the message says, gets a new, seeded head."""
    if kind == "bert":
        cls, config = transformers.BertForTokenClassification, transformers.BertConfig(
            **BERT, num_labels=2)
    else:
        cls, config = transformers.DistilBertForTokenClassification, transformers.DistilBertConfig(
            dim=16, n_layers=1, n_heads=2, hidden_dim=24, vocab_size=50,
            max_position_embeddings=16, num_labels=2)
    token = saved(cls, config, tmp_path / "ner")
    with pytest.raises(ValueError, match=rf"names {cls.__name__}, whose head is of another kind"
                                         r".*classifier\.bias, classifier\.weight.*"
                                         r"model\.base_model\.save_pretrained\(DIR\)"):
        load(tmp_path / "ner")
    token.base_model.save_pretrained(tmp_path / "encoder")
    model, _, words = load(tmp_path / "encoder")
    assert "classifier.bias, classifier.weight" in words and "newly initialised (seed 0)" in words
    assert not torch.equal(model.classifier.weight, token.classifier.weight)
    ours = model.base_model.state_dict()
    for key, value in token.base_model.state_dict().items():
        assert torch.equal(ours[key], value), key  # the encoder is the checkpoint's


@pytest.mark.parametrize("cls", ["BertForMaskedLM", "BertModel", "BertForQuestionAnswering",
                                 "BertForSequenceClassification"])
def test_other_checkpoints_load_as_before(tmp_path: Path, cls: str):
    """Guards: a checkpoint whose head has other names (a masked LM, a QA model) or none gets a
    new head, said; a sequence classifier keeps its own."""
    model_cls = getattr(transformers, cls)
    ckpt = saved(model_cls, transformers.BertConfig(**BERT, num_labels=2), tmp_path)
    model, _, words = load(tmp_path)
    assert type(model).__name__ == "BertForSequenceClassification"
    if cls == "BertForSequenceClassification":
        assert words == f"pretrained weights from {tmp_path}"
        assert torch.equal(model.classifier.weight, ckpt.classifier.weight)
    else:
        assert "classifier.bias, classifier.weight" in words and "newly initialised" in words


def test_config_labels_that_disagree_with_the_heads_weights_are_a_usage_error(tmp_path: Path):
    """id2label edited to 3 labels on a 2-label checkpoint. Before: transformers' RuntimeError,
    which only points at a report above and which the command called a bug."""
    saved(transformers.BertForSequenceClassification,
          transformers.BertConfig(**BERT, num_labels=2), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["id2label"] = {"0": "a", "1": "b", "2": "c"}
    config["label2id"] = {"a": 0, "b": 1, "c": 2}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"config\.json gives BertForSequenceClassification 3 "
                                         r"labels.*another number of rows.*id2label"):
        load(tmp_path)


def _vit(path: Path) -> None:
    saved(transformers.ViTForImageClassification, transformers.ViTConfig(
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=24,
        image_size=16, patch_size=4, num_channels=3, num_labels=10), path)


@pytest.mark.parametrize("broken", ["json", "type"])
def test_an_image_processor_that_fails_to_load_is_refused(tmp_path: Path, broken: str):
    """The folder holds a processor (mean 0.5, std 0.25) that transformers cannot load (a cut
    JSON file, an unknown processor type). Before: it was dropped, the model measured on [0, 1]
    pixels, and the words said "no normalisation found" as for a folder without one."""
    _vit(tmp_path)
    transformers.ViTImageProcessor(image_mean=[0.5] * 3, image_std=[0.25] * 3).save_pretrained(
        tmp_path)
    file = tmp_path / "preprocessor_config.json"
    if broken == "json":
        file.write_text(file.read_text()[:-10])
    else:
        spec = json.loads(file.read_text())
        spec["image_processor_type"] = "NoSuchImageProcessor"
        file.write_text(json.dumps(spec))
    with pytest.raises(ValueError, match=rf"its image processor \({file}\) failed to load.*"
                                         r"delete it to measure on \[0, 1\] pixels"):
        load(tmp_path, 10)


def test_a_folder_without_an_image_processor_is_measured_on_pixels_and_says_so(tmp_path: Path):
    _vit(tmp_path)
    model, processor, _ = load(tmp_path, 10)
    assert processor is None
    prepare, words, norm = pretrained.image_prep(model, processor, torch.rand(2, 3, 16, 16))
    assert norm is None and "no normalisation found (the model gets [0, 1] pixels)" in words


def test_a_config_saved_with_return_dict_false_is_measured(tmp_path: Path):
    """config.json with return_dict=False and output_hidden_states=True: the model returned a
    tuple (logits, hidden states) and the command failed, naming output= (which it has not).
    Now it is read as the same model with return_dict on, whose number it gives."""
    config = transformers.BertConfig(**BERT, num_labels=2, return_dict=False,
                                     output_hidden_states=True)
    saved(transformers.BertForSequenceClassification, config, tmp_path)
    model, _, _ = load(tmp_path)
    x = batch()
    got = token_sensitivity(model, x, auto_tokens(model), sigma=1.0, repeats=2, generator=0)
    ref = transformers.BertForSequenceClassification.from_pretrained(
        tmp_path, return_dict=True, output_hidden_states=False).eval()
    want = token_sensitivity(ref, x, auto_tokens(ref), sigma=1.0, repeats=2, generator=0)
    assert torch.equal(got.per_sample, want.per_sample) and got.estimate > 0


def test_a_causal_lm_says_it_measures_the_next_token_at_the_last_real_token(tmp_path: Path):
    """A *ForCausalLM is read with its own head: (batch, positions, vocabulary) logits, read at
    each example's last real token. Before, the words said only "pretrained weights", and the
    config's num_labels (2) matched a 2-class data set. The reading is checked by padding: the
    numbers do not depend on what the (right) padding holds."""
    config = transformers.LlamaConfig(
        vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
        initializer_range=0.5, pad_token_id=0)
    saved(transformers.LlamaForCausalLM, config, tmp_path)
    model, _, words = load(tmp_path)
    assert words.endswith("; its own language-model head: the prediction measured is the next "
                          "token (argmax over its 40-token vocabulary) at each example's last "
                          "real token, not a class of the data")
    x = batch(4, 8, 40)
    lengths = torch.tensor([3, 7, 5, 8])
    real = torch.arange(8)[None] < lengths[:, None]
    per_sample = []
    for pad in (0, 7):
        padded = {"input_ids": torch.where(real, x["input_ids"], pad),
                  "attention_mask": real.long()}
        prepare, _ = pretrained.text_prep(model, 0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # few-flips notes
            r = token_sensitivity(model, prepare(padded), auto_tokens(model), sigma=1.0,
                                  repeats=4, generator=0)
        per_sample.append(r.per_sample)
    # read at a padding position, the two paddings' logits (and so their flips) would differ
    assert torch.equal(per_sample[0], per_sample[1]) and per_sample[0].sum() > 0
