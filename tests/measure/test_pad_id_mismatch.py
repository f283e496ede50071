"""A Hugging Face decoder classifier (``GPT2ForSequenceClassification``, Llama's, OPT's…) reads
each example's logits at its last token whose id is not ``config.pad_token_id``, whatever the
attention mask says: inputs padded with another id are read at their padding, a wrong number.
Refused with both ids and the fix, only where it moves the position read; and the advice of the
refusal for a classifier without any pad id (``chunk_size=1``) is one that runs."""

from __future__ import annotations

import warnings

import pytest
import torch

from senslab.measure import TokenSensitivity, token_sensitivity
from senslab.tokens import Embedding

from .test_padding import PAD, hf_bert, right_padded
from .test_refusals_come_first import gpt2

transformers = pytest.importorskip("transformers")

#: right_padded()'s real ids are in [2, 50): the config's pad id 0 is none of them
CONFIG_PAD = 0
MISMATCH = (rf"last token whose id is not its pad id {CONFIG_PAD} \(config\.pad_token_id\), "
            rf"whatever the attention mask says, but the padding of the inputs \(where "
            rf"'attention_mask' is 0\) holds id {PAD}: .*at their padding.*"
            rf"model\.config\.pad_token_id = tokenizer\.pad_token_id; here {PAD}\), or pad the "
            rf"inputs with {CONFIG_PAD}")


def measure(model, batch, tokens="transformer.wte", **options):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback to full width, no warning instead
        warnings.filterwarnings("ignore", "the standard error rests on")  # a toy's few flips
        return token_sensitivity(model, batch, Embedding(tokens), sigma=1.0, generator=1,
                                 **options)


def one_by_one(model, batch, tokens="transformer.wte"):
    """Every example of the right-padded ``batch`` cut to its real tokens, one ``update`` each:
    the noise stream runs on example by example as in one update of the whole batch."""
    metric = TokenSensitivity(model, Embedding(tokens), sigma=1.0, generator=1)
    for i, length in enumerate(batch["attention_mask"].sum(1).tolist()):
        metric.update({k: v[i:i + 1, :length] for k, v in batch.items()})
    return metric.compute()


def left_padded(batch):
    """``batch``'s examples with their padding moved before the real tokens."""
    lengths = batch["attention_mask"].sum(1)
    t = batch["input_ids"].shape[1]
    order = (torch.arange(t)[None] + lengths[:, None]) % t  # each row rolled by its padding
    return {k: v.gather(1, order) for k, v in batch.items()}


@pytest.mark.parametrize("options", [{}, {"trim_padding": False},
                                     {"chunk_size": 1, "precision": "float32"}])
def test_padding_of_another_id_is_refused_and_the_fix_measures_the_unpadded_examples(options):
    """Config pad id 0, inputs padded with 1 under their attention mask: the clean logits and
    the copies' were read at the padding, behind the padding-aware batching's warning (its
    fallback to full width) or, with trim_padding=False, without a word: 0 for every example,
    where they measure 0.25 unpadded (one 0.75). Refused; set as the message says, the batch
    measures exactly what its examples measure unpadded, one by one."""
    batch = right_padded()
    with pytest.raises(ValueError, match=MISMATCH):
        measure(gpt2(pad_token_id=CONFIG_PAD), batch, **options)
    fixed = gpt2(pad_token_id=CONFIG_PAD)
    fixed.config.pad_token_id = PAD  # the fix: the id the inputs are padded with
    padded = measure(fixed, batch)
    assert torch.equal(padded.per_sample, one_by_one(fixed, batch).per_sample)
    assert 0 < padded.estimate < 1 and bool((padded.per_sample > 0.5).any())


def test_only_a_position_the_pad_id_moves_is_refused():
    """Padding of another id is refused only where the model is seen to read by the pad id at
    a position it moves. A BERT classifier (config pad id 0, padding 1) reads [CLS]: it
    measures as with padding of its pad id. Left padding leaves the last token last: a
    GPT-2 classifier measures as with its pad id set."""
    batch = right_padded()
    bert = hf_bert()
    bert.config.pad_token_id = CONFIG_PAD
    ln = "bert.embeddings.LayerNorm"
    as_pad = {**batch, "input_ids": batch["input_ids"].masked_fill(
        ~batch["attention_mask"], CONFIG_PAD)}
    assert torch.equal(measure(bert, batch, ln).per_sample, measure(bert, as_pad, ln).per_sample)
    # and the refusal is not the encoder's: a GPT-2 fed the same batch is refused
    with pytest.raises(ValueError, match=MISMATCH):
        measure(gpt2(pad_token_id=CONFIG_PAD), batch)
    left = left_padded(batch)
    # positions counted from each example's first real token: GPT-2 reads left padding so
    left["position_ids"] = (left["attention_mask"].long().cumsum(-1) - 1).clamp(min=0)
    assert bool(left["attention_mask"][:, -1].all())
    wrong = measure(gpt2(pad_token_id=CONFIG_PAD), left, trim_padding=False)
    right = measure(gpt2(pad_token_id=PAD), left, trim_padding=False)
    assert torch.equal(wrong.per_sample, right.per_sample)


def test_the_advice_for_a_classifier_without_a_pad_id_runs():
    """One unpadded example is a batch GPT-2 takes without a pad id, its perturbed copies are
    not. The refusal advised chunk_size=1, which under the default precision="auto" was
    refused again with the same advice (its check evaluates copies together); it now names
    precision='float32' too, and the advised call measures what the model measures with its
    pad id set."""
    one = {k: v[1:2, :4] for k, v in right_padded().items()}
    assert bool(one["attention_mask"].all())
    advice = r"chunk_size=1 with precision='float32'"
    with pytest.raises(ValueError, match=advice):
        measure(gpt2(), one)
    with pytest.raises(ValueError, match=advice):
        measure(gpt2(), one, chunk_size=1)  # what it advised alone: refused, and says why
    advised = measure(gpt2(), one, chunk_size=1, precision="float32")
    with_id = measure(gpt2(pad_token_id=PAD), one)
    assert torch.equal(advised.per_sample, with_id.per_sample)
    assert advised.estimate > 0.5
