"""One model, several threads (senslab._exclusive): measurements of one model take turns (before:
one thread's noise landed in the other's forwards and three of four threads failed with a false
"ran 3 times in one forward pass"; sharpness's perturbed weights were the other measurement's
weights), and a thread that runs the model without measuring it (a training loop) is left alone
by the measurement's hooks (before: its forward made the measurement fail, or was refused as a
forward that switches autocast on by itself)."""

from __future__ import annotations

import threading

import pytest
import torch
from metric_models import Meter
from torch import nn

from senslab._exclusive import OwnForwards, exclusive, model_lock
from senslab.measure import TokenSensitivity, token_sensitivity
from senslab.measure.sharpness import output_sharpness
from senslab.tokens import Embedding

OPTS = {"sigma": 1.0, "repeats": 4, "generator": 1, "precision": "float32"}


class Words(nn.Module):
    """Token ids → embedding → tanh layer → mean → 3 logits; ``meter`` (optional) counts the
    forwards running at once and makes the first wait for a second."""

    def __init__(self, meter: Meter | None = None, dropout: float = 0.0) -> None:
        super().__init__()
        torch.manual_seed(0)  # test-only: init
        self.emb = nn.Embedding(50, 16)
        self.body = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Dropout(dropout))
        self.head = nn.Linear(32, 3)
        self.meter = meter

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.meter is None:
            return self.head(self.body(self.emb(ids)).mean(1))
        with self.meter.running():
            return self.head(self.body(self.emb(ids)).mean(1))


def ids() -> torch.Tensor:
    return torch.randint(0, 50, (24, 10), generator=torch.Generator().manual_seed(3))


def run_threads(*jobs) -> list[str]:
    errors: list[str] = []

    def guarded(job) -> None:
        try:
            job()
        except Exception as err:  # reported, not lost with the thread
            errors.append(f"{type(err).__name__}: {err}")

    threads = [threading.Thread(target=guarded, args=(job,)) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def test_measurements_of_one_model_take_turns():
    model, x = Words().eval(), ids()
    alone = token_sensitivity(model, x, Embedding("emb"), **OPTS)
    model.meter = Meter()
    out: dict[int, object] = {}
    errors = run_threads(*[
        (lambda k=k: out.__setitem__(k, token_sensitivity(model, x, Embedding("emb"), **OPTS)))
        for k in range(3)])
    assert errors == []
    assert model.meter.most == 1  # the first forward waited for a second that never came
    for r in out.values():
        assert torch.equal(r.per_sample, alone.per_sample)


def test_sharpness_and_sensitivity_of_one_model_at_once():
    """Sharpness perturbs the weights in place; the other measurement never sees them."""
    model, x = Words().eval(), ids()
    alone = token_sensitivity(model, x, Embedding("emb"), **OPTS)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    model.meter = Meter()
    out: list = []
    errors = run_threads(
        lambda: out.append(token_sensitivity(model, x, Embedding("emb"), **OPTS)),
        lambda: output_sharpness(model, x, sigma_w=0.5, repeats=3, generator=0))
    assert errors == []
    assert model.meter.most == 1
    assert torch.equal(out[0].per_sample, alone.per_sample)
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())


def test_the_training_mode_comes_back_when_two_threads_measure():
    """Each measurement switches eval mode on and puts the flags back: taking turns, the
    second never runs with dropout, and the model ends in the mode it had."""
    model, x = Words(dropout=0.5).train(), ids()
    with torch.no_grad():
        alone = token_sensitivity(model, x, Embedding("emb"), **OPTS)
    model.meter = Meter()
    out: list = []
    errors = run_threads(*[
        (lambda: out.append(token_sensitivity(model, x, Embedding("emb"), **OPTS)))
        for _ in range(2)])
    assert errors == []
    assert model.meter.most == 1
    assert all(m.training for m in model.modules())
    assert [torch.equal(r.per_sample, alone.per_sample) for r in out] == [True, True]


class Waiting(Words):
    """The measuring thread's first forward (the clean one, with the hooks in place) waits
    until another thread's forward has run through the hooked model."""

    def __init__(self) -> None:
        super().__init__()
        self.measuring, self.other_done = threading.Event(), threading.Event()
        self.user: int | None = None

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if threading.get_ident() != self.user and not self.measuring.is_set():
            self.measuring.set()
            assert self.other_done.wait(10.0), "the other thread's forward never ran"
        return super().forward(ids)


@pytest.mark.parametrize("under_autocast", [False, True])
def test_another_threads_forward_is_left_alone(under_autocast):
    """A thread that runs the model while another measures it (a training loop, say) gets
    the model's own outputs, and the measurement its own numbers: the hooks pass that
    thread's forwards through; a bf16 autocast there is not the model's own."""
    model, x = Waiting().eval(), ids()
    with torch.no_grad():
        clean = model.head(model.body(model.emb(x)).mean(1))
    alone = TokenSensitivity(Words().eval(), Embedding("emb"), **OPTS)
    alone.update(x)
    got: list = []

    def user() -> None:
        model.user = threading.get_ident()
        assert model.measuring.wait(10.0)
        try:
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16,
                                                 enabled=under_autocast):
                got.append(model(x).float())
        finally:
            model.other_done.set()

    out: list = []
    errors = run_threads(user,
                         lambda: out.append(token_sensitivity(model, x, Embedding("emb"),
                                                              **OPTS)))
    assert errors == []
    if not under_autocast:
        assert torch.equal(got[0], clean)
    assert torch.equal(out[0].per_sample, alone.compute().per_sample)


def test_own_forwards_and_locks():
    """The rule itself: this thread's forwards and a replica's (a module the model did not
    have: nn.DataParallel's copies, run in threads of their own) are the measurement's;
    another thread's forward of the model's own modules is not. A wrapper shares the lock of
    the model inside; several locks are taken in one order."""
    model = Words()
    own, replica = OwnForwards(model), Words()
    seen: list[bool] = []
    t = threading.Thread(target=lambda: seen.extend([own(model.emb), own(replica.emb)]))
    t.start()
    t.join()
    assert (own(model.emb), seen) == (True, [False, True])
    wrapped = nn.DataParallel(model)
    assert model_lock(wrapped) is model_lock(model)
    assert model_lock(replica) is not model_lock(model)
    other = Words()
    acquired: list[str] = []

    def take(order) -> None:
        for _ in range(200):
            with exclusive(*order):
                acquired.append("x")

    assert run_threads(lambda: take((model, other)), lambda: take((other, model))) == []
    assert len(acquired) == 400


def test_the_regularizer_leaves_another_threads_forward_alone():
    """The training regularizer's hook too: a forward another thread runs while a step
    computes its penalty gets the model's own output, and the penalty is the one computed
    alone (before: the step failed with a false "ran 2 times in one forward pass")."""
    from senslab.train.regularize import sensitivity_penalty

    model, x = Waiting().eval(), ids()
    with torch.no_grad():
        clean = model.head(model.body(model.emb(x)).mean(1))
        alone, _ = sensitivity_penalty(Words().eval(), x, tokens=Embedding("emb"),
                                       generator=torch.Generator().manual_seed(0))
    got: list = []

    def user() -> None:
        model.user = threading.get_ident()
        assert model.measuring.wait(10.0)
        try:
            with torch.no_grad():
                got.append(model(x))
        finally:
            model.other_done.set()

    out: list = []

    def step() -> None:
        with torch.no_grad():
            out.append(sensitivity_penalty(model, x, tokens=Embedding("emb"),
                                           generator=torch.Generator().manual_seed(0))[0])

    assert run_threads(user, step) == []
    assert torch.equal(got[0], clean)
    assert torch.equal(out[0], alone)
