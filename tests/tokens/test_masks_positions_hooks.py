"""Tokenizations that returned a wrong number without a word, now refused or measured right.

* A mask of real tokens that is no 0/1 mask — an additive attention mask, 0 on real tokens and
  −1e9 on padding — was read as "nonzero is real": the noise landed on the padding alone and the
  examples measured 0. Now refused (``mask=`` and a dict's ``attention_mask``); float and int
  0/1 masks measure as the bool mask does. With ``mask=`` given, an additive ``attention_mask``
  entry (the model's own) is not read as the padding.
* ``position=k`` on left-padded inputs read the output of a padding position (0 for every
  example whose padding it was). Now refused where the attention mask says it is padding.
* A hooked module that a perturbed copy's forward skipped (a model that takes another path for
  short inputs, which padding-aware batching makes) never got its noise: those examples
  measured 0. Now an error, which the padding-aware batching answers by running at full width.
* ``Embedding`` on an ``nn.Conv1d`` (an audio model's input convolution, which
  ``auto_tokens(model, embedding="word")`` picked for Whisper) read its (batch, channels,
  length) output as (batch, tokens, dim). Now refused.
* A measurement that fails half-way leaves no hook behind: the model's next plain forward is
  the clean one.

All models are small and random-init, seeded; every measurement is float32 with a fixed seed.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from senslab import token_sensitivity
from senslab.tokens import Embedding, Sequence, auto_tokens

EXACT = dict(precision="float32", generator=0, repeats=4)


class Pool(nn.Module):
    """Masked mean of the token embeddings, then a linear head. ``additive``: the mask is an
    additive attention mask (0 on real tokens, a large negative number on padding)."""

    def __init__(self, additive: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)  # test-only: nn layers initialise from the global RNG
        self.emb = nn.Embedding(20, 8)
        self.fc = nn.Linear(8, 3)
        self.additive = additive

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        w = (attention_mask == 0).float() if self.additive else attention_mask.float()
        h = torch.tanh(2 * self.emb(input_ids)) * w[..., None]
        return self.fc(h.sum(1) / w.sum(1, keepdim=True))


def padded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, 0/1 float mask) of 4 right-padded examples of 3–6 tokens (every one padded but
    the last, so an inverted mask still has a true entry in most rows)."""
    ids = torch.randint(1, 20, (4, 6), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(4, 6)
    for i, n in enumerate([4, 3, 5, 6]):
        mask[i, n:] = 0
    return ids.masked_fill(mask == 0, 0), mask


# --------------------------------------------------------------------------- masks
def test_float_and_int_masks_measure_as_the_bool_mask() -> None:
    ids, mask = padded_batch()
    model = Pool().eval()
    ref = token_sensitivity(model, {"input_ids": ids, "attention_mask": mask.bool()},
                            tokens=Embedding("emb"), sigma=3.0, **EXACT)
    assert ref.estimate > 0
    for m in (mask, mask.long()):
        got = token_sensitivity(model, {"input_ids": ids, "attention_mask": m},
                                tokens=Embedding("emb"), sigma=3.0, **EXACT)
        assert torch.equal(torch.as_tensor(got.per_sample), torch.as_tensor(ref.per_sample))
        got = token_sensitivity(model, {"input_ids": ids, "attention_mask": mask.bool()},
                                mask=m, tokens=Embedding("emb"), sigma=3.0, **EXACT)
        assert torch.equal(torch.as_tensor(got.per_sample), torch.as_tensor(ref.per_sample))


def test_an_additive_mask_is_refused_not_read_inverted() -> None:
    # Sequence inputs whose first 4 tokens are real; an additive mask= for them
    torch.manual_seed(0)
    head = nn.Linear(8, 3)
    model = nn.Sequential(nn.Flatten(), nn.Linear(48, 8), nn.Tanh(), head).eval()
    x = torch.randn(4, 6, 8, generator=torch.Generator().manual_seed(2))
    additive = torch.zeros(4, 6)
    additive[:, 4:] = -1e9
    with pytest.raises(ValueError, match="values other than 0 and 1.*mask == 0"):
        token_sensitivity(model, x, mask=additive, tokens=Sequence(), sigma=3.0, **EXACT)
    with pytest.raises(ValueError, match="values other than 0 and 1"):
        token_sensitivity(model, x, mask=additive.masked_fill(additive < 0, float("-inf")),
                          tokens=Sequence(), sigma=3.0, **EXACT)
    # … and as a dict's attention mask, without mask=
    ids, mask = padded_batch()
    with pytest.raises(ValueError, match="'attention_mask' entry holds values other than 0"):
        token_sensitivity(Pool(additive=True).eval(),
                          {"input_ids": ids, "attention_mask": (1 - mask) * -1e9},
                          tokens=Embedding("emb"), sigma=3.0, **EXACT)


def test_mask_given_leaves_a_models_additive_attention_mask_alone() -> None:
    ids, mask = padded_batch()
    ref = token_sensitivity(Pool().eval(), {"input_ids": ids, "attention_mask": mask},
                            tokens=Embedding("emb"), sigma=3.0, **EXACT)
    got = token_sensitivity(Pool(additive=True).eval(),
                            {"input_ids": ids, "attention_mask": (1 - mask) * -1e9},
                            mask=mask.bool(), tokens=Embedding("emb"), sigma=3.0, **EXACT)
    # the same computation: the additive model on its mask is the 0/1 model on the 0/1 mask
    assert torch.equal(torch.as_tensor(got.per_sample), torch.as_tensor(ref.per_sample))
    assert ref.estimate > 0


# --------------------------------------------------------------------------- left padding
class RunningMean(nn.Module):
    """A causal per-position model: position t reads the masked mean of tokens ≤ t."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)  # test-only
        self.emb = nn.Embedding(20, 8)
        self.fc = nn.Linear(8, 5)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        w = attention_mask.float()[..., None]
        h = torch.tanh(2 * self.emb(input_ids)) * w
        return self.fc(h.cumsum(1) / w.cumsum(1).clamp(min=1))


def left_padded() -> dict[str, torch.Tensor]:
    ids = torch.randint(1, 20, (3, 6), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(3, 6, dtype=torch.long)
    mask[0, :2] = 0
    mask[1, :3] = 0
    return {"input_ids": ids.masked_fill(mask == 0, 0), "attention_mask": mask}


@pytest.mark.parametrize("position", [0, 1, -4])
def test_a_position_in_the_left_padding_is_refused(position: int) -> None:
    # position 0 and 1 are padding in examples 0 and 1; −4 (two before the third-last real
    # token) is padding in example 1: read there, those examples measured 0
    with pytest.raises(ValueError, match=f"position={position} is left padding in examples"):
        token_sensitivity(RunningMean().eval(), left_padded(),
                          tokens=Embedding("emb", position=position), sigma=2.0,
                          trim_padding=False, **EXACT)


def test_positions_every_left_padded_example_has_are_measured() -> None:
    model, inputs = RunningMean().eval(), left_padded()
    for position in ("last", -1, -3, 3):
        r = token_sensitivity(model, inputs, tokens=Embedding("emb", position=position),
                              sigma=2.0, trim_padding=False, **EXACT)
        assert r.estimate > 0


# --------------------------------------------------------------------------- skipped module
class Routed(nn.Module):
    """Short inputs (≤ 4 tokens) take a fused lookup of the same table instead of the module:
    the same outputs, but the module does not run. Padding-aware batching cuts the copies of
    short examples to ≤ 4 tokens."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)  # test-only
        self.emb = nn.Embedding(20, 8)
        self.fc = nn.Linear(8, 3)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        if input_ids.shape[1] > 4:
            h = self.emb(input_ids)
        else:
            h = F.embedding(input_ids, self.emb.weight)
        w = attention_mask.float()[..., None]
        return self.fc((torch.tanh(2 * h) * w).sum(1) / w.sum(1))


def test_a_module_the_copies_skip_is_not_measured_as_zero() -> None:
    ids, mask = padded_batch()
    inputs = {"input_ids": ids, "attention_mask": mask.long()}
    model = Routed().eval()
    # full width: every forward runs the module (the reference)
    ref = token_sensitivity(model, inputs, tokens=Embedding("emb"), sigma=2.0,
                            trim_padding=False, **EXACT)
    assert (torch.as_tensor(ref.per_sample)[:2] > 0).all()  # the short examples flip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = token_sensitivity(model, inputs, tokens=Embedding("emb"), sigma=2.0, **EXACT)
    # examples 0 and 1 (4 and 3 tokens) measured 0 when their cut copies skipped the module
    assert torch.equal(torch.as_tensor(got.per_sample), torch.as_tensor(ref.per_sample))
    assert any("was not called during a forward pass of perturbed copies" in str(w.message)
               for w in caught)


# --------------------------------------------------------------------------- layouts
class ConvFront(nn.Module):
    """(batch, channels, length) signals through a Conv1d front end, as an audio encoder."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)  # test-only
        self.conv = nn.Conv1d(4, 8, 3, padding=1)
        self.fc = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.tanh(self.conv(x)).mean(-1))


def test_embedding_on_a_conv1d_is_refused() -> None:
    x = torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=r"Conv1d, whose output \(2, 8, 8\) is \(batch, "
                                         r"channels, length\)"):
        token_sensitivity(ConvFront().eval(), x, tokens=Embedding("conv"), sigma=3.0, **EXACT)


def test_auto_tokens_refuses_an_audio_models_input_convolution() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.WhisperConfig(
        d_model=16, encoder_layers=1, encoder_attention_heads=2, decoder_layers=1,
        decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16, num_mel_bins=4,
        max_source_positions=8, num_labels=3, vocab_size=50, pad_token_id=0, bos_token_id=1,
        eos_token_id=2, decoder_start_token_id=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.WhisperForAudioClassification(config).eval()
    for embedding in ("block", "word"):
        with pytest.raises(TypeError, match=r"encoder\.conv1\) is a Conv1d"):
            auto_tokens(model, embedding=embedding)


# --------------------------------------------------------------------------- hooks
def test_a_failed_measurement_leaves_no_noise_in_the_model() -> None:
    ids, mask = padded_batch()
    inputs = {"input_ids": ids, "attention_mask": mask.long()}
    model = Pool().eval()
    clean = model(**inputs)
    calls = {"n": 0}

    def fail_third(module: nn.Module, args: object, out: torch.Tensor) -> None:
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt  # not an Exception: a user's Ctrl-C mid-measurement

    handle = model.fc.register_forward_hook(fail_third)
    try:
        with pytest.raises(KeyboardInterrupt):
            token_sensitivity(model, inputs, tokens=Embedding("emb"), sigma=3.0, **EXACT)
    finally:
        handle.remove()
    assert not model.emb._forward_hooks
    assert torch.equal(model(**inputs), clean)
