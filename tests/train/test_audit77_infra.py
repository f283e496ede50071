"""Audit 77, infra: checkpoints' dtypes, the Ctrl-C watch's handler, warnings said once."""

from __future__ import annotations

import math
import signal
import threading
import warnings
from pathlib import Path

import pytest
import torch

from senslab._sigint import SigintWatch
from senslab._stack import said_once
from senslab.train.checkpoint import decode, encode
from senslab.train.rundir import RunDir


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def test_a_state_round_trips_bit_for_bit_in_every_dtype_and_layout() -> None:
    g = torch.Generator().manual_seed(0)
    base = torch.randn(4, 6, generator=g)
    leaves: dict[str, object] = {
        f"{dt}": (base * 100).to(dt) for dt in (torch.float16, torch.bfloat16, torch.float32,
                                                torch.float64, torch.int8, torch.uint8,
                                                torch.int64, torch.bool, torch.complex64)}
    leaves.update(scalar=torch.tensor(2.5, dtype=torch.float64), empty=torch.empty(3, 0),
                  view=base[1:, ::2], t=base.t(), expanded=base[:1].expand(3, 6),
                  tied=base, nan=torch.tensor([float("nan"), -0.0]))
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 3, generator=g)).sum().backward()
    opt.step()
    state = {"t": leaves, "optimizer": opt.state_dict(), "rng": g.get_state(),
             "floats": [-0.0, math.inf, 5e-324], 1: (None, True, 2**70)}
    back = decode(encode(state), "mem")
    for k, v in leaves.items():
        assert isinstance(v, torch.Tensor)
        r = back["t"][k]
        assert (r.dtype, r.shape) == (v.dtype, v.shape) and torch.equal(_bits(r), _bits(v)), k
    assert torch.equal(back["optimizer"]["state"][0]["exp_avg"],
                       state["optimizer"]["state"][0]["exp_avg"])
    assert torch.equal(back["rng"], state["rng"])
    assert math.copysign(1, back["floats"][0]) == -1 and back[1] == (None, True, 2**70)


@pytest.mark.parametrize("dtype", [torch.complex128, torch.complex32])
def test_a_tensor_safetensors_cannot_store_is_refused_naming_it(dtype: torch.dtype) -> None:
    # was: KeyError: torch.complex128 from safetensors' insides, at a run's first checkpoint
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch: "ComplexHalf support is experimental"
        state = {"model": {"freq": torch.zeros(3, dtype=dtype)}}
        with pytest.raises(TypeError, match=r"/model/freq.*view_as_real"):
            encode(state)


def test_pruning_keeps_the_newest_steps_by_number(tmp_path: Path) -> None:
    rd = RunDir(tmp_path)
    for step in (8, 9, 10, 100):
        rd.save_checkpoint({"w": torch.full((2,), float(step))}, step, keep=2)
    assert [p.name for p in rd.checkpoints()] == ["step-00000010.safetensors",
                                                  "step-00000100.safetensors"]


def test_a_sigint_handler_set_inside_a_watch_is_kept() -> None:
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers are set from the main thread only")
    before = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)

    def mine(signum: int, frame: object) -> None:
        pass

    try:
        with SigintWatch():
            signal.signal(signal.SIGINT, mine)  # the user's, a library's: set in the block
        # was: put back to Python's default, the user's handler gone without a word
        assert signal.getsignal(signal.SIGINT) is mine
        with SigintWatch():
            pass
        assert signal.getsignal(signal.SIGINT) is mine  # not installed over it, not removed
        signal.signal(signal.SIGINT, signal.default_int_handler)
        with pytest.raises(ValueError), SigintWatch():
            raise ValueError
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, before)


def test_warnings_said_before_an_error_are_said_too() -> None:
    said: set[str] = set()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with pytest.raises(FloatingPointError), said_once(said):
            warnings.warn("bf16 too coarse: 3 of 8 rows", RuntimeWarning, stacklevel=1)
            raise FloatingPointError("loss became nan")
    # was: dropped with the exception (and not remembered as said)
    assert [str(w.message) for w in seen] == ["bf16 too coarse: 3 of 8 rows"]
    assert said == {"bf16 too coarse"}


def test_under_warnings_as_errors_the_exception_is_the_one_that_goes_on() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(FloatingPointError), said_once(set()):
            warnings.warn("bf16 too coarse: 3 of 8 rows", RuntimeWarning, stacklevel=1)
            raise FloatingPointError("loss became nan")
        with pytest.raises(RuntimeWarning), said_once(set()):  # no error: the warning raises
            warnings.warn("bf16 too coarse: 3 of 8 rows", RuntimeWarning, stacklevel=1)
