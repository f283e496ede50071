"""Embedding tokens and output conventions that read a model otherwise than asked, now refused
or said (audit 86).

* ``position=k`` on a model whose 3-D output has another number of positions than the hooked
  module's tokens (prompt tuning's virtual tokens prepended inside the forward) was ignored:
  the whole output was compared, the same number as ``position=None``, without a word.
* ``labels`` in the inputs of a Hugging Face encoder-decoder are its decoder's inputs (shifted
  right), but only ``decoder_input_ids`` made the output count as the decoder's: with labels
  of the inputs' length, ``position=-1`` read each example at a decoder position.
* A causal language model's logits, read at the last real token, were never checked for left
  padding: GPT-2 fed left-padded inputs without ``position_ids`` under ``trim_padding=False``
  was measured at shifted positions without the warning its classifier gets.
* A Hugging Face audio or video classifier with one output and no ``problem_type`` (which
  transformers trains as a regression, as it does a sequence or image one) was read as a binary
  logit.

Models are tiny, random-init, seeded; no downloads.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")

from senslab.measure import TokenSensitivity  # noqa: E402
from senslab.tokens import Embedding  # noqa: E402


def seeded(make):
    torch.manual_seed(0)  # test-only: Hugging Face initialises from the global RNG
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return make().eval()


def tiny_gpt2() -> nn.Module:
    config = transformers.GPT2Config(vocab_size=50, n_positions=16, n_embd=16, n_layer=1,
                                     n_head=2, pad_token_id=0)
    model = seeded(lambda: transformers.GPT2LMHeadModel(config))
    with torch.no_grad():  # positions of a trained model's size: they matter to its output
        model.transformer.wpe.weight.normal_(0, 1, generator=torch.Generator().manual_seed(3))
    return model


def ids_and_mask(left: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask) of 3 examples of 8, 5 and 3 tokens, padded with id 0."""
    ids = torch.randint(1, 50, (3, 8), generator=torch.Generator().manual_seed(0))
    mask = (torch.arange(8)[None, :] < torch.tensor([8, 5, 3])[:, None]).long()
    ids = ids.masked_fill(mask == 0, 0)
    if left:
        shifts = (mask == 0).sum(dim=1).tolist()
        ids = torch.stack([torch.roll(r, s) for r, s in zip(ids, shifts, strict=True)])
        mask = torch.stack([torch.roll(r, s) for r, s in zip(mask, shifts, strict=True)])
    return ids, mask


class Prompted(nn.Module):
    """Prompt tuning: three learned vectors before the word embeddings of a causal LM."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm
        self.prompt = nn.Parameter(
            torch.randn(3, 16, generator=torch.Generator().manual_seed(1)) * 0.1)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        embeds = self.lm.transformer.wte(input_ids)
        prompt = self.prompt.expand(len(embeds), -1, -1)
        mask = torch.cat([attention_mask.new_ones(len(embeds), 3), attention_mask], dim=1)
        return self.lm(inputs_embeds=torch.cat([prompt, embeds], dim=1),
                       attention_mask=mask).logits


def test_a_position_of_an_output_with_other_positions_is_refused() -> None:
    model = Prompted(tiny_gpt2()).eval()
    ids, mask = ids_and_mask()
    inputs = {"input_ids": ids, "attention_mask": mask}
    for position in (-1, 0):
        with pytest.raises(ValueError, match=r"returns \(3, 11, 50\): 11 positions per "
                                             r"example for the 8 tokens"), torch.no_grad(), \
                Embedding("lm.transformer.wte", position=position).bind(model, inputs):
            pass
    # the whole output, asked for, is still measured as it is
    with torch.no_grad(), Embedding("lm.transformer.wte", position=None).bind(
            model, inputs) as bound:
        assert tuple(bound.clean_output.shape) == (3, 11, 50)


def test_labels_of_an_encoder_decoder_run_over_its_decoder_positions() -> None:
    config = transformers.T5Config(vocab_size=50, d_model=16, d_kv=8, d_ff=32, num_layers=1,
                                   num_decoder_layers=1, num_heads=2,
                                   decoder_start_token_id=0, pad_token_id=0)
    model = seeded(lambda: transformers.T5ForConditionalGeneration(config))
    ids = torch.randint(3, 50, (3, 8), generator=torch.Generator().manual_seed(0))
    labels = torch.randint(3, 50, (3, 8), generator=torch.Generator().manual_seed(1))
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
    # read at decoder position 7, the encoder's last real token, before
    with pytest.raises(ValueError, match="outputs run over the decoder's positions"), \
            torch.no_grad(), Embedding("encoder.embed_tokens", position=-1).bind(
                model, inputs, output="logits"):
        pass
    with torch.no_grad(), Embedding("encoder.embed_tokens", position=None).bind(
            model, inputs, output="logits") as bound:
        assert tuple(bound.clean_output.shape) == (3, 8, 50)  # the decoder's, whole


def test_a_left_padded_causal_lm_is_judged_at_the_position_read() -> None:
    model = tiny_gpt2()
    ids, mask = ids_and_mask(left=True)
    inputs = {"input_ids": ids, "attention_mask": mask}
    with pytest.warns(RuntimeWarning, match="GPT2LMHeadModel gives a left-padded example "
                                            "another output"), \
            torch.no_grad(), Embedding("transformer.wte").bind(model, inputs):
        pass
    with pytest.warns(RuntimeWarning, match="left-padded"), torch.no_grad(), \
            Embedding("transformer.wte", position=-2).bind(model, inputs):
        pass
    # with position_ids the texts are read as unpadded: nothing said
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with warnings.catch_warnings(record=True) as seen, torch.no_grad():
        warnings.simplefilter("always")
        with Embedding("transformer.wte").bind(model, {**inputs, "position_ids": positions}):
            pass
    assert not [w for w in seen if "left-padded" in str(w.message)]
    # padding-aware batching's refusal says what was found
    with pytest.raises(ValueError, match="Checked on this model: GPT2LMHeadModel gives "
                                         "example 1 another output"):
        TokenSensitivity(model, Embedding("transformer.wte"), sigma=1.0,
                         generator=0).update(inputs)


def test_an_audio_classifier_of_one_output_is_no_binary_logit() -> None:
    config = transformers.ASTConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                    intermediate_size=32, max_length=32, num_mel_bins=32,
                                    num_labels=1)
    model = seeded(lambda: transformers.ASTForAudioClassification(config))
    tokens = Embedding("audio_spectrogram_transformer.embeddings")
    with pytest.raises(ValueError, match=r"ASTForAudioClassification has one output "
                                         r"\(config.num_labels=1\)"):
        TokenSensitivity(model, tokens, sigma=1.0)
    TokenSensitivity(model, tokens, sigma=1.0, output_kind="logits")  # said: taken as is
