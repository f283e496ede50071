"""Audit of session 76: ``position=None`` keeps a per-position output whole for
``compare="l1"/"l2"``, and the padding rows' outputs entered the distance — a causal LM's
padding queries attend to the real tokens, so they move with the noise: an example measured
1.1671 alone and 1.2098 as the first of a right-padded batch, and trimming fell back to full
width with a warning that blamed the attention mask. The distance now counts each example's
real rows only."""

from __future__ import annotations

import warnings

import pytest
import torch

from senslab import token_sensitivity
from senslab.tokens import auto_tokens

transformers = pytest.importorskip("transformers")

LENGTHS = (7, 3, 10, 5)
OPTS = {"sigma": 1.0, "repeats": 4, "precision": "float32", "generator": 0}


def causal_lm():
    config = transformers.GPT2Config(vocab_size=50, n_embd=32, n_layer=2, n_head=4,
                                     n_positions=40, pad_token_id=5, eos_token_id=5,
                                     bos_token_id=5)
    torch.manual_seed(0)  # test-only: init
    return transformers.GPT2LMHeadModel(config).eval()


def sentences() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return [torch.randint(6, 50, (n,), generator=g) for n in LENGTHS]


def padded(seqs: list[torch.Tensor], order: list[int]) -> dict[str, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(order), width), 5)
    mask = torch.zeros(len(order), width, dtype=torch.long)
    for row, k in enumerate(order):
        ids[row, :len(seqs[k])] = seqs[k]
        mask[row, :len(seqs[k])] = 1
    return {"input_ids": ids, "attention_mask": mask}


@pytest.mark.parametrize("compare", ["l2", "l1"])
@pytest.mark.parametrize("trim", [True, False])
def test_whole_output_distance_counts_real_rows_only(compare, trim):
    """Each example measured alone (unpadded) and as the first of a padded batch — the noise
    streams run example by example, so it draws the same noise — gives the same distance,
    trimmed or not, and no warning."""
    model, seqs = causal_lm(), sentences()
    tokens = auto_tokens(model, position=None)
    for k in range(len(seqs)):
        order = [k] + [i for i in range(len(seqs)) if i != k]
        alone = {"input_ids": seqs[k][None], "attention_mask": torch.ones(1, len(seqs[k]),
                                                                          dtype=torch.long)}
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            batched = token_sensitivity(model, padded(seqs, order), tokens, compare=compare,
                                        trim_padding=trim, **OPTS)
        one = token_sensitivity(model, alone, tokens, compare=compare, **OPTS)
        assert float(batched.per_sample[0]) > 0.1
        assert float(batched.per_sample[0]) == pytest.approx(float(one.per_sample[0]),
                                                             rel=1e-5)


# ------------------------------------------------ an encoder-decoder model's decoder positions
def t5():
    config = transformers.T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                                   num_heads=4, decoder_start_token_id=0, pad_token_id=0,
                                   eos_token_id=1, dropout_rate=0.0)
    torch.manual_seed(0)  # test-only: init
    return transformers.T5ForConditionalGeneration(config).eval()


def teacher_forced() -> dict[str, torch.Tensor]:
    """Right-padded inputs, and decoder_input_ids of the inputs' length (padding='max_length')."""
    g = torch.Generator().manual_seed(1)
    lengths = torch.tensor([8, 5, 3, 6])
    mask = (torch.arange(8)[None] < lengths[:, None]).long()
    ids = torch.randint(2, 64, (4, 8), generator=g) * mask
    decoder = torch.randint(2, 64, (4, 8), generator=g)
    decoder[:, 0] = 0
    return {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": decoder}


@pytest.mark.parametrize("position", [-1, 6])
def test_a_position_of_the_inputs_is_refused_on_decoder_outputs(position):
    """position=-1 read each example at the decoder position of its encoder's last real token
    (7, 4, 2, 5), and position=6 was refused for examples whose decoder has 8 real positions:
    a position counts the inputs' tokens, so it is refused, naming output=."""
    model = t5()
    with pytest.raises(ValueError, match=r"encoder-decoder.*output=lambda o: o\.logits\[:, k\]"):
        token_sensitivity(model, teacher_forced(), auto_tokens(model, position=position),
                          compare="l2", **OPTS)


def test_decoder_inputs_are_never_cut_by_padding_aware_batching():
    """Trimming cut decoder_input_ids at the encoder's extent (shapes (1, 3), (4, 5)…): the
    decoder lost its later positions. Now only the encoder's inputs are cut, and a decoder
    position chosen with output= measures as at full width."""
    model, batch = t5(), teacher_forced()
    widths: list[int] = []
    hook = model.register_forward_pre_hook(
        lambda m, args, kwargs: widths.append(kwargs["decoder_input_ids"].shape[1]),
        with_kwargs=True)
    last = {"output": lambda o: o.logits[:, -1], "compare": "l2", **OPTS}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            metric = token_sensitivity(model, batch, auto_tokens(model), **last)
    finally:
        hook.remove()
    assert set(widths) == {8}
    full = token_sensitivity(model, batch, auto_tokens(model), trim_padding=False, **last)
    assert torch.allclose(metric.per_sample, full.per_sample, rtol=1e-5, atol=0)
    assert bool((full.per_sample > 0).all())
    whole = token_sensitivity(model, batch, auto_tokens(model, position=None), compare="l2",
                              **OPTS)
    assert bool((whole.per_sample > full.per_sample).all())
