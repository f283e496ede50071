"""The reuse switches are flags: any truthy value (the string "no") turned reuse on."""

from __future__ import annotations

import pytest

from senslab.tokens import Embedding, Patches


@pytest.mark.parametrize("value", ["no", "False", 0.5, None])
def test_reuse_switches_refuse_what_is_no_flag(value: object) -> None:
    with pytest.raises(TypeError, match="reuse_prefix must be True or False"):
        Embedding("embed_ln", reuse_prefix=value)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="reuse_local must be True or False"):
        Patches(4, reuse_local=value)  # type: ignore[arg-type]


def test_reuse_switches_take_flags() -> None:
    assert Embedding("embed_ln", reuse_prefix=False).reuse_prefix is False
    assert Patches(4, reuse_local=False).reuse_local is False
    assert Patches(4).reuse_local is True


def test_numpy_counts_become_python_ints_in_the_options() -> None:
    """``repeats=np.int64(2)`` stayed a NumPy int in the metric's options (JSON fails on it)."""
    import json

    import numpy as np
    import torch

    from senslab.measure import TokenSensitivity

    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 2))
    m = TokenSensitivity(model, Patches(4), sigma=1.0, repeats=np.int64(2),
                         num_tokens=np.int64(3), target_stderr=0.1, max_forward=np.int64(50))
    assert type(m.repeats) is int and type(m.num_tokens) is int and type(m.max_forward) is int
    json.dumps({"repeats": m.repeats, "num_tokens": m.num_tokens, "max_forward": m.max_forward})
