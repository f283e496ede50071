"""Audit 84, token-wise estimator's entry: a T5-like generating model called without decoder
inputs (with output=, compare='l1'/'l2', or inside a wrapper) and a plan of copies too large for
memory are refused by senslab, naming the fix, before any perturbed forward."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from senslab.measure import TokenSensitivity, token_sensitivity
from senslab.tokens import Embedding, Sequence

transformers = pytest.importorskip("transformers")

T5 = dict(vocab_size=50, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2,
          decoder_start_token_id=0, pad_token_id=0)


def _t5() -> nn.Module:
    torch.manual_seed(0)
    return transformers.T5ForConditionalGeneration(transformers.T5Config(**T5)).eval()


def _ids() -> torch.Tensor:
    return torch.randint(1, 50, (2, 6), generator=torch.Generator().manual_seed(1))


class _Last(nn.Module):
    """A user's wrapper: the last decoder position's logits of the model it holds."""

    def __init__(self, model: nn.Module, start: int | None = None) -> None:
        super().__init__()
        self.model, self.start = model, start

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        extra = ({} if self.start is None else
                 {"decoder_input_ids": torch.full((len(input_ids), 1), self.start)})
        return self.model(input_ids=input_ids, **extra).logits[:, -1]


@pytest.mark.parametrize("case", ["output", "l1", "l2", "wrapper"])
def test_t5_without_decoder_inputs_is_refused_by_senslab(case: str) -> None:
    # before: Hugging Face's "You must specify exactly one of input_ids or inputs_embeds",
    # though input_ids were given
    model = _t5()
    options: dict = {"output": lambda o: o.logits[:, -1]} if case == "output" else {}
    if case in ("l1", "l2"):
        options["compare"] = case
    measured = _Last(model) if case == "wrapper" else model
    where = "in your wrapper's call" if case == "wrapper" else "in the inputs"
    metric = TokenSensitivity(measured, Embedding("encoder.embed_tokens" if case != "wrapper"
                                                  else "model.encoder.embed_tokens"),
                              sigma=0.5, repeats=2, generator=0, **options)
    with pytest.raises(ValueError, match=rf"T5ForConditionalGeneration.*decoder_input_ids "
                                         rf"{where}.*decoder_start_token_id") as err:
        metric.update({"input_ids": _ids()})
    assert err.value.__cause__ is None and err.value.__context__ is None
    assert metric.state.n == 0  # nothing added


def test_t5_given_decoder_inputs_is_measured() -> None:
    model = _t5()
    start = torch.full((2, 1), model.config.decoder_start_token_id)
    r = token_sensitivity(model, {"input_ids": _ids(), "decoder_input_ids": start},
                          Embedding("encoder.embed_tokens"), sigma=0.5, repeats=2, generator=0,
                          compare="l2")
    assert r.num_examples == 2 and r.estimate > 0
    # a wrapper that gives the decoder its inputs itself is not refused for the inputs' lack
    wrapped = token_sensitivity(_Last(model, start=0), {"input_ids": _ids()},
                                Embedding("model.encoder.embed_tokens"), sigma=0.5, repeats=2,
                                generator=0, compare="l2")
    assert wrapped.num_examples == 2 and wrapped.estimate > 0


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(8 * 4, 16), nn.Tanh(), nn.Linear(16, 3))


def test_huge_repeats_is_refused_naming_the_memory_and_the_fix() -> None:
    # before: torch's "can't allocate memory: you tried to allocate 8000000000000000 bytes"
    # (CPU) from the plan of every copy's example and token
    x = torch.randn(2, 8, 4, generator=torch.Generator().manual_seed(1))
    metric = TokenSensitivity(_mlp(), Sequence(), sigma=0.3, repeats=10**14, generator=0,
                              precision="float32")
    with pytest.raises(ValueError, match=r"repeats=100000000000000 makes "
                                         r"1,600,000,000,000,000 perturbed copies.*GiB.*"
                                         r"fewer repeats.*num_tokens=.*target_stderr="):
        metric.update(x)
    assert metric.state.n == 0
    whole = TokenSensitivity(_mlp(), Sequence(), sigma=0.3, repeats=10**14, generator=0,
                             precision="float32", mode="whole")
    with pytest.raises(ValueError, match=r"200,000,000,000,000 perturbed copies"):
        whole.update(x)
