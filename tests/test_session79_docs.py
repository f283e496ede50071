"""docs/measuring.md's python blocks, run as written on a small real model and optimizer, and
what the text around them promises: a training loop that holds ``exclusive(model)`` takes turns
with the measurements (one lock of the process, so a measurement of an unrelated model waits
too), and a copy taken between measurements carries no hooks and the model's own mode.

The other user docs' blocks are run elsewhere: README's "Use it in your stack" in
tests/test_readme_stack.py, docs/integrations.md's through tests/integrations/conftest.py's
``snippet`` and tests/measure/test_auto_tokens.py."""

from __future__ import annotations

import copy
import re
import threading
from pathlib import Path

import pytest
import torch
from torch import nn

from senslab import Patches, token_sensitivity
from senslab.measure import exclusive

DOC = Path(__file__).resolve().parents[1] / "docs" / "measuring.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def blocks() -> list[str]:
    return BLOCK.findall(DOC.read_text(encoding="utf-8"))


def small_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.Tanh(), nn.Linear(8, 3))


def test_measuring_has_the_one_exclusive_block():
    found = blocks()
    assert len(found) == 1, "a new block in docs/measuring.md: run it here too"
    assert "exclusive(model)" in found[0]


def test_the_exclusive_block_runs_as_written():
    model = small_model().train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    x = torch.randn(4, 1, 4, 4, generator=torch.Generator().manual_seed(1))
    model(x).sum().backward()
    before = [p.detach().clone() for p in model.parameters()]
    scope = {"model": model, "optimizer": optimizer, "copy": copy}
    exec(compile(blocks()[0], "docs/measuring.md", "exec"), scope)  # noqa: S102
    snapshot = scope["snapshot"]
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))
    assert snapshot.training  # "its own mode": the model was in train mode
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in snapshot.modules())
    for a, b in zip(snapshot.parameters(), model.parameters(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.filterwarnings("ignore:the standard error rests on few flips")
@pytest.mark.parametrize("same_model", [True, False])
def test_a_measurement_waits_for_a_held_exclusive(same_model: bool):
    """"measurements take turns … one lock for every model": a measurement started while
    another thread holds exclusive(model) (of that model, or of an unrelated one) finishes only
    after the lock is released."""
    held = small_model()
    measured = held if same_model else small_model()
    x = torch.randn(4, 1, 4, 4, generator=torch.Generator().manual_seed(2))
    done = threading.Event()
    out: list = []

    def measure() -> None:
        out.append(token_sensitivity(measured, x, Patches(2), sigma=0.5, generator=0))
        done.set()

    with exclusive(held):
        worker = threading.Thread(target=measure)
        worker.start()
        assert not done.wait(0.5), "the measurement ran while exclusive(model) was held"
    worker.join(30)
    assert done.is_set() and out and out[0].num_examples == 4
