"""A researcher's own Hugging Face classifier measured in three lines: heads and masks whose
reading senslab used to get wrong without a word, or refuse without need.

* A decoder classifier (GPT-2's) reads each example at its last token whose id is not its pad
  id, so tokens of that id the attention mask marks real after it (an all-ones mask over
  right padding; an end token whose id is the pad id, pad = eos) can never flip: measured as
  tokens, they diluted the rate (0.086 where the right-masked batch gives 0.165). Refused.
* A multi-label head of one label is one sigmoid, a binary classifier: the sign of its logit
  is its prediction, so it measures as ``output_kind="logits"`` does instead of being refused
  for an argmax over labels it does not have.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from senslab import Embedding, token_sensitivity

transformers = pytest.importorskip("transformers")

PAD = 0
LENGTHS = (10, 9, 7, 5, 10, 3, 8, 6)


def batch() -> dict[str, torch.Tensor]:
    """Right-padded token ids (real ids in [5, 100), padding the pad id 0) and their mask."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 100, (len(LENGTHS), max(LENGTHS)), generator=g)
    mask = (torch.arange(ids.shape[1])[None] < torch.tensor(LENGTHS)[:, None]).long()
    return {"input_ids": ids.masked_fill(mask == 0, PAD), "attention_mask": mask}


def gpt2() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=2,
                                     n_positions=40, num_labels=3, pad_token_id=PAD,
                                     bos_token_id=99, eos_token_id=99)
    return transformers.GPT2ForSequenceClassification(config).eval()


def bert(**config) -> torch.nn.Module:
    torch.manual_seed(0)
    return transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=40, **config)).eval()


def measure(model, inputs, module, **options):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "the standard error rests on")  # a toy's few flips
        return token_sensitivity(model, inputs, Embedding(module), sigma=1.0, generator=0,
                                 repeats=2, precision="float32", **options)


@pytest.mark.parametrize("trim_padding", [True, False])
def test_pad_id_tokens_a_decoder_classifier_never_reads_are_refused(trim_padding):
    """An all-ones attention mask over GPT-2's right padding measured 0.086 for the 0.165 of
    the right-masked batch: the padding after the position GPT-2 reads got noise and never
    flipped. Refused with both fixes; the right mask, and mask= leaving them out, measure the
    right-masked batch's number."""
    model, inputs = gpt2(), batch()
    want = measure(model, inputs, "transformer.wte", trim_padding=trim_padding)
    ones = {**inputs, "attention_mask": torch.ones_like(inputs["attention_mask"])}
    with pytest.raises(ValueError, match=r"pad id 0 \(config\.pad_token_id\).*'attention_mask' "
                                         r"entry marks tokens of id 0 after that position.*"
                                         r"never flip.*mark them as padding.*pad with another id"):
        measure(model, ones, "transformer.wte", trim_padding=trim_padding)
    fixed = measure(model, ones, "transformer.wte", trim_padding=trim_padding,
                    mask=inputs["attention_mask"].bool())
    assert fixed.estimate == pytest.approx(want.estimate) and want.estimate > 0
    assert torch.allclose(fixed.per_sample, want.per_sample)


def test_an_end_token_whose_id_is_the_pad_id_is_refused_for_a_decoder_classifier():
    """pad = eos, and an example ends with that id as a real token: GPT-2 reads the token
    before it, which the end token cannot change. Refused (also through mask= alone)."""
    model, inputs = gpt2(), batch()
    ids = inputs["input_ids"].clone()
    ids[0, -1] = PAD  # example 0 (all 10 tokens real) ends with the pad id
    with pytest.raises(ValueError, match=r"example\(s\) \[0\] are read before them"):
        measure(model, {**inputs, "input_ids": ids}, "transformer.wte")
    with pytest.raises(ValueError, match=r"mask= marks tokens of id 0"):
        measure(model, ids, "transformer.wte", mask=inputs["attention_mask"].bool())


def test_an_encoder_that_reads_its_pad_id_tokens_is_measured():
    """BERT attends to every token its mask marks real, pad id or not: tokens of its pad id
    after the last other id change its output, so the check lets it through."""
    model, inputs = bert(num_labels=3), batch()
    ones = {**inputs, "attention_mask": torch.ones_like(inputs["attention_mask"])}
    r = measure(model, ones, "bert.embeddings.LayerNorm")
    assert r.num_examples == len(LENGTHS)


def test_a_multi_label_head_of_one_label_reads_its_logit():
    """num_labels=1 with problem_type="multi_label_classification" is one sigmoid (a binary
    classifier trained with BCE on one logit): it was refused for an argmax over labels; it
    measures as output_kind="logits" does. Several labels stay refused."""
    inputs = batch()
    one = bert(num_labels=1, problem_type="multi_label_classification")
    got = measure(one, inputs, "bert.embeddings.LayerNorm")
    want = measure(one, inputs, "bert.embeddings.LayerNorm", output_kind="logits")
    assert got.estimate == want.estimate
    assert torch.equal(got.per_sample, want.per_sample)
    three = bert(num_labels=3, problem_type="multi_label_classification")
    with pytest.raises(ValueError, match="multi-label head"):
        measure(three, inputs, "bert.embeddings.LayerNorm")
