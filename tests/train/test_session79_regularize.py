"""Session 79 audit of the sensitivity regularizer: under a bf16 ``torch.autocast`` the outputs
can be float32 (``.float()`` on the logits, a float32 head outside autocast) or bf16 far from
the grid that rounded them (a last LayerNorm), and still carry the rounding of the bf16 matrix
products before them — the penalty measured that rounding (15× the float32 one, gradient at
cosine 0.48) and the output-grid check, which read only the outputs' dtype and grid, passed
without a word. The noise's change is now compared with the float32 model's, in eval mode, on
the first call under autocast and every 100th; float32 outputs of a bf16 model that lie on its
grid are judged on that grid."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

from senslab.tokens import Embedding
from senslab.train import regularize
from senslab.train.regularize import sensitivity_penalty, sensitivity_regularized_loss


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with nothing said and at the autocast check's first call."""
    monkeypatch.setattr(regularize, "_OUTPUT_GRID_SAID", set())
    monkeypatch.setattr(regularize, "_AUTOCAST_CALLS", [0])


class Float(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.float()


class Float32Head(nn.Module):
    """A bf16 body under autocast, a float32 head outside it."""

    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.body, self.head = body, nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(x)
        with torch.autocast("cpu", enabled=False):
            return self.head(h.float())


def model(last: str, bias: float) -> nn.Module:
    torch.manual_seed(0)  # test-only: init
    linear = nn.Linear(16, 8)
    with torch.no_grad():
        linear.bias.fill_(bias)  # logits near 100: bf16 steps of 0.5 there
    body = nn.Sequential(nn.Flatten(), linear)
    if last == "head":
        return Float32Head(body)
    return nn.Sequential(body, Float() if last == "float" else nn.LayerNorm(8))


def images() -> torch.Tensor:
    return torch.rand(64, 1, 4, 4, generator=torch.Generator().manual_seed(1)) * 2 - 1


def penalty(m: nn.Module, x, sigma: float, autocast: bool, **kw) -> tuple[float, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            value, _ = sensitivity_penalty(m, x, sigma=sigma,
                                           generator=torch.Generator().manual_seed(0), **kw)
    return value.item(), [str(w.message) for w in caught if "sensitivity_penalty" in str(w.message)]


@pytest.mark.parametrize("last", ["float", "layernorm", "head"])
def test_autocast_rounding_behind_a_float32_or_rescaled_output_is_warned_about(last):
    m = model(last, 100.0)
    exact, said = penalty(m, images(), 0.1, autocast=False, patch=2)
    assert said == []
    low, said = penalty(m, images(), 0.1, autocast=True, patch=2)
    assert low > 5 * exact  # the rounding, not the model's sensitivity (measured 12-15x)
    assert len(said) == 1 and "torch.autocast(dtype=torch.bfloat16)" in said[0]
    assert "outside torch.autocast" in said[0]  # the fix
    # said once per process
    assert penalty(m, images(), 0.1, autocast=True, patch=2)[1] == []


@pytest.mark.parametrize("last", ["float", "layernorm", "head"])
def test_a_resolved_autocast_penalty_is_not_warned_about(last):
    m = model(last, 0.0)
    exact, _ = penalty(m, images(), 1.0, autocast=False, patch=2)
    low, said = penalty(m, images(), 1.0, autocast=True, patch=2)
    assert said == [] and low == pytest.approx(exact, rel=0.02)


def cnn() -> nn.Module:
    torch.manual_seed(0)  # test-only: init
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Dropout(0.2), nn.Flatten(), nn.Linear(8 * 8 * 8, 5))


def counted(m: nn.Module) -> list[int]:
    calls = [0]
    m.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def test_the_check_leaves_the_training_step_as_it_was():
    """The check's forwards (eval mode, no gradients) change nothing the step computes or
    leaves behind: the loss, gradients, BatchNorm statistics, dropout's random stream, the
    modules' modes — the same as on a call it skips."""
    x = torch.rand(8, 3, 8, 8, generator=torch.Generator().manual_seed(2)) * 2 - 1
    y = torch.arange(8) % 5
    runs = []
    for skip in (False, True):
        m = cnn().train()
        m[3].eval()  # a mixed mode, put back as it was
        calls = counted(m)
        regularize._AUTOCAST_CALLS[0] = 1 if skip else 0
        torch.manual_seed(5)  # test-only: dropout's stream
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss, _ = sensitivity_regularized_loss(m, x, y, patch=2, sigma=0.5,
                                                   generator=torch.Generator().manual_seed(0))
        loss.backward()
        runs.append((loss.item(), [p.grad.clone() for p in m.parameters()],
                     [b.clone() for b in m.buffers()], torch.rand(3),
                     [mod.training for mod in m.modules()], calls[0]))
    (l0, g0, b0, r0, t0, n0), (l1, g1, b1, r1, t1, n1) = runs
    assert (n0, n1) == (6, 2)  # the check ran 4 forwards of its own on its call, none after
    assert l0 == l1 and all(torch.equal(a, b) for a, b in zip(g0, g1, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(b0, b1, strict=True)) and torch.equal(r0, r1)
    assert t0 == t1 and t0[4] is False and t0[1] is True


def test_runs_every_100th_call_under_autocast_and_never_outside():
    m = cnn()
    calls = counted(m)
    x = torch.rand(2, 3, 8, 8, generator=torch.Generator().manual_seed(2))
    g = torch.Generator().manual_seed(0)
    for _ in range(3):  # float32: the two forwards alone, nothing counted
        sensitivity_penalty(m, x, patch=2, generator=g)
    assert calls[0] == 6 and regularize._AUTOCAST_CALLS == [0]
    seen = []
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for _ in range(101):
            calls[0] = 0
            sensitivity_penalty(m, x, patch=2, generator=g)
            seen.append(calls[0])
    assert seen[0] == seen[100] == 6 and set(seen[1:100]) == {2}


class Text(nn.Module):
    def __init__(self, bias: float) -> None:
        super().__init__()
        torch.manual_seed(0)  # test-only: init
        self.embed, self.ln = nn.Embedding(40, 16), nn.LayerNorm(16)
        self.out = nn.Linear(16, 3)
        with torch.no_grad():
            self.out.bias.fill_(bias)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(self.ln(self.embed(ids)).mean(1)).float()


def test_embedding_noise_is_replayed_for_the_check():
    """The check runs the noisy forward again with the noise that was drawn (a hook of its own):
    without it the float32 change would be 0 and every call warned of."""
    ids = torch.randint(40, (32, 6), generator=torch.Generator().manual_seed(3))
    tokens = Embedding("ln")
    fine = Text(0.0)
    exact, _ = penalty(fine, ids, 1.0, autocast=False, tokens=tokens)
    low, said = penalty(fine, ids, 1.0, autocast=True, tokens=tokens)
    assert said == [] and low == pytest.approx(exact, rel=0.05)
    assert fine.ln._forward_hooks == {}  # the replay's hook is gone
    coarse = Text(100.0)
    exact, _ = penalty(coarse, ids, 0.1, autocast=False, tokens=tokens)
    regularize._AUTOCAST_CALLS[0] = 0  # the check's next call (it ran on the first)
    low, said = penalty(coarse, ids, 0.1, autocast=True, tokens=tokens)
    assert low > 3 * exact and len(said) == 1 and "torch.autocast" in said[0]


def test_float32_outputs_of_a_bf16_model_are_judged_on_its_grid():
    """``.float()`` on a bf16 model's logits: the same penalty as the bf16 outputs (15× the
    float32 model's), without the warning the bf16 outputs get."""
    m = model("float", 100.0)
    exact, _ = penalty(m, images(), 0.1, autocast=False, patch=2)
    low, said = penalty(copy.deepcopy(m).bfloat16(), images().bfloat16(), 0.1, autocast=False,
                        patch=2)
    assert low > 5 * exact
    assert len(said) == 1 and "float32 outputs (on the bfloat16 grid" in said[0]
    # float32 outputs of a float32 model are not on that grid, and not looked at
    regularize._OUTPUT_GRID_SAID.clear()
    assert penalty(m, images(), 0.1, autocast=False, patch=2)[1] == []
