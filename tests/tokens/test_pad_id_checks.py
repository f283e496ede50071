"""The pad id of a Hugging Face decoder classifier (``GPT2ForSequenceClassification``,
``GenericForSequenceClassification``: Llama's, Gemma 3's…), which reads each example's logits at
its last token whose id is not that pad id, whatever the attention mask says.

* Without a pad id, the refusals of the clean forward and of the perturbed copies give one
  message, whose every piece of advice runs.
* Padding of another id is refused where the real lengths come from ``mask=`` alone too, and
  where a composite config keeps the pad id in its text part (``config.get_text_config()``).
* An encoder, left padding and real end tokens that ``mask=`` leaves out are measured as before.

Every model is a tiny random-init one built from its config (offline), in float64.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from senslab.measure import TokenSensitivity, token_sensitivity
from senslab.tokens import Embedding

transformers = pytest.importorskip("transformers")

#: the padding's id; the real ids are in [2, 50), so neither 0 nor 1 is a real token
PAD = 1
#: the pad id of the mismatched configs
CONFIG_PAD = 0
GPT2_TOKENS = "transformer.wte"
GEMMA3_TOKENS = "model.language_model.embed_tokens"


def right_padded(b: int = 8, t: int = 10, seed: int = 0) -> dict[str, torch.Tensor]:
    """Token ids in [2, 50), real lengths from 2 to t − 2, right-padded with :data:`PAD`."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, 50, (b, t), generator=g)
    lengths = torch.randint(2, t - 1, (b,), generator=g)
    lengths[0] = t - 2
    mask = torch.arange(t)[None] < lengths[:, None]
    return {"input_ids": ids.masked_fill(~mask, PAD), "attention_mask": mask}


def gpt2(pad_token_id: int | None = None):
    config = transformers.GPT2Config(
        vocab_size=50, n_embd=16, n_layer=2, n_head=2, n_positions=32, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, initializer_range=0.5, pad_token_id=pad_token_id)
    torch.manual_seed(0)  # test-only: HF initialises from the global RNG
    return transformers.GPT2ForSequenceClassification(config).double().eval()


def bert(pad_token_id: int):
    config = transformers.BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=32, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, pad_token_id=pad_token_id)
    torch.manual_seed(0)
    return transformers.BertForSequenceClassification(config).double().eval()


def gemma3(pad_token_id: int | None):
    """Gemma 3's vision-language classifier: its config keeps the pad id in ``text_config``
    (the top level has no ``pad_token_id``), where ``GenericForSequenceClassification`` reads
    it."""
    if not hasattr(transformers, "Gemma3ForSequenceClassification"):
        pytest.skip("this transformers has no Gemma3ForSequenceClassification")
    text = transformers.Gemma3TextConfig(
        vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, head_dim=8, max_position_embeddings=32,
        layer_types=["full_attention"], initializer_range=0.5, pad_token_id=pad_token_id)
    vision = transformers.SiglipVisionConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        image_size=28, patch_size=14)
    config = transformers.Gemma3Config(text_config=text, vision_config=vision, num_labels=2)
    assert not hasattr(config, "pad_token_id")
    torch.manual_seed(0)
    return transformers.Gemma3ForSequenceClassification(config).double().eval()


def measure(model, inputs, tokens=GPT2_TOKENS, sigma=1.0, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback to full width, no warning instead
        warnings.filterwarnings("ignore", "the standard error rests on")  # a toy's few flips
        return token_sensitivity(model, inputs, Embedding(tokens), sigma=sigma, generator=1,
                                 **options)


def refusal(model, inputs, tokens=GPT2_TOKENS, **options) -> str:
    with pytest.raises(ValueError) as info:
        measure(model, inputs, tokens, **options)
    return str(info.value)


def one_by_one(model, batch, tokens=GPT2_TOKENS, sigma=1.0, **options):
    """Every example of the right-padded ``batch`` cut to its real tokens, one ``update`` each
    (the noise stream runs on example by example as in one update of the whole batch)."""
    metric = TokenSensitivity(model, Embedding(tokens), sigma=sigma, generator=1, **options)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for i, length in enumerate(batch["attention_mask"].sum(1).tolist()):
            metric.update({k: v[i:i + 1, :length] for k, v in batch.items()})
    return metric.compute()


# -- no pad id ---------------------------------------------------------------------------------


def test_the_refusals_without_a_pad_id_are_one_message_whose_advice_runs():
    """The clean forward of several examples, a single padded example, and the perturbed
    copies of one unpadded example were refused with two messages: the copies' advised
    ``model.config.pad_token_id = tokenizer.eos_token_id`` or chunk_size=1 with
    precision='float32', which runs for an unpadded example only, and the clean forward's did
    not offer it. One message now, and both pieces of its advice run where it says."""
    batch = right_padded()
    unpadded = {k: v[:3, :2] for k, v in batch.items()}
    assert bool(unpadded["attention_mask"].all())
    several = refusal(gpt2(), unpadded)  # the clean forward
    padded = refusal(gpt2(), {k: v[1:2] for k, v in batch.items()})  # the clean read at padding
    one = {k: v[:1, :2] for k, v in batch.items()}
    copies = refusal(gpt2(), one)  # one unpadded example: its copies together
    assert several == padded == copies
    assert ("model.config.pad_token_id = tokenizer.pad_token_id" in copies
            and "model.config.pad_token_id = tokenizer.eos_token_id" in copies)
    assert "only unpadded examples measure: one per call" in copies
    assert "chunk_size=1 with precision='float32'" in copies
    # what it says does not run, does not: a batch in one call, a padded example
    one_copy = {"chunk_size": 1, "precision": "float32"}
    assert refusal(gpt2(), unpadded, **one_copy) == copies
    assert refusal(gpt2(), {k: v[1:2] for k, v in batch.items()}, **one_copy) == copies
    # the advice: one unpadded example per call, one copy per forward in float32 …
    alone = one_by_one(gpt2(), unpadded, **one_copy)
    # … measures what the model measures with its pad id set, the batch in one call
    with_id = measure(gpt2(pad_token_id=PAD), unpadded)
    assert torch.equal(alone.per_sample, with_id.per_sample)
    assert bool((with_id.per_sample > 0).any())


def test_a_composite_config_without_a_pad_id_is_refused_where_it_keeps_it():
    """Gemma 3's classifier reads ``config.text_config.pad_token_id``; its config has no
    top-level one, so a single padded example without a pad id was not refused, and one copy
    per forward in float32 (what the copies' refusal advised) measured it at its padding
    without a word: 0 where it measures 0.43. Refused, naming where the id goes; set there,
    the padded example measures as the unpadded one."""
    one = {k: v[2:3] for k, v in right_padded().items()}
    assert not bool(one["attention_mask"][0, -1])
    message = refusal(gemma3(None), one, GEMMA3_TOKENS, sigma=3.0, chunk_size=1,
                      precision="float32", trim_padding=False)
    assert "config.text_config.pad_token_id is None" in message
    assert "model.config.text_config.pad_token_id = tokenizer.pad_token_id" in message
    fixed = gemma3(None)
    fixed.config.text_config.pad_token_id = PAD  # the fix it names
    padded = measure(fixed, one, GEMMA3_TOKENS, sigma=3.0)
    width = int(one["attention_mask"].sum())
    unpadded = measure(gemma3(None), {k: v[:, :width] for k, v in one.items()}, GEMMA3_TOKENS,
                       sigma=3.0, chunk_size=1, precision="float32")
    assert torch.equal(padded.per_sample, unpadded.per_sample)
    assert padded.estimate > 0.25


# -- padding of another id -----------------------------------------------------------------------


@pytest.mark.parametrize("options", [{}, {"trim_padding": False}])
def test_padding_of_another_id_under_mask_alone_is_refused(options):
    """Token ids and ``mask=``, no attention mask: the GPT-2 classifier (pad id 0, padding of
    id 1) was read at its padding (0.109 where its examples measure 0.059), without a word also by
    default (the padding-aware batching falls back quietly where mask= alone says which
    tokens are real). Refused with both fixes; set as it says, the batch measures what its
    examples measure unpadded, one by one."""
    batch = right_padded()
    ids, real = batch["input_ids"], batch["attention_mask"]
    message = refusal(gpt2(pad_token_id=CONFIG_PAD), ids, mask=real, **options)
    assert f"pad id {CONFIG_PAD} (config.pad_token_id), but mask= ends" in message
    assert f"model.config.pad_token_id = tokenizer.pad_token_id; here {PAD})" in message
    assert "pass the attention mask too" in message
    assert refusal(gpt2(pad_token_id=CONFIG_PAD), {"input_ids": ids}, mask=real) == message
    fixed = measure(gpt2(pad_token_id=PAD), ids, mask=real, **options)
    assert torch.equal(fixed.per_sample, one_by_one(gpt2(pad_token_id=PAD), batch).per_sample)
    assert 0 < fixed.estimate < 1


def test_end_tokens_mask_alone_leaves_out_are_refused_only_at_one_id():
    """``mask=`` may leave out real tokens, such as an end token. Where the model reads the
    examples after mask='s end at ids that differ, those are real tokens (padding repeats
    one id): measured as before, as with the attention mask beside mask=. At one id they may
    be padding: refused (before: measured quietly), and the fix for an end token — the
    attention mask too — measures what the model reads."""
    batch = right_padded()
    real = batch["attention_mask"]
    ids = batch["input_ids"].masked_fill(~real, CONFIG_PAD)  # padding of the right id
    but_last = real & (torch.arange(ids.shape[1])[None] < real.sum(1, keepdim=True) - 1)
    model = gpt2(pad_token_id=CONFIG_PAD)
    # one end token, id 2, in every example: ambiguous
    last = real.sum(1) - 1
    ended = ids.scatter(1, last[:, None], 2)
    message = refusal(model, ended, mask=but_last)
    assert "of id 2" in message and "pass the attention mask too" in message
    with_mask = measure(model, {"input_ids": ended, "attention_mask": real}, mask=but_last)
    plain = measure(model, {"input_ids": ended, "attention_mask": real}, mask=but_last,
                    trim_padding=False)
    assert torch.equal(with_mask.per_sample, plain.per_sample)
    assert bool((with_mask.per_sample > 0).any())
    # different last tokens: real ones, measured as with the attention mask
    assert len(ids.gather(1, last[:, None]).unique()) > 1
    metric = TokenSensitivity(model, Embedding(GPT2_TOKENS), sigma=1.0, generator=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a mask may leave out real tokens: no warning
        metric.update(ids, but_last)
    beside = measure(model, {"input_ids": ids, "attention_mask": real}, mask=but_last)
    assert torch.equal(metric.compute().per_sample, beside.per_sample)


def test_padding_of_another_id_than_a_composite_configs_is_refused():
    """Gemma 3's classifier (pad id 0 in ``config.text_config``, none at the top level) fed
    padding of id 1 under its attention mask: read at the padding (0.056 where its examples
    measure 0.24), behind the padding-aware batching's warning, or with trim_padding=False
    without a word. Refused, naming
    ``config.text_config.pad_token_id``; set there, the batch measures what its examples
    measure unpadded, one by one."""
    batch = right_padded()
    for options in ({}, {"trim_padding": False}):
        message = refusal(gemma3(CONFIG_PAD), batch, GEMMA3_TOKENS, sigma=3.0, **options)
        assert (f"pad id {CONFIG_PAD} (config.text_config.pad_token_id), whatever the attention"
                in message)
        assert f"model.config.text_config.pad_token_id = tokenizer.pad_token_id; here {PAD}" \
            in message
    fixed = gemma3(CONFIG_PAD)
    fixed.config.text_config.pad_token_id = PAD
    padded = measure(fixed, batch, GEMMA3_TOKENS, sigma=3.0)
    assert torch.equal(padded.per_sample,
                       one_by_one(fixed, batch, GEMMA3_TOKENS, sigma=3.0).per_sample)
    assert bool((padded.per_sample > 0).any())


def test_an_encoder_and_left_padding_under_mask_alone_measure_as_before():
    """The same ids and ``mask=`` that refuse the GPT-2 classifier: a BERT classifier (pad id
    0, padding of id 1) reads [CLS] and measures as with padding of its pad id; left padding
    leaves the last token last, and GPT-2 measures as with its pad id set."""
    batch = right_padded()
    ids, real = batch["input_ids"], batch["attention_mask"]
    with pytest.raises(ValueError, match="but mask= ends"):
        measure(gpt2(pad_token_id=CONFIG_PAD), ids, mask=real)
    ln = "bert.embeddings.LayerNorm"
    as_pad = ids.masked_fill(~real, CONFIG_PAD)
    encoder = measure(bert(CONFIG_PAD), ids, ln, mask=real)
    assert torch.equal(encoder.per_sample, measure(bert(CONFIG_PAD), as_pad, ln,
                                                   mask=real).per_sample)
    assert bool((encoder.per_sample > 0).any())
    lengths = real.sum(1)
    order = (torch.arange(ids.shape[1])[None] + lengths[:, None]) % ids.shape[1]
    left_ids, left_real = ids.gather(1, order), real.gather(1, order)
    assert bool(left_real[:, -1].all()) and not bool(left_real[:, 0].all())
    wrong = measure(gpt2(pad_token_id=CONFIG_PAD), left_ids, mask=left_real)
    right = measure(gpt2(pad_token_id=PAD), left_ids, mask=left_real)
    assert torch.equal(wrong.per_sample, right.per_sample)


def test_unmasked_padding_of_a_composite_configs_pad_id_is_refused():
    """Token ids alone (no mask) ending in Gemma 3's pad id, kept in ``config.text_config``:
    the padding would be perturbed as tokens that never flip. Refused naming where the id is,
    as for a config that keeps it at the top level."""
    batch = right_padded()
    ids = batch["input_ids"].masked_fill(~batch["attention_mask"], CONFIG_PAD)
    message = refusal(gemma3(CONFIG_PAD), ids, GEMMA3_TOKENS)
    assert f"pad id {CONFIG_PAD} (config.text_config.pad_token_id)" in message
    assert "pass the attention mask" in message
