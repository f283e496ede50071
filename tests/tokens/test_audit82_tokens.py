"""Audit 82 of how tokenizations read a user's inputs (``select``, ``batch_size``, the Embedding
hook's inputs and its per-position outputs kept whole).

* A named tuple batch (a collate function's ``NamedTuple``), which the model takes as ``*args``
  as it takes a tuple, failed with a raw "missing required positional argument" where the copies
  were built. Now measured as the tuple is.
* A dict whose broadcast ``position_ids`` (or ``token_type_ids``) of shape (1, T) came before
  ``input_ids`` was read as a batch of one, and the measurement refused the hooked module's
  output as sequence-first. The batch is now ``input_ids``'.
* ``inputs_embeds`` in place of ``input_ids``: the embedding never runs, and the error said
  "hook a module the forward runs" where no module puts the vectors out. It now names the two
  fixes that measure (the ids, or a wrapper with a module of its own), the second checked here.
* A per-position output kept whole (``position=None``) on left-padded inputs counted the
  padding's rows in the distance (right padding's were left out), and every such model was
  warned of misreading its left padding, with advice to batch texts of one length, also where
  it reads them exactly as unpadded. Now the real rows only, like right padding, and no word.

Small random-init models, seeded; every measurement is float32 with a fixed seed.
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import pytest
import torch
from hf_blocks import seeded
from torch import nn

from senslab import token_sensitivity
from senslab.tokens import Embedding

EXACT = dict(precision="float32", generator=0, repeats=4)


class Pool(nn.Module):
    """Masked mean of the token embeddings (with positions), then a linear head."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)  # test-only: nn layers initialise from the global RNG
        self.emb = nn.Embedding(20, 8)
        self.pos = nn.Embedding(8, 8)
        self.fc = nn.Linear(8, 3)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1])[None]
        w = attention_mask.float()
        h = torch.tanh(2 * self.emb(input_ids) + self.pos(position_ids)) * w[..., None]
        return self.fc(h.sum(1) / w.sum(1, keepdim=True))


def padded() -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, 0/1 mask) of 4 right-padded examples of 3–6 tokens."""
    ids = torch.randint(1, 20, (4, 6), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(4, 6, dtype=torch.long)
    for i, n in enumerate([4, 3, 5, 6]):
        mask[i, n:] = 0
    return ids.masked_fill(mask == 0, 0), mask


class Batch(NamedTuple):
    input_ids: torch.Tensor
    attention_mask: torch.Tensor


def test_a_named_tuple_batch_is_measured_as_the_tuple() -> None:
    ids, mask = padded()
    model = Pool().eval()
    ref = token_sensitivity(model, (ids, mask), Embedding("emb"), sigma=3.0, **EXACT)
    assert ref.estimate > 0
    for trim in (True, False):
        got = token_sensitivity(model, Batch(ids, mask), Embedding("emb"), sigma=3.0,
                                trim_padding=trim, **EXACT)
        assert torch.equal(torch.as_tensor(got.per_sample), torch.as_tensor(ref.per_sample))


def test_broadcast_position_ids_before_the_ids_are_no_batch_of_one() -> None:
    ids, mask = padded()
    model = Pool().eval()
    ref = token_sensitivity(model, {"input_ids": ids, "attention_mask": mask},
                            Embedding("emb"), sigma=3.0, **EXACT)
    got = token_sensitivity(model, {"position_ids": torch.arange(6)[None], "input_ids": ids,
                                    "attention_mask": mask}, Embedding("emb"), sigma=3.0,
                            **EXACT)
    assert torch.equal(torch.as_tensor(got.per_sample), torch.as_tensor(ref.per_sample))
    assert len(got.per_sample) == 4


def llama():
    transformers = pytest.importorskip("transformers")
    return seeded(lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32,
        pad_token_id=0)))


class Embeds(nn.Module):
    """The fix the refusal of inputs_embeds names: the vectors through a module of its own."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.embeds = nn.Identity()

    def forward(self, inputs_embeds: torch.Tensor, **kwargs):
        return self.model(inputs_embeds=self.embeds(inputs_embeds), **kwargs)


def test_inputs_embeds_are_refused_with_fixes_that_measure() -> None:
    model = llama()
    ids, mask = padded()
    batch = {"input_ids": ids, "attention_mask": mask}
    ref = token_sensitivity(model, batch, Embedding("model.embed_tokens"), sigma=0.05, **EXACT)
    assert ref.estimate > 0
    with torch.no_grad():
        vectors = model.model.embed_tokens(ids)
    embedded = {"inputs_embeds": vectors, "attention_mask": mask}
    with pytest.raises(RuntimeError, match=r"inputs hold 'inputs_embeds'(?s:.*)Pass the token "
                                           r"ids(?s:.*)nn\.Identity\(\)"):
        token_sensitivity(model, embedded, Embedding("model.embed_tokens"), sigma=0.05,
                          **EXACT)
    got = token_sensitivity(Embeds(model), embedded, Embedding("embeds"), sigma=0.05, **EXACT)
    assert torch.equal(torch.as_tensor(got.per_sample), torch.as_tensor(ref.per_sample))


def test_a_left_padded_per_position_output_kept_whole_measures_its_real_rows() -> None:
    transformers = pytest.importorskip("transformers")
    model = seeded(lambda: transformers.BertForTokenClassification(transformers.BertConfig(
        vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=32, num_labels=3)))
    lens = [5, 3, 7, 6]
    ids = torch.randint(3, 50, (4, 7), generator=torch.Generator().manual_seed(1))
    right = torch.ones(4, 7, dtype=torch.long)
    for i, n in enumerate(lens):
        right[i, n:] = 0
    ids = ids.masked_fill(right == 0, 0)
    left = torch.stack([torch.roll(right[i], 7 - n) for i, n in enumerate(lens)])
    left_ids = torch.stack([torch.roll(ids[i], 7 - n) for i, n in enumerate(lens)])
    positions = (left.cumsum(-1) - 1).clamp(min=0)  # the texts at their own positions
    options = dict(compare="l2", sigma=0.5, trim_padding=False, **EXACT)
    tokens = Embedding("bert.embeddings.LayerNorm", position=None)
    ref = token_sensitivity(model, {"input_ids": ids, "attention_mask": right}, tokens,
                            **options)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the model reads the texts as unpadded: no warning
        got = token_sensitivity(model, {"input_ids": left_ids, "attention_mask": left,
                                        "position_ids": positions}, tokens, **options)
    # the padding's rows, which move with the real tokens' noise in an encoder, were counted
    # (up to 6e-5 of the distance here): now the same rows as right padding, up to float rounding
    torch.testing.assert_close(torch.as_tensor(got.per_sample),
                               torch.as_tensor(ref.per_sample), rtol=1e-6, atol=0)
    # without position ids the positions shift: still said
    with pytest.warns(RuntimeWarning, match="left-padded"):
        token_sensitivity(model, {"input_ids": left_ids, "attention_mask": left}, tokens,
                          **options)


class _InputMaskModel(nn.Module):
    """Token ids and an ``input_mask`` (XLNet's name: 1 on padding there, on real tokens in TF
    BERT ports), mean-pooled over the tokens the mask calls real (1 = real here)."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(5)
        self.emb = nn.Embedding(20, 8)
        self.head = nn.Linear(8, 3)
        with torch.no_grad():
            self.emb.weight.copy_(torch.randn(20, 8, generator=g))
            self.head.weight.copy_(torch.randn(3, 8, generator=g))

    def forward(self, input_ids: torch.Tensor, input_mask: torch.Tensor) -> torch.Tensor:
        m = input_mask[..., None].float()
        return self.head((self.emb(input_ids) * m).sum(1) / m.sum(1))


def test_an_input_mask_entry_is_not_guessed() -> None:
    """A dict with ``input_mask`` and no attention mask: its convention varies between models,
    and the measurement perturbed the padding as tokens (it never read the entry); refused,
    naming mask=, which then measures the real tokens alone."""
    model = _InputMaskModel().eval()
    ids = torch.tensor([[3, 4, 5, 0, 0], [6, 7, 8, 9, 2]])
    real = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    inputs = {"input_ids": ids, "input_mask": real}
    with pytest.raises(ValueError, match="'input_mask' entry marks padding, or real tokens"):
        token_sensitivity(model, inputs, Embedding("emb"), sigma=2.0, repeats=2, generator=0)
    r = token_sensitivity(model, inputs, Embedding("emb"), sigma=2.0, repeats=2, generator=0,
                          mask=real.bool())
    assert r.num_forward == 2 + 8 * 2  # the real tokens alone: 8 of them, 2 draws each
