"""A Ctrl-C whose KeyboardInterrupt is swallowed where it lands — inside a weakref finalizer or a
``__del__`` (Python prints "Exception ignored" and goes on), or in a library's ``except
BaseException`` — still stops a trainer's own loop (:class:`~senslab.train.looprun.LoopRun`),
as it stops ``fit``: at the loop's next step boundary (:meth:`LoopRun.at`, or once the next
checkpoint is written), with the usual "interrupted at step N" and a re-run that resumes bit for
bit. Without the watch the loop ran to its end as if nothing was pressed."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from senslab.train.loop import TrainingInterrupted
from senslab.train.looprun import LoopRun, generator_states, set_generator_states
from senslab.train.loops._common import EpochLoop, minibatch_epoch, run_epochs
from senslab.train.rundir import RunDir


def _ctrl_c_swallowed_by_a_library() -> None:
    """A real SIGINT whose KeyboardInterrupt a library's ``except BaseException`` drops."""
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)  # the handler runs here and raises: the sleep ends at once
    except BaseException:  # noqa: BLE001  (what the library does)
        pass


def _ctrl_c_in_a_finalizer() -> None:
    """A real SIGINT that lands while a weakref finalizer runs (an object dying mid-step)."""
    def inside() -> None:
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(10_000):  # the handler runs here, inside the finalizer
            pass

    dying = type("Dying", (), {})()
    weakref.finalize(dying, inside)
    del dying  # the finalizer runs now, and the Ctrl-C lands in it


SWALLOWED = {"library": _ctrl_c_swallowed_by_a_library, "finalizer": _ctrl_c_in_a_finalizer}


@pytest.fixture
def python_handler(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[type]]:
    """Python's own SIGINT handler in place (put back after), and the exceptions Python printed
    as "Exception ignored" (a KeyboardInterrupt raised inside a finalizer)."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals are delivered to the main thread only")
    swallowed: list[type] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: swallowed.append(u.exc_type))
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield swallowed
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back
    finally:
        signal.signal(signal.SIGINT, previous)


def _walk(path: Path, seed: int, ctrl_c: Callable[[], None] | None = None,
          at_step: int = 0) -> dict[str, Any]:
    """A toy loop: 6 steps of a random walk, a record and a checkpoint every 2 steps;
    ``ctrl_c()`` runs inside step ``at_step`` (a Ctrl-C that the step swallows)."""
    with LoopRun(path, {"seed": seed}) as run:
        if run.summary is not None:
            return run.summary
        gen = torch.Generator().manual_seed(seed)
        state = run.restore()
        step, value = 0, torch.zeros(3)
        if state is not None:
            step, value = state["step"], state["value"]
            set_generator_states(state["gens"], gen=gen)
        while step < 6:
            value = value + torch.randn(3, generator=gen)
            step += 1
            if step == at_step and ctrl_c is not None:
                ctrl_c()
            run.at(step)
            if step % 2 == 0:
                run.log({"step": step, "value": value.tolist()})
                run.checkpoint(step, {"value": value, "gens": generator_states(gen=gen)})
        return run.finish({"name": path.name, "final": {"value": value.tolist()}})


def _untimed(path: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "time"} for r in RunDir(path).metrics()]


@pytest.mark.parametrize("how", sorted(SWALLOWED))
def test_a_swallowed_ctrl_c_stops_the_loop_at_the_next_step(
        tmp_path: Path, python_handler: list[type], how: str) -> None:
    whole = _walk(tmp_path / "whole", 3)
    cut = tmp_path / "cut"
    with pytest.raises(TrainingInterrupted) as err:
        _walk(cut, 3, SWALLOWED[how], at_step=3)
    assert (err.value.step, err.value.checkpoint, err.value.epoch) == (3, 2, None)
    assert str(err.value) == ("interrupted at step 3; re-run the same command to resume (it "
                              "resumes from the checkpoint at step 2)")
    assert [r["step"] for r in RunDir(cut).metrics()] == [2]  # it stopped there
    assert not (cut / "summary.json").exists()
    assert not RunDir(cut).holds_lock() and not (cut / ".senslab.owner").exists()
    assert python_handler == []  # nothing raised inside a finalizer: no "Exception ignored"
    resumed = _walk(cut, 3)
    assert _untimed(cut) == _untimed(tmp_path / "whole")
    assert resumed["final"] == whole["final"]


def test_a_ctrl_c_swallowed_at_a_checkpoint_step_stops_once_it_is_saved(
        tmp_path: Path, python_handler: list[type]) -> None:
    """Swallowed during a step that logs and checkpoints: the record and the checkpoint are
    written (the step's work is kept), then the loop stops; a Ctrl-C swallowed after the last
    checkpoint stops the run when the block ends."""
    cut = tmp_path / "cut"
    with pytest.raises(TrainingInterrupted) as err:
        # run.at(4) comes before the step's log and checkpoint: swallow it right after at()
        with LoopRun(cut, {"seed": 3}) as run:
            run.restore()
            run.at(4)
            _ctrl_c_swallowed_by_a_library()
            run.log({"step": 4})
            run.checkpoint(4, {"value": torch.zeros(1)})
            pytest.fail("the loop went on after the checkpoint")
    assert (err.value.step, err.value.checkpoint) == (4, 4)
    assert [r["step"] for r in RunDir(cut).metrics()] == [4]
    end = tmp_path / "end"
    with pytest.raises(TrainingInterrupted) as err:
        with LoopRun(end, {"seed": 3}) as run:
            run.restore()
            run.checkpoint(6, {"value": torch.zeros(1)})
            _ctrl_c_swallowed_by_a_library()
    assert (err.value.step, err.value.checkpoint) == (6, 6)
    assert not (end / ".senslab.owner").exists()


def test_run_epochs_stops_at_the_next_epoch_and_resumes_bit_identically(
        tmp_path: Path, python_handler: list[type]) -> None:
    """The epoch trainers (grokking, sparse_parity, sparse_frequent: ``run_epochs``) tell
    :meth:`LoopRun.at` their position once per epoch: a Ctrl-C swallowed in epoch 3 stops the
    run as epoch 4 begins, at the exact step the loop reached."""

    @dataclass
    class Cfg:
        name: str = "toy"
        epochs: int = 6
        eval_every: int = 2

    def build(swallow_in: int | None) -> Callable[[], EpochLoop]:
        def make() -> EpochLoop:
            g = torch.Generator().manual_seed(0)
            x, y = torch.randn(12, 3, generator=g), torch.randn(12, 1, generator=g)
            torch.manual_seed(0)
            model = nn.Linear(3, 1)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            order = torch.Generator().manual_seed(1)
            epochs = [0]

            def train_epoch() -> int:
                epochs[0] += 1
                steps = minibatch_epoch(model, opt, x, y, nn.functional.mse_loss, 4, order)
                if epochs[0] == swallow_in:
                    _ctrl_c_swallowed_by_a_library()
                return steps

            def evaluate() -> dict[str, float]:
                with torch.no_grad():
                    return {"train/loss": nn.functional.mse_loss(model(x), y).item()}

            return EpochLoop(model, opt, train_epoch, evaluate, lambda history: {},
                             generators={"order": order})
        return make

    whole = run_epochs(Cfg(), tmp_path / "whole", "toy", build(None))
    cut = tmp_path / "cut"
    with pytest.raises(TrainingInterrupted) as err:
        run_epochs(Cfg(), cut, "toy", build(3))
    assert (err.value.step, err.value.checkpoint, err.value.epoch) == (9, 6, None)
    assert str(err.value) == ("interrupted at step 9; re-run the same command to resume (it "
                              "resumes from the checkpoint at step 6)")
    resumed = run_epochs(Cfg(), cut, "toy", build(None))
    assert _untimed(cut) == _untimed(tmp_path / "whole")
    assert resumed["final"] == whole["final"]


def test_a_swallowed_ctrl_c_stops_a_nested_run_and_only_in_the_main_thread(
        tmp_path: Path, python_handler: list[type]) -> None:
    """A LoopRun inside another (the enclosing block's watch records the Ctrl-C) stops at its
    next step; a LoopRun in another thread — where Python delivers no signal — neither installs
    a handler (that raised ValueError there) nor stops for the main thread's Ctrl-C."""
    with pytest.raises(TrainingInterrupted) as err:
        with LoopRun(tmp_path / "outer", {"seed": 0}) as outer:
            outer.restore()
            _walk(tmp_path / "inner", 3, _ctrl_c_swallowed_by_a_library, at_step=5)
    assert (err.value.step, err.value.checkpoint) == (5, 4)
    assert [r["step"] for r in RunDir(tmp_path / "inner").metrics()] == [2, 4]

    # the main thread's Ctrl-C is swallowed while a worker runs its own loop: the worker's run
    # finishes, the main thread's stops
    started, pressed, results = threading.Event(), threading.Event(), []

    def worker() -> None:
        try:
            with LoopRun(tmp_path / "worker", {"seed": 1}) as run:
                run.restore()
                started.set()
                pressed.wait(30)
                run.at(1)
                run.checkpoint(1, {"value": torch.zeros(1)})
                results.append(run.finish({"name": "worker"})["name"])
        except BaseException as e:  # noqa: BLE001  (reported to the main thread)
            results.append(e)

    with pytest.raises(TrainingInterrupted):
        with LoopRun(tmp_path / "main", {"seed": 2}) as run:
            run.restore()
            thread = threading.Thread(target=worker)
            thread.start()
            started.wait(30)
            _ctrl_c_swallowed_by_a_library()
            pressed.set()
            thread.join(30)
            run.at(1)
    assert results == ["worker"]


def test_a_watch_inside_another_reads_the_ctrl_c_the_enclosing_one_recorded(
        python_handler: list[type]) -> None:
    """A measurement's watch inside a training loop's (the chunk runner inside a LoopRun or
    ``fit``) installs no handler of its own: the enclosing one records a swallowed Ctrl-C, and
    the inner :meth:`check` must read it there, so the measurement stops at its next chunk
    rather than run to its end."""
    from senslab._sigint import SigintWatch

    with pytest.raises(KeyboardInterrupt):  # the outer block ends: it raises the Ctrl-C
        with SigintWatch() as outer:
            with SigintWatch() as inner:
                assert not inner._installed
                inner.check()  # nothing seen yet
                _ctrl_c_in_a_finalizer()
                assert outer.seen and not inner.seen
                with pytest.raises(KeyboardInterrupt):
                    inner.check()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert python_handler == []  # nothing printed as "Exception ignored"
