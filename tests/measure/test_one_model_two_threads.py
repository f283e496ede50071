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

from senslab._exclusive import exclusive
from senslab.measure import TokenSensitivity, token_sensitivity
from senslab.measure.sharpness import output_sharpness
from senslab.tokens import Embedding, Sequence

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


class Events:
    """Two events, shared by a model's copies (``copy.deepcopy`` returns the same object)."""

    def __init__(self) -> None:
        self.measuring, self.other_done = threading.Event(), threading.Event()

    def __deepcopy__(self, memo: dict) -> Events:
        return self


class Waiting(Words):
    """The measuring thread's second forward (the first of perturbed copies, the noise hook
    armed) waits until another thread has run the hooked model (or copied it)."""

    def __init__(self) -> None:
        super().__init__()
        self.sync = Events()
        self.user: int | None = None
        self.calls = 0

    @property
    def measuring(self) -> threading.Event:
        return self.sync.measuring

    @property
    def other_done(self) -> threading.Event:
        return self.sync.other_done

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if threading.get_ident() != self.user and not self.measuring.is_set():
            self.calls += 1
            if self.calls == 2:  # the first after the clean one: copies, the noise hook armed
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


class Vectors(nn.Module):
    """(batch, positions, 16) vectors → tanh layer → mean → 3 logits, with a ``meter``."""

    def __init__(self, meter: Meter) -> None:
        super().__init__()
        torch.manual_seed(0)  # test-only: init
        self.body = nn.Sequential(nn.Linear(16, 32), nn.Tanh())
        self.head = nn.Linear(32, 3)
        self.meter = meter

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        with self.meter.running():
            return self.head(self.body(z).mean(1))


def test_a_model_and_what_holds_it_take_turns():
    """The locks are the modules': sharpness of a container holding the model (a user's
    nn.Sequential, a LightningModule's self.model) takes turns with a measurement of the model
    itself (before: the container's sharpness saved the other's perturbed weights as the clean
    ones and left them in the model), and a measurement of a callable that calls the model
    with sharpness of the model."""
    model, x = Words().eval(), ids()
    alone = token_sensitivity(model, x, Embedding("emb"), **OPTS)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    model.meter = Meter()
    holder = nn.Sequential(model, nn.Identity())
    out: list = []
    errors = run_threads(
        lambda: out.append(token_sensitivity(model, x, Embedding("emb"), **OPTS)),
        lambda: output_sharpness(holder, x, sigma_w=0.5, repeats=3, generator=0))
    assert errors == []
    assert model.meter.most == 1
    assert torch.equal(out[0].per_sample, alone.per_sample)
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())

    vec = Vectors(Meter()).eval()
    z = torch.randn(6, 5, 16, generator=torch.Generator().manual_seed(2))
    by_itself = token_sensitivity(lambda t: vec(t), z, Sequence(), **OPTS)
    vec.meter = Meter()
    errors = run_threads(
        lambda: out.append(token_sensitivity(lambda t: vec(t), z, Sequence(), **OPTS)),
        lambda: output_sharpness(vec, z, sigma_w=0.5, repeats=3, generator=0))
    assert errors == []
    assert vec.meter.most == 1
    assert torch.equal(out[1].per_sample, by_itself.per_sample)


def test_exclusive_takes_locks_in_one_order():
    """Two threads asking for the same models in opposite orders finish (no circle)."""
    a, b = Words(), Words()
    done: list[str] = []

    def take(order) -> None:
        for _ in range(200):
            with exclusive(*order):
                done.append("x")

    assert run_threads(lambda: take((a, b)), lambda: take((b, nn.Sequential(a)))) == []
    assert len(done) == 400


class Branches(nn.Module):
    """A forward that runs its embedding and one LayerNorm branch in worker threads."""

    def __init__(self, pool, inline: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)  # test-only: init
        self.emb, self.ln_a, self.ln_b = nn.Embedding(50, 16), nn.LayerNorm(16), nn.LayerNorm(16)
        self.head = nn.Linear(16, 3)
        self.pool, self.inline = pool, inline

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.inline:
            h = self.emb(ids)
            return self.head((self.ln_a(h) + self.ln_b(3.0 * h)).mean(1))
        grad = torch.is_grad_enabled()

        def run(fn, *args):  # the caller's autograd mode carried into the worker
            with torch.set_grad_enabled(grad):
                return fn(*args)

        h = self.pool.submit(run, self.emb, ids).result()
        b = self.pool.submit(run, self.ln_b, 3.0 * h)
        return self.head((self.ln_a(h) + b.result()).mean(1))


def test_a_models_own_worker_threads_are_the_measurements():
    """A model whose forward runs submodules in a thread pool: those calls are part of the
    measured forward (they never enter the model's top-level forward in another thread), so
    the noise lands and the LayerNorm blow-up counts every LayerNorm (a rule by thread alone
    refused the first and left a LayerNorm out of the second: 1.28 against 0.55)."""
    from concurrent.futures import ThreadPoolExecutor

    from senslab.measure.sharpness import layernorm_blowup

    with ThreadPoolExecutor(2) as pool:
        model, inline = Branches(pool).eval(), Branches(pool, inline=True).eval()
        x = ids()
        assert torch.equal(layernorm_blowup(model, x), layernorm_blowup(inline, x))
        got = token_sensitivity(model, x, Embedding("emb"), **OPTS)
        want = token_sensitivity(inline, x, Embedding("emb"), **OPTS)
    assert torch.equal(got.per_sample, want.per_sample)


def test_a_copy_taken_while_measuring_carries_no_live_hook():
    """copy.deepcopy of a model while another thread measures it copies the hooks on it; the
    copies pass every forward through (before: the copy's first forward got noise, or failed
    with "ran on 2 rows, expected 1"). ``exclusive(model)`` around the copy gives one taken
    between measurements."""
    import copy

    model, x = Waiting().eval(), ids()
    with torch.no_grad():
        clean = model.head(model.body(model.emb(x)).mean(1))
        first = model.head(model.body(model.emb(x[:1])).mean(1))
    copies: list = []

    def user() -> None:
        model.user = threading.get_ident()
        assert model.measuring.wait(10.0)
        try:
            copies.append(copy.deepcopy(model))
        finally:
            model.other_done.set()

    assert run_threads(user, lambda: token_sensitivity(model, x, Embedding("emb"),
                                                       **OPTS)) == []
    twin = copies[0]  # its forwards do not wait: the events are set
    with torch.no_grad():
        assert torch.equal(twin(x), clean)
        assert torch.equal(twin(x[:1]), first)
    with exclusive(model):
        assert len(copy.deepcopy(model).emb._forward_hooks) == 0


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
