"""Embedding tokens that failed on inputs they document, now measured.

* Prefix reuse (the default, ``reuse_prefix=True``) on a zoo text model handed the inputs to
  ``prefix_cache`` as they came: a tuple ``(input_ids, attention_mask)`` — which the clean
  forward and the masks read as the forward's positional arguments — was taken as the token ids
  and the measurement failed with "'tuple' object has no attribute 'dim'" (with
  ``reuse_prefix=False`` the same inputs measured). Now the tuple reaches ``prefix_cache`` named.
* A submodule held under two names (``model.shared`` and ``model.encoder.embed_tokens``, one
  ``nn.Embedding``) was refused under its second name as "has no submodule", though
  ``model.get_submodule`` finds it and the forward calls it there: ``named_modules`` lists each
  module once. Now both names hook it.

Models are small, random-init, seeded; measurements are float32 with a fixed generator.
"""

from __future__ import annotations

import torch
from torch import nn

from senslab import token_sensitivity
from senslab.models.text import GPT2Classifier, LSTMClassifier, TextConfig
from senslab.tokens import Embedding

EXACT = dict(precision="float32", generator=0, repeats=4)


def padded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, 0/1 mask) of 4 right-padded examples of 3–8 tokens, padded with id 0."""
    ids = torch.randint(3, 30, (4, 8), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(4, 8, dtype=torch.long)
    for i, n in enumerate([8, 5, 6, 3]):
        mask[i, n:] = 0
    return ids.masked_fill(mask == 0, 0), mask


def small(make: type[nn.Module]) -> nn.Module:
    cfg = TextConfig(vocab_size=30, max_len=8, dim=16, layers=1, heads=2, dropout=0.0,
                     pad_id=0)
    return make(cfg).eval()


def test_prefix_reuse_takes_a_tuple_of_ids_and_mask() -> None:
    ids, mask = padded_batch()
    for make in (LSTMClassifier, GPT2Classifier):
        model = small(make)
        with torch.no_grad(), Embedding("embed_ln").bind(model, (ids, mask)) as bound:
            assert bound.reuse  # the fast path is taken, not quietly dropped
            src, tok = torch.tensor([0, 1, 3]), torch.tensor([5, 0, 2])
            noise = torch.randn(3, 16, generator=torch.Generator().manual_seed(1))
            got = bound.forward_perturbed(src, tok, noise)
        with torch.no_grad(), Embedding("embed_ln", reuse_prefix=False).bind(
                model, {"input_ids": ids, "attention_mask": mask}) as full:
            want = full.forward_perturbed(src, tok, noise)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        by_dict = token_sensitivity(model, {"input_ids": ids, "attention_mask": mask},
                                    tokens=Embedding("embed_ln"), sigma=1.0, **EXACT)
        by_tuple = token_sensitivity(model, (ids, mask), tokens=Embedding("embed_ln"),
                                     sigma=1.0, **EXACT)
        assert torch.equal(torch.as_tensor(by_tuple.per_sample),
                           torch.as_tensor(by_dict.per_sample))


class _Encoder(nn.Module):
    def __init__(self, embed_tokens: nn.Embedding) -> None:
        super().__init__()
        self.embed_tokens = embed_tokens  # the model's shared embedding, under a second name
        self.fc = nn.Linear(8, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.tanh(2 * self.embed_tokens(ids)).mean(1))


class _Shared(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)  # test-only: nn layers initialise from the global RNG
        self.shared = nn.Embedding(20, 8)
        self.encoder = _Encoder(self.shared)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.encoder(ids)


def test_a_module_held_under_two_names_is_hooked_by_either() -> None:
    model = _Shared().eval()
    ids = torch.randint(1, 20, (3, 5), generator=torch.Generator().manual_seed(0))
    first = token_sensitivity(model, ids, tokens=Embedding("shared"), sigma=1.0, **EXACT)
    second = token_sensitivity(model, ids, tokens=Embedding("encoder.embed_tokens"), sigma=1.0,
                               **EXACT)
    assert torch.equal(torch.as_tensor(second.per_sample), torch.as_tensor(first.per_sample))
