"""One model, several threads (senslab._exclusive): measurements of one model take turns (before:
one thread's noise landed in the other's forwards and three of four threads failed with a false
"ran 3 times in one forward pass"; sharpness's perturbed weights were the other measurement's
weights), and a thread that runs the model without measuring it (a training loop) is left alone
by the measurement's hooks (before: its forward made the measurement fail, or was refused as a
forward that switches autocast on by itself)."""

from __future__ import annotations

import threading
import warnings

import pytest
import torch
from metric_models import Meter
from torch import nn

from senslab.measure import exclusive, token_sensitivity
from senslab.measure.sharpness import layernorm_blowup, output_sharpness
from senslab.tokens import Embedding, Sequence

OPTS = {"sigma": 1.0, "repeats": 4, "generator": 1, "precision": "float32"}


class Words(nn.Module):
    """Token ids → embedding → LayerNorm → tanh layer → mean → 3 logits; ``meter`` (optional)
    counts the forwards running at once and makes the first wait for a second."""

    def __init__(self, meter: Meter | None = None, dropout: float = 0.0) -> None:
        super().__init__()
        torch.manual_seed(0)  # test-only: init
        self.emb, self.norm = nn.Embedding(50, 16), nn.LayerNorm(16)
        self.body = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Dropout(dropout))
        self.head = nn.Linear(32, 3)
        self.meter = meter

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.meter is None:
            return self.logits(ids)
        with self.meter.running():
            return self.logits(ids)

    def logits(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.norm(self.emb(ids))).mean(1))


def ids() -> torch.Tensor:
    return torch.randint(0, 50, (24, 10), generator=torch.Generator().manual_seed(3))


def run_threads(*jobs, names: tuple[str, ...] = ()) -> list[str]:
    """Run ``jobs`` in threads (named ``names`` in order), the errors they raised; a thread
    still running after a minute (a deadlock) fails the test instead of hanging it."""
    errors: list[str] = []

    def guarded(job) -> None:
        try:
            job()
        except Exception as err:  # reported, not lost with the thread
            errors.append(f"{type(err).__name__}: {err}")

    threads = [threading.Thread(target=guarded, args=(job,), daemon=True,
                                name=names[k] if k < len(names) else None)
               for k, job in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60.0)
    assert not any(t.is_alive() for t in threads), "threads still waiting: a deadlock"
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


@pytest.mark.parametrize("held", [False, True])
def test_sharpness_and_sensitivity_of_one_model_at_once(held):
    """Sharpness perturbs the weights in place; a measurement of the model at the same time
    never sees them — also beside sharpness of a container holding the model (a user's
    nn.Sequential, a LightningModule's self.model; before: the container's sharpness saved the
    other's perturbed weights as the clean ones and left them in the model)."""
    model, x = Words().eval(), ids()
    alone = token_sensitivity(model, x, Embedding("emb"), **OPTS)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    model.meter = Meter()
    target = nn.Sequential(model, nn.Identity()) if held else model
    out: list = []
    errors = run_threads(
        lambda: out.append(token_sensitivity(model, x, Embedding("emb"), **OPTS)),
        lambda: output_sharpness(target, x, sigma_w=0.5, repeats=3, generator=0))
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
    """Events shared by a model's copies (``copy.deepcopy`` returns the same object)."""

    def __init__(self) -> None:
        self.inside, self.measuring, self.other_done = (threading.Event(), threading.Event(),
                                                        threading.Event())

    def __deepcopy__(self, memo: dict) -> Events:
        return self


class Waiting(Words):
    """A measurement and another thread interleaved. The other thread (named "other") enters
    the model's forward first and waits there, before any hooked module, until the measurement
    reaches its forward number ``at`` (2: the first of perturbed copies, the noise hook armed;
    1: the LayerNorm blow-up's only one), which waits until the other thread is done — so that
    thread is inside the model's forward when the measurement starts, and runs its modules
    while the measurement's hooks are on them."""

    def __init__(self, at: int = 2) -> None:
        super().__init__()
        self.sync, self.at, self.calls = Events(), at, 0

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if threading.current_thread().name == "other":
            self.sync.inside.set()
            assert self.sync.measuring.wait(10.0), "the measurement never reached its forward"
            return super().forward(ids)
        if not self.sync.measuring.is_set():
            self.calls += 1
            if self.calls == self.at:
                self.sync.measuring.set()
                assert self.sync.other_done.wait(10.0), "the other thread never finished"
        return super().forward(ids)


def penalty(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    from senslab.train.regularize import sensitivity_penalty

    with torch.no_grad():
        return sensitivity_penalty(model, x, tokens=Embedding("emb"),
                                   generator=torch.Generator().manual_seed(0))[0]


def flips(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return token_sensitivity(model, x, Embedding("emb"), **OPTS).per_sample


#: name: (the measurement, its forward the other thread meets)
MEASURES = {"token_sensitivity": (flips, 2), "layernorm_blowup": (layernorm_blowup, 1),
            "sensitivity_penalty": (penalty, 2)}


@pytest.mark.parametrize("name,under_autocast,direct", [
    ("token_sensitivity", False, False), ("token_sensitivity", True, False),
    ("layernorm_blowup", False, False), ("sensitivity_penalty", False, False),
    ("token_sensitivity", False, True), ("layernorm_blowup", False, True),
    ("sensitivity_penalty", False, True)])
def test_another_threads_forward_is_left_alone(name, under_autocast, direct):
    """A thread that runs the model while another measures it (a training loop, say; here
    already inside the model's forward when the measurement starts) gets the model's own
    outputs, and the measurement its own numbers: the hooks (the noise, the LayerNorm
    blow-up's, the regularizer's) pass that thread's forwards through; a bf16 autocast there is
    not the model's own (before: refused with "ran 2 times in one forward pass", or a blow-up
    of other numbers, without a word). Also where that thread calls ``model.forward(x)``
    (``direct``: before, the hooks took it for the measurement's forward)."""
    measure, at = MEASURES[name]
    model, x = Waiting(at).eval(), ids()
    with torch.no_grad():
        clean = model.logits(x)
    alone = measure(Words().eval(), x)
    got: list = []
    out: list = []

    def other() -> None:
        try:
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16,
                                                 enabled=under_autocast):
                got.append((model.forward(x) if direct else model(x)).float())
        finally:
            model.sync.other_done.set()

    def measuring() -> None:
        assert model.sync.inside.wait(10.0)
        out.append(measure(model, x))

    assert run_threads(other, measuring, names=("other", "measuring")) == []
    if not under_autocast:
        assert torch.equal(got[0], clean)
    assert torch.equal(out[0], alone)


@pytest.mark.parametrize("name", sorted(MEASURES))
def test_a_copy_taken_while_measuring_carries_no_live_hook(name):
    """copy.deepcopy of a model while another thread measures it copies the hooks on it, as
    hooks that do nothing (before: the copy's forward got noise or failed with "ran on 2 rows,
    expected 1", or appended to the finished measurement's lists). ``exclusive(model)`` around
    the copy gives one taken between measurements: its own mode, no hooks."""
    import copy

    measure, at = MEASURES[name]
    model, x = Waiting(at).eval(), ids()
    with torch.no_grad():
        clean, first = model.logits(x), model.logits(x[:1])
    copies: list = []

    def copying() -> None:
        assert model.sync.measuring.wait(10.0)
        try:
            copies.append(copy.deepcopy(model))
        finally:
            model.sync.other_done.set()

    assert run_threads(copying, lambda: measure(model, x)) == []
    twin = copies[0]  # its forwards do not wait: the events are set
    with torch.no_grad():
        assert torch.equal(twin(x), clean)
        assert torch.equal(twin(x[:1]), first)
    with exclusive(model):
        snapshot = copy.deepcopy(model)
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in snapshot.modules())


SETUP = """
import threading, torch
from torch import nn
from senslab.measure import TokenSensitivity, exclusive, token_sensitivity
from senslab.tokens import Embedding
torch.manual_seed(0)
model = nn.Sequential(nn.Embedding(50, 16), nn.Linear(16, 3)).eval()
x = torch.randint(0, 50, (4, 6), generator=torch.Generator().manual_seed(3))
opts = {"sigma": 1.0, "repeats": 2, "generator": 1, "precision": "float32"}
metric = TokenSensitivity(model, Embedding("0"), **opts)
"""

DEADLOCK = SETUP + """

def holding(part):
    for _ in range(5):
        with exclusive(part):
            metric.update(x)
            token_sensitivity(model, x, Embedding("0"), **opts)

def plain():
    for _ in range(5):
        metric.update(x)
        token_sensitivity(model, x, Embedding("0"), **opts)

threads = [threading.Thread(target=f, daemon=True)
           for f in (lambda: holding(model), lambda: holding(model[1]), plain)]
for t in threads:
    t.start()
for t in threads:
    t.join(60)
print("alive", sum(t.is_alive() for t in threads), "examples", metric.compute().num_examples
      if not any(t.is_alive() for t in threads) else -1)
"""


def test_a_caller_holding_the_lock_and_another_thread_never_deadlock():
    """A caller that holds ``exclusive`` — for the model, or only a part of it — and measures,
    beside another thread measuring with the same metric or model: all finish, since every
    measurement takes the measurements' lock before its metric's (before: a metric lock taken
    first, or per-module locks taken in address order under a part already held, left the
    threads waiting forever). In a process of its own, so a deadlock fails this test only."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", DEADLOCK], capture_output=True, text=True,
                          timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["alive", "0", "examples", "60"]


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


def test_a_callable_and_the_model_it_calls_take_turns():
    """A measurement of ``lambda t: model(t)`` waits for sharpness of ``model`` (the lock is one
    for every model): its forwards never see the perturbed weights."""
    out: list = []
    vec = Vectors(Meter()).eval()
    z = torch.randn(6, 5, 16, generator=torch.Generator().manual_seed(2))
    by_itself = token_sensitivity(lambda t: vec(t), z, Sequence(), **OPTS)
    vec.meter = Meter()
    errors = run_threads(
        lambda: out.append(token_sensitivity(lambda t: vec(t), z, Sequence(), **OPTS)),
        lambda: output_sharpness(vec, z, sigma_w=0.5, repeats=3, generator=0))
    assert errors == []
    assert vec.meter.most == 1
    assert torch.equal(out[0].per_sample, by_itself.per_sample)


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


class Recomputed(Words):
    """Embedding and LayerNorm in one activation checkpoint (non-reentrant: the backward
    recomputes them); the measurement's forward number ``at`` waits for the other thread's
    backward (events in ``sync``)."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.sync, self.at, self.calls = Events(), at, 0

    def logits(self, ids: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        h = checkpoint(lambda i: self.norm(self.emb(i)), ids, use_reentrant=False)
        return self.head(self.body(h).mean(1))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if threading.current_thread().name != "other" and not self.sync.measuring.is_set():
            self.calls += 1
            if self.calls == self.at:
                self.sync.measuring.set()
                assert self.sync.other_done.wait(10.0), "the other thread never finished"
        return self.logits(ids)


@pytest.mark.parametrize("name", ["token_sensitivity", "layernorm_blowup"])
def test_another_threads_backward_recomputation_is_left_alone(name):
    """A training step in another thread whose backward recomputes a checkpointed segment
    (torch.utils.checkpoint) while the model is measured: its gradients are the model's own
    and the measurement's numbers its own (before: the recomputation ran outside the model's
    forward and took the measurement's noise, or added LayerNorm factors to the blow-up)."""
    measure, at = MEASURES[name]
    model, x = Recomputed(at).eval(), ids()
    model.logits(x).square().sum().backward()
    want = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad()
    alone = measure(Words().eval(), x)
    out: list = []

    def other() -> None:
        try:
            loss = model(x).square().sum()
            model.sync.inside.set()
            assert model.sync.measuring.wait(10.0)
            loss.backward()
        finally:
            model.sync.other_done.set()

    def measuring() -> None:
        assert model.sync.inside.wait(10.0)  # the forward before, its backward during
        out.append(measure(model, x))

    assert run_threads(other, measuring, names=("other", "measuring")) == []
    assert all(torch.equal(p.grad, want[k]) for k, p in model.named_parameters())
    assert torch.equal(out[0], alone)


def test_a_long_wait_for_a_turn_says_which_thread_measures(monkeypatch):
    """A thread that has waited long for its turn is told which thread measures (the one case
    that never ends — a measurement called from a thread that the measured forward waits for —
    hung without a word), and then measures as usual."""
    from senslab import _exclusive

    monkeypatch.setattr(_exclusive, "_PATIENCE", 0.2)
    model, x = Words().eval(), ids()
    alone = flips(model, x)
    held, release = threading.Event(), threading.Event()

    def holding() -> None:
        with exclusive(model):
            held.set()
            release.wait(10.0)

    def waited(errors: bool) -> torch.Tensor:
        held.clear()
        release.clear()
        t = threading.Thread(target=holding, name="measuring", daemon=True)
        t.start()
        assert held.wait(10.0)
        timer = threading.Timer(1.0, release.set)
        timer.start()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error" if errors else "default")
                return flips(model, x)
        finally:
            t.join(10.0)
            timer.cancel()

    with pytest.warns(RuntimeWarning, match="waited 0.2 s .*while thread 'measuring' measures"):
        got = waited(errors=False)
    assert torch.equal(got, alone)
    # warnings made errors (-W error, pytest's filterwarnings=error): the wait goes on
    assert torch.equal(waited(errors=True), alone)


FORK = SETUP + """
import os, signal
from senslab.measure.tokenwise import _lock
metric.update(x)

def in_child(job):
    pid = os.fork()
    if pid == 0:
        signal.alarm(20)  # a child waiting forever fails
        try:
            code = job()
        except RuntimeError as err:
            code = 10 if "forked while thread 'measuring' held" in str(err) else 11
        os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])

def measures():
    return 0 if token_sensitivity(model, x, Embedding("0"), **opts).num_examples == 4 else 12

def holding(lock, held, release):
    with lock:
        held.set()
        release.wait(60)

codes = [in_child(measures)]
with exclusive():  # the forking thread's own turn: the child measures inside it
    codes.append(in_child(measures))
for lock, job in ((exclusive(), measures), (_lock(metric), lambda: metric.compute() and 0)):
    held, release = threading.Event(), threading.Event()
    t = threading.Thread(target=holding, args=(lock, held, release), name="measuring")
    t.start()
    held.wait(60)
    codes.append(in_child(job))
    release.set()
    t.join()
codes.append(in_child(measures))
print(*codes)
"""


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="no fork on this platform")
def test_a_process_forked_during_a_measurement_refuses_instead_of_waiting():
    """A child forked while another thread held the measurements' turn (or a metric's lock)
    refuses to measure with an error that says so (before: it waited forever for a thread
    that is not in it, while the model stays in that measurement's state); forked before,
    after, or by the measuring thread itself, it measures."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", FORK], capture_output=True,
                          text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["0", "0", "10", "10", "0"]
