"""What ``senslab measure --hf`` loads and feeds a pretrained model: the precision its weights are
measured in, the token its head reads, the space its pixels are in, and a head that does not fit
(tiny models built from configs, offline)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from senslab.cli import main
from senslab.models import pretrained

transformers = pytest.importorskip("transformers")

TINY = {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
        "intermediate_size": 24}


def _vit(path: Path, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    torch.manual_seed(0)  # test-only: HF initialises from the global RNG
    model = transformers.ViTForImageClassification(transformers.ViTConfig(
        **TINY, image_size=16, patch_size=4, num_channels=3, num_labels=10,
        initializer_range=0.5)).to(dtype)
    model.save_pretrained(path)
    return model


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_weights_stored_in_half_precision_are_measured_in_float32(tmp_path: Path,
                                                                  dtype: torch.dtype):
    """transformers 5 loads a config's dtype as it is (4.x loaded float32): before, a folder
    saved in bfloat16 was measured in bfloat16, even under --precision float32. Now its weights
    are the stored values exactly, as float32, and the words name the stored dtype."""
    saved = _vit(tmp_path, dtype)
    assert json.loads((tmp_path / "config.json").read_text()).get("dtype") == str(
        dtype).removeprefix("torch.")
    model, _, words = pretrained.load_hf(str(tmp_path), pretrained.hf_config(str(tmp_path)),
                                         0, 10)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    for (key, got), want in zip(model.state_dict().items(), saved.state_dict().values(),
                                strict=True):
        assert torch.equal(got, want.float()), key  # upcast exactly, nothing re-initialised
    assert f"(stored as {str(dtype).removeprefix('torch.')}, loaded as float32, exactly)" in words
    assert "newly initialised" not in words


def test_float32_weights_get_no_dtype_words(tmp_path: Path):
    _vit(tmp_path)
    model, _, words = pretrained.load_hf(str(tmp_path), pretrained.hf_config(str(tmp_path)),
                                         0, 10)
    assert words == f"pretrained weights from {tmp_path}" and not model.training


def test_a_new_head_is_seeded_and_leaves_the_global_rng_alone(tmp_path: Path):
    torch.manual_seed(0)
    transformers.BertModel(transformers.BertConfig(
        **TINY, vocab_size=50, max_position_embeddings=16)).save_pretrained(tmp_path)
    config = pretrained.hf_config(str(tmp_path))
    heads = []
    for seed in (3, 3, 4):
        torch.manual_seed(11)
        model, _, words = pretrained.load_hf(str(tmp_path), config, seed, 2)
        after = torch.rand(3)  # the global RNG continues as if nothing had been drawn
        torch.manual_seed(11)
        assert torch.equal(after, torch.rand(3))
        assert f"classifier.bias, classifier.weight, newly initialised (seed {seed})" in words
        heads.append(model.classifier.weight.detach().clone())
    assert torch.equal(heads[0], heads[1]) and not torch.equal(heads[0], heads[2])


def test_a_head_of_another_shape_is_a_usage_error_naming_the_architecture(tmp_path: Path):
    """A token-classification checkpoint (an NER model, 9 labels) measured on 2 classes: a new
    sequence head is built and transformers refuses the 9-row classifier. Before: its
    RuntimeError, which the command called an unexpected bug."""
    torch.manual_seed(0)
    transformers.BertForTokenClassification(transformers.BertConfig(
        **TINY, vocab_size=50, max_position_embeddings=16, num_labels=9)).save_pretrained(
        tmp_path)
    with pytest.raises(ValueError) as err:
        pretrained.load_hf(str(tmp_path), pretrained.hf_config(str(tmp_path)), 0, 2)
    for part in (f"--hf {tmp_path}", "BertForTokenClassification", "new 2-label sequence",
                 "another shape", "Measure a model saved with a classification head"):
        assert part in str(err.value), (part, str(err.value))


def _gpt2(pad_token_id: int | None) -> torch.nn.Module:
    torch.manual_seed(0)
    return transformers.GPT2ForSequenceClassification(transformers.GPT2Config(
        n_embd=16, n_layer=1, n_head=2, vocab_size=20, n_positions=16, num_labels=2,
        pad_token_id=pad_token_id)).eval()


def test_a_decoder_head_reads_the_last_real_token_when_the_data_pads_with_another_id():
    """The config says pad 5, the data pads with 0: GPT-2's head reads the last token that is
    not 5, which was the last pad of every short row. Each padded row must give the logits of
    the same row unpadded (alone, no pad at all)."""
    model = _gpt2(pad_token_id=5)
    rows = [[3, 7, 9], [4, 8, 11, 12, 13, 14]]  # no 0 and no 5 among the real tokens
    ids = torch.zeros(2, 6, dtype=torch.long)
    mask = torch.zeros(2, 6, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, :len(row)], mask[i, :len(row)] = torch.tensor(row), 1
    with torch.no_grad():
        alone = torch.cat([model(input_ids=torch.tensor([row])).logits for row in rows])
        prepare, words = pretrained.text_prep(model, 0)
        padded = model(**prepare({"input_ids": ids, "attention_mask": mask})).logits
    assert torch.allclose(padded, alone, atol=1e-5), (padded, alone)
    assert words == ("; the model's pad_token_id 5 set to the tokenizer's (0), the id the data "
                     "is padded with")


@pytest.mark.parametrize("own", [None, 0], ids=["no-pad-id", "same-pad-id"])
def test_a_missing_or_matching_pad_token_id(own: int | None):
    model = _gpt2(pad_token_id=own)
    _, words = pretrained.text_prep(model, 0)
    assert model.config.pad_token_id == 0
    assert words == ("" if own == 0 else "; the model's pad_token_id set to the tokenizer's (0)")


def test_images_normalised_already_are_refused_not_normalised_twice(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """--set data.options.normalize=minus_one_one hands the model's processor [−1, 1] images,
    which it normalised again, while the summary said "[0, 1] pixels". Before: exit 0 and a
    number for inputs unlike the model's."""
    model = _vit(tmp_path)
    processor = transformers.ViTImageProcessor(image_mean=[0.5] * 3, image_std=[0.25] * 3,
                                               size={"height": 16, "width": 16})
    processor.save_pretrained(tmp_path)
    pixels = torch.rand(2, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    prepare, words, norm = pretrained.image_prep(model, processor, pixels)
    assert norm == ((0.5,) * 3, (0.25,) * 3) and "normalised with the model's mean/std" in words
    assert torch.allclose(prepare(torch.ones(1, 1, 8, 8)), torch.full((1, 3, 16, 16), 2.0))
    with pytest.raises(ValueError, match="normalised twice; drop --set data.options.normalize"):
        pretrained.image_prep(model, processor, pixels * 2 - 1)
    code = main(["measure", "--hf", str(tmp_path), "--num-examples", "4", "--threads", "1",
                 "--set", "data.options.normalize=minus_one_one"])
    out, err = capsys.readouterr()
    assert code == 2 and not out.strip(), out
    assert "the images range over -1 to 1" in err and "normalised twice" in err, err
