"""Audit of checked precision (senslab.measure._precision): low-precision work the check did not
size, so a later batch whose inputs to it were larger than the calibration's kept the
calibration's band and took the low precision's decisions without a word — bf16's recurrent
layers."""

from __future__ import annotations

import pytest
import torch
from checked_flips import assert_shifted_example_keeps_float32_flips
from torch import nn

from senslab.measure import _precision

CPU = torch.device("cpu")


class CentredRNN(nn.Module):
    """A recurrent classifier whose input weight rows sum to 0: a constant added to every input
    feature leaves float32's outputs as they were, while bf16's rounding of the input grows with
    the shift."""

    output_kind = "logits"

    def __init__(self, kind: str) -> None:
        super().__init__()
        torch.manual_seed(0)  # test-only: the layers initialise from the global RNG
        self.rnn = getattr(nn, kind)(8, 64, batch_first=True)
        self.head = nn.Linear(64, 3)
        with torch.no_grad():
            self.rnn.weight_ih_l0 -= self.rnn.weight_ih_l0.mean(1, keepdim=True)
            self.rnn.weight_ih_l0.mul_(3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(x)[0][:, -1])


CELLS = {"LSTMCell": lambda c, x: c(x)[0], "GRUCell": lambda c, x: c(x),
         "RNNCell": lambda c, x: c(x)}


def _bf16_runs(layer: nn.Module, call, x: torch.Tensor) -> bool:
    """Whether this CPU's torch runs ``layer`` under bf16 autocast: oneDNN has no bf16 LSTM
    primitive on a CPU without AVX-512 ("could not create a primitive descriptor")."""
    try:
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
            call(layer, x)
    except RuntimeError as err:
        if "primitive descriptor" in str(err):
            return False
        raise
    return True


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN", *CELLS])
def test_recurrent_layers_inputs_are_sized(kind):
    """nn.LSTM, nn.GRU, nn.RNN and their cells run their products in bf16 under CPU autocast
    inside one call; an input shifted by 64 widens the band, and the layer counts as run in
    bf16."""
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)  # test-only: the layer initialises from the global RNG
    layer = getattr(nn, kind)(8, 16, **({} if kind in CELLS else {"batch_first": True}))
    x = torch.randn(4, 8, generator=g) if kind in CELLS else torch.randn(4, 3, 8, generator=g)
    call = CELLS.get(kind, lambda c, x: c(x)[0])
    packed = nn.utils.rnn.pack_padded_sequence if kind not in CELLS else None
    if not _bf16_runs(layer, call, x):
        pytest.skip(f"this CPU's torch has no bf16 {kind} (oneDNN: no primitive without AVX-512)")
    check = _precision.PrecisionCheck()
    check.use("bf16")
    with torch.inference_mode():
        with check._lowered(CPU):
            call(layer, x)
        check._calibrated_ranges()
        assert check._recorder().lowered
        with check._lowered(CPU):
            call(layer, x + 64.0)
        assert float(check._widening(len(x))) > 10
        if packed is not None:  # a packed sequence: (data, batch_sizes, hx, params, ...)
            with check._lowered(CPU):
                layer(packed(x + 64.0, torch.tensor([3, 3, 2, 1]), batch_first=True))
            assert float(check._widening(len(x))) > 10


def test_a_shifted_example_before_a_gru_keeps_float32_flips():
    """Calibrated on N(0, 1) inputs, then a batch in which one example is shifted by 64 before a
    GRU: its bf16 error grows with the shift. Unsized, the band stayed the calibration's, the
    spot checks missed the example, and 8 of 2,048 copies took bf16's class without a word."""
    assert_shifted_example_keeps_float32_flips(CentredRNN("GRU").eval(), seed=3, repeats=8)
