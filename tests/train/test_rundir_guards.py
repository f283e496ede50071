"""The run directory's guards within one process, and its final checkpoint.

* one writer per directory, threads included: a second thread that opens a locked run directory
  for writing (``RunDir.acquire``, ``LoopRun``, ``fit``) fails at once with ``RunDirInUse``;
  only the holding thread nests; temporary files carry the thread, so two threads never share
  one;
* the final model: ``RunDir.final_checkpoint`` is the checkpoint at the step ``summary.json``
  says the run finished at, never an earlier one in its place.

The threads are ordered with events, not sleeps: each test is deterministic.
"""

from __future__ import annotations

import json
import os
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from newer_checkpoint import rewrite_as_newer

from senslab.train import loop, rundir
from senslab.train.config import RunConfig, apply_overrides
from senslab.train.loop import fit
from senslab.train.looprun import LoopRun
from senslab.train.rundir import RunDir, RunDirError, RunDirInUse

MLP = ["model.name=mlp", "data.name=digits", "track.num_examples=32"]


def tiny(epochs: int = 2, extra: list[str] | None = None) -> RunConfig:
    """mlp on digits: 15 steps of 100 examples per epoch, a checkpoint after each."""
    return apply_overrides(RunConfig(name="tiny"), MLP + [f"train.epochs={epochs}"]
                           + (extra or []))


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)  # conftest restores the count afterwards


class Holder:
    """Another thread that holds ``path``'s lock (``RunDir.writing``) until :meth:`stop`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.held, self.stop_event = threading.Event(), threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="holder")

    def _run(self) -> None:
        try:
            with RunDir(self.path).writing():
                self.held.set()
                self.stop_event.wait(60)
        except BaseException as err:  # reported by the test
            self.error = err
            self.held.set()

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(60)
        assert not self.thread.is_alive()
        assert self.error is None, self.error


@contextmanager
def held_by_another_thread(path: Path) -> Iterator[Holder]:
    holder = Holder(path)
    holder.thread.start()
    assert holder.held.wait(60) and holder.error is None, holder.error
    try:
        yield holder
    finally:
        holder.stop()


def in_thread(fn: Callable[[], Any]) -> Any:
    """``fn()`` run in a new thread: its result, or the exception it raised."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as err:
            out.append(err)

    t = threading.Thread(target=run)
    t.start()
    t.join(60)
    assert not t.is_alive()
    return out[0]


# -- one writer, threads included -----------------------------------------------------------------


def test_a_second_thread_is_refused_at_once_with_the_holder_named(tmp_path: Path) -> None:
    run = tmp_path / "run"
    with held_by_another_thread(run):
        rd = RunDir(run)
        assert not rd.holds_lock()  # the other thread's hold is not this thread's
        with pytest.raises(RunDirInUse) as err:
            rd.acquire()
        msg = str(err.value)
        assert f"{run} is in use by another thread of this process" in msg
        assert "'holder'" in msg and f"pid {os.getpid()}" in msg
        assert "use another --out directory" in msg
        with pytest.raises(RunDirInUse, match="another thread"):
            with LoopRun(run, {"lr": 0.1}) as looprun:
                looprun.restore()
        rd.release()  # releases nothing: this thread holds nothing
        assert (run / ".senslab.owner").exists()
        with pytest.raises(RunDirInUse):
            rd.acquire()
    # once the holder is gone, the directory is free
    with RunDir(run).writing() as rd:
        assert rd.holds_lock()
    assert not RunDir(run).holds_lock() and not (run / ".senslab.owner").exists()


def test_the_holding_thread_nests(tmp_path: Path) -> None:
    rd = RunDir(tmp_path / "run")
    rd.acquire()
    rd.acquire()
    with LoopRun(rd.path, {"lr": 0.1}) as run:  # LoopRun inside a held lock: nested
        run.restore()
    rd.release()
    assert rd.holds_lock()
    assert isinstance(in_thread(rd.acquire), RunDirInUse)  # still held: other threads refused
    rd.release()
    assert not rd.holds_lock()

    def write() -> None:
        with RunDir(rd.path).writing():
            pass

    assert in_thread(write) is None  # released: another thread may write now


def test_fit_in_a_second_thread_is_refused_while_the_first_trains(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The audit's case (two threads training one --out): the first thread is held inside
    training after its first checkpoint; fit on the same directory in this thread fails at once
    (it resumed from that checkpoint and both trained into one log), and the first one's run
    finishes intact."""
    run = tmp_path / "run"
    real = loop._train_step
    inside, go = threading.Event(), threading.Event()
    first = threading.current_thread()
    calls = [0]

    def step(*args: Any) -> float:
        if threading.current_thread() is not first:
            calls[0] += 1
            if calls[0] == 20:  # in epoch 2, after the checkpoint at step 15
                inside.set()
                go.wait(60)
        return real(*args)

    monkeypatch.setattr(loop, "_train_step", step)
    result: list[Any] = []
    trainer = threading.Thread(
        target=lambda: result.append(fit(tiny(), run, progress=False)), name="trainer")
    trainer.start()
    try:
        assert inside.wait(120)
        assert [p.name for p in RunDir(run).checkpoints()] == ["step-00000015.safetensors"]
        with pytest.raises(RunDirInUse, match="another thread of this process"):
            fit(tiny(), run, progress=False)
    finally:
        go.set()
        trainer.join(120)
    assert result and result[0]["steps"] == 30
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps))  # one writer: no step logged twice
    assert RunDir(run).metrics()  # the log reads back


def test_temporary_files_of_two_threads_never_share_a_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    names: list[str] = []
    real = os.replace

    def replace(src: Any, dst: Any) -> None:
        names.append(Path(src).name)
        real(src, dst)

    monkeypatch.setattr(rundir.os, "replace", replace)
    target = tmp_path / "x.json"
    rundir.atomic_write_bytes(target, b"1")
    assert in_thread(lambda: rundir.atomic_write_bytes(target, b"2")) is None
    assert len(names) == 2 and names[0] != names[1]
    assert names[0] == f".x.json.tmp-{os.getpid()}-{threading.get_ident()}"
    assert target.read_bytes() == b"2"
    # a writer that takes the lock still removes the ones a dead writer left
    run = tmp_path / "run"
    run.mkdir()
    orphan = run / f".config.json.tmp-999999-{threading.get_ident()}"
    orphan.write_bytes(b"half")
    with RunDir(run).writing():
        pass
    assert not orphan.exists()


# -- the final checkpoint --------------------------------------------------------------------------


def _flip(path: Path, at: int = -100) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run (30 steps, checkpoints at 15 and 30), copied by each test that damages it."""
    torch.set_num_threads(1)
    run = tmp_path_factory.mktemp("final") / "run"
    fit(tiny(), run, progress=False)
    return run


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_final_checkpoint_is_the_finished_step(finished: Path, tmp_path: Path) -> None:
    run = _copy(finished, tmp_path / "run")
    rd = RunDir(run)
    path, state = rd.final_checkpoint()
    assert path.name == "step-00000030.safetensors" and state["position"]["step"] == 30
    # the same checkpoint load_latest resumes from, while it is intact
    latest = rd.load_latest()
    assert latest is not None and latest[0] == path


def test_a_damaged_final_checkpoint_is_refused_not_replaced(finished: Path, tmp_path: Path) -> None:
    """The audit's case: one flipped byte in the final checkpoint. load_latest (resuming) falls
    back to step 15, but the final model is refused, naming the file and the fix."""
    run = _copy(finished, tmp_path / "run")
    _flip(run / "checkpoints" / "step-00000030.safetensors")
    rd = RunDir(run)
    with pytest.warns(UserWarning, match="falling back to the previous checkpoint"):
        latest = rd.load_latest()
    assert latest is not None and latest[0].name == "step-00000015.safetensors"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback warning: an error instead
        with pytest.raises(RunDirError) as err:
            rd.final_checkpoint()
    msg = str(err.value)
    assert "step-00000030.safetensors" in msg and "does not match its checksum" in msg
    assert "finished at step 30" in msg
    assert f"delete {run / 'summary.json'} and {run / 'checkpoints'}" in msg
    assert "resumes from its last good checkpoint" in msg


def test_a_missing_final_checkpoint_is_refused(finished: Path, tmp_path: Path) -> None:
    run = _copy(finished, tmp_path / "run")
    (run / "checkpoints" / "step-00000030.safetensors").unlink()
    with pytest.raises(RunDirError, match=r"step-00000030.safetensors.*is missing"):
        RunDir(run).final_checkpoint()


def test_an_unfinished_run_has_no_final_checkpoint(finished: Path, tmp_path: Path) -> None:
    run = _copy(finished, tmp_path / "run")
    (run / "summary.json").unlink()
    with pytest.raises(RunDirError, match="has not finished"):
        RunDir(run).final_checkpoint()


def test_the_stated_fix_retrains_the_end_and_restores_the_final_model(
        finished: Path, tmp_path: Path) -> None:
    """What the error says to do works: delete summary.json and the damaged checkpoint, re-run;
    the run resumes from its last good checkpoint and retrains the rest, bit for bit."""
    run = _copy(finished, tmp_path / "run")
    ckpt = run / "checkpoints" / "step-00000030.safetensors"
    _flip(ckpt)
    with pytest.raises(RunDirError):
        RunDir(run).final_checkpoint()
    (run / "summary.json").unlink()
    ckpt.unlink()
    summary = fit(tiny(), run, progress=False)
    assert summary["steps"] == 30
    _, state = RunDir(run).final_checkpoint()
    _, want = RunDir(finished).final_checkpoint()
    for key, value in want["model"].items():
        assert torch.equal(state["model"][key], value), key


# -- the readers of the final model ---------------------------------------------------------------


def test_sigma_sweep_and_load_final_refuse_a_damaged_final_checkpoint(
        finished: Path, tmp_path: Path) -> None:
    """The audit's case: they measured the step-15 model as the "final model" and cached it."""
    from senslab.experiments.lowsens._comparison import sigma_sweep
    from senslab.experiments.lowsens._posthoc import load_final

    run = _copy(finished, tmp_path / "run")
    intact = sigma_sweep(run, (0.1, 0.5))
    assert json.loads((run / "sigma_sweep.json").read_text())["step"] == 30
    (run / "sigma_sweep.json").unlink()
    _flip(run / "checkpoints" / "step-00000030.safetensors")
    with pytest.raises(RunDirError, match="step-00000030.safetensors does not match"):
        sigma_sweep(run, (0.1, 0.5))
    assert not (run / "sigma_sweep.json").exists()  # nothing cached
    with pytest.raises(RunDirError, match="the final checkpoint of"):
        load_final(tiny(), run)
    # a sweep cached from another checkpoint (the old fallback's) is not reused
    (run / "sigma_sweep.json").write_text(json.dumps(
        {"step": 15, "sigmas": [0.1, 0.5], "results": {"0.1": {"estimate": 9.0}}}))
    (run / "checkpoints" / "step-00000030.safetensors").write_bytes(
        (finished / "checkpoints" / "step-00000030.safetensors").read_bytes())
    assert sigma_sweep(run, (0.1, 0.5)) == intact
    # nor one of the same step made under another config.json (a directory re-run with other
    # settings after its checkpoints were deleted), nor one written before the key was kept
    cached = json.loads((run / "sigma_sweep.json").read_text())
    digests = RunDir(run).config_digests()
    assert {k: cached[k] for k in digests} == digests
    for stale in ({**cached, **dict.fromkeys(digests, "0" * 64)},
                  {k: v for k, v in cached.items() if k not in digests}):
        stale["results"] = {"0.1": {"estimate": 9.0}}
        (run / "sigma_sweep.json").write_text(json.dumps(stale))
        assert sigma_sweep(run, (0.1, 0.5)) == intact
    # a damaged cache (it raised json's bare error, the file unnamed) is measured again
    (run / "sigma_sweep.json").write_text(json.dumps(cached)[:30])
    with pytest.warns(UserWarning, match=r"sigma_sweep\.json.*measuring the σ sweep again"):
        assert sigma_sweep(run, (0.1, 0.5)) == intact
    assert json.loads((run / "sigma_sweep.json").read_text()) == cached


class _Counting:
    """A FinalMeasureExperiment whose measurement counts its calls."""

    def __new__(cls) -> Any:
        from senslab.experiments.lowsens._posthoc import FinalMeasureExperiment

        class Exp(FinalMeasureExperiment):
            calls = 0

            def final_settings(self, settings: Any) -> dict[str, Any]:
                return {"n": 1}

            def measure_final(self, cfg: RunConfig, model: Any, train: Any, test: Any,
                              settings: Any) -> dict[str, Any]:
                type(self).calls += 1
                return {"weight": float(next(model.parameters()).detach().sum())}

        return Exp()


def test_final_measure_is_keyed_by_the_checkpoint_step(finished: Path, tmp_path: Path) -> None:
    from senslab.experiments.base import Run

    run = _copy(finished, tmp_path / "run")
    exp, spec = _Counting(), Run("run", tiny())
    summary = json.loads((run / "summary.json").read_text())
    first = exp.after_run(spec, run, summary, None, lambda _: None)["final_measure"]
    cache = json.loads((run / "final_measure.json").read_text())
    digests = RunDir(run).config_digests()
    assert cache == {"settings": {"n": 1}, "step": 30, **digests,
                     "values": first} and exp.calls == 1
    assert exp.after_run(spec, run, summary, None, lambda _: None)["final_measure"] == first
    assert exp.calls == 1  # reused
    # a result of another config.json (a directory re-run with other settings after its
    # checkpoints were deleted reaches the same step) was served for the new model
    (run / "final_measure.json").write_text(json.dumps(
        {**cache, **dict.fromkeys(digests, "0" * 64)}))
    assert exp.after_run(spec, run, summary, None, lambda _: None)["final_measure"] == first
    assert exp.calls == 2
    # a result without the step (written before it was recorded) may be of an earlier model
    (run / "final_measure.json").write_text(json.dumps(
        {"settings": {"n": 1}, "values": {"weight": -1.0}}))
    assert exp.after_run(spec, run, summary, None, lambda _: None)["final_measure"] == first
    assert exp.calls == 3
    # a damaged final checkpoint: refused, and the cache is neither used nor rewritten
    stamp = (run / "final_measure.json").read_text()
    _flip(run / "checkpoints" / "step-00000030.safetensors")
    with pytest.raises(RunDirError, match="final checkpoint"):
        exp.after_run(spec, run, summary, None, lambda _: None)
    assert (run / "final_measure.json").read_text() == stamp and exp.calls == 3


def _mrpc_fixture(root: Path) -> None:
    import importlib.util

    path = Path(__file__).parents[1] / "experiments" / "test_lowsens_language.py"
    spec = importlib.util.spec_from_file_location("_lowsens_language_tests", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.write_mrpc_fixture(root)


def test_language_end_measurements_refuse_a_damaged_final_checkpoint(tmp_path: Path) -> None:
    from senslab.experiments import get_experiment
    from senslab.experiments.lowsens.language import finish_run

    data = tmp_path / "mrpc"
    data.mkdir()
    _mrpc_fixture(data)
    tiny_lstm = ["model.overrides={'layers': 1, 'dim': 16, 'heads': 2, 'dropout': 0.0}",
                 "train.epochs=1", "track.num_examples=6",
                 "data.options={'max_len': 28, 'vocab_size': 300}", f"data.root={data}"]
    cfg = next(r.config for r in get_experiment("language_mrpc").resolve("cpu", tiny_lstm)[1]
               if r.name == "lstm")
    run = tmp_path / "lstm"
    summary = fit(cfg, run, progress=False)
    final = RunDir(run).checkpoints()[-1]
    assert checkpoint_step_of(final) == summary["steps"]
    _flip(final)
    with pytest.raises(RunDirError, match=f"{final.name} does not match its checksum"):
        finish_run(cfg, run, summary)
    assert "language" not in json.loads((run / "summary.json").read_text())


def checkpoint_step_of(path: Path) -> int:
    return rundir.checkpoint_step(path)


def test_a_lock_left_by_a_thread_that_ended_is_taken_over(tmp_path: Path) -> None:
    """A thread that ended without releasing its run directory cannot write through it any
    more: another thread takes the lock over instead of being told to wait forever."""
    rd = RunDir(tmp_path / "run")
    t = threading.Thread(target=rd.acquire, name="left")
    t.start()
    t.join()
    rd.acquire()  # the holder is dead: taken over, no RunDirInUse
    try:
        assert rd.holds_lock()
    finally:
        rd.release()
    assert not rd.holds_lock()


# -- stale checkpoints, readers during training, checkpoints of another model (audit conc53) -----


def _names(run: Path) -> list[str]:
    return [p.name for p in RunDir(run).checkpoints()]


def test_a_run_without_config_json_is_refused_not_started_over(
        finished: Path, tmp_path: Path) -> None:
    """A finished run lost its config.json; training another configuration into it started
    afresh without a word, pruned its own checkpoints and left the old run's final model to be
    measured as its own. Now refused, naming the fix, with nothing touched."""
    run = _copy(finished, tmp_path / "run")
    (run / "config.json").unlink()
    before = {p.name: p.read_bytes() for p in (run / "checkpoints").iterdir()}
    with pytest.raises(RunDirError) as err:
        fit(tiny(1, ["optim.lr=0.05"]), run, progress=False)
    msg = str(err.value)
    assert "but no config.json" in msg and "step-00000030.safetensors" in msg
    assert f"restore {run / 'config.json'}" in msg and f"delete {run}" in msg
    assert {p.name: p.read_bytes() for p in (run / "checkpoints").iterdir()} == before
    with pytest.raises(RunDirError, match="but no config.json"):
        with LoopRun(run, {"lr": 0.1}):
            pass


def test_pruning_keeps_the_checkpoint_just_written(tmp_path: Path) -> None:
    """Later checkpoints left by another sitting never prune this sitting's newest one."""
    rd = RunDir(tmp_path / "run")
    for step in (75, 90):
        rd.save_checkpoint({"w": torch.full((2,), float(step))}, step, keep=0)
    rd.save_checkpoint({"w": torch.zeros(2)}, 15, keep=1)
    assert "step-00000015.safetensors" in _names(rd.path)
    rd.save_checkpoint({"w": torch.ones(2)}, 30, keep=1)
    assert "step-00000030.safetensors" in _names(rd.path)
    assert "step-00000015.safetensors" not in _names(rd.path)


def test_a_start_over_sets_unusable_checkpoints_aside(finished: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """No checkpoint can be resumed from (metrics.jsonl emptied: each would lose records): the
    run starts over with the old checkpoints moved into checkpoints/unusable/, not mixed with its
    own, and ends with its own final model."""
    run = _copy(finished, tmp_path / "run")
    (run / "summary.json").unlink()
    (run / "metrics.jsonl").write_text("")
    with pytest.warns(UserWarning, match="falling back to the previous checkpoint"):
        summary = fit(tiny(), run, progress=False)
    assert "moved them to" in capsys.readouterr().err
    aside = sorted(p.name for p in (run / "checkpoints" / "unusable").iterdir())
    assert aside == ["step-00000015.safetensors", "step-00000030.safetensors"]
    assert _names(run) == ["step-00000015.safetensors", "step-00000030.safetensors"]
    path, state = RunDir(run).final_checkpoint()
    assert summary["steps"] == 30 and state["position"]["step"] == 30
    _, want = RunDir(finished).final_checkpoint()  # same seed: the same model, retrained
    for key, value in want["model"].items():
        assert torch.equal(state["model"][key], value), key


def test_a_final_checkpoint_past_the_finished_step_is_refused(
        finished: Path, tmp_path: Path) -> None:
    """The audit's case: the old run's step-90 checkpoint outlived a new run that finished at
    step 45, and final_checkpoint returned it as the new run's model."""
    run = _copy(finished, tmp_path / "run")
    ckpts = run / "checkpoints"
    (ckpts / "step-00000045.safetensors").write_bytes(
        (ckpts / "step-00000030.safetensors").read_bytes())
    with pytest.raises(RunDirError) as err:
        RunDir(run).final_checkpoint()
    msg = str(err.value)
    assert "step-00000045.safetensors is past the step the run finished at (30" in msg
    assert f"delete {run}" in msg


def test_a_reader_relists_when_the_training_run_prunes_a_checkpoint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader listed step 2, then the run training in the directory saved step 3 and pruned
    step 2 (keep=1) before the reader opened it: the reader reads the list again and gets
    step 3, without calling anything damaged (it returned None: "every one is damaged")."""
    run = tmp_path / "run"
    writer = RunDir(run)
    writer.save_checkpoint({"w": torch.zeros(2)}, 2, keep=1)
    real = RunDir._load
    raced = [False]

    def load(path: Path, allow_unverified: bool) -> Any:
        if not raced[0]:
            raced[0] = True
            writer.save_checkpoint({"w": torch.ones(2)}, 3, keep=1)  # the writer, in between
        return real(path, allow_unverified)

    monkeypatch.setattr(RunDir, "_load", staticmethod(load))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing is damaged: no warning
        found = RunDir(run).load_latest()
    assert raced[0] and found is not None
    assert found[0].name == "step-00000003.safetensors" and torch.equal(found[1]["w"],
                                                                       torch.ones(2))


def test_a_checkpoint_of_another_model_is_named_with_the_fix(
        finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """config.json edited to another width: `measure --checkpoint` and the resume of `train`
    said "unexpected RuntimeError … probably a bug", the mismatch cut off."""
    from senslab.cli import main

    run = _copy(finished, tmp_path / "run")
    config = json.loads((run / "config.json").read_text())
    config["model"]["overrides"] = {"widths": [8]}
    (run / "config.json").write_text(json.dumps(config))
    ckpt = run / "checkpoints" / "step-00000030.safetensors"
    code = main(["measure", "--checkpoint", str(run), "--sigma", "0.1", "--num-examples", "8",
                 "--threads", "1"])
    err = capsys.readouterr().err
    assert code == 2 and "unexpected" not in err and "probably a bug" not in err
    # the checkpoint records its run's config.json: another one is named before any load
    assert f"{ckpt} was written beside another config.json than {run / 'config.json'}" in err
    # the resume of `train` (here fit, which it calls): refused, no fall-back, nothing moved
    (run / "summary.json").unlink()
    with pytest.raises(RunDirError, match=r"step-00000030.safetensors was written beside "
                                          r"another config.json"):
        fit(apply_overrides(RunConfig.from_dict(config), []), run, progress=False)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "step-00000015.safetensors", "step-00000030.safetensors"]
    # a checkpoint that records no config (written before they did) still gets the model check
    from senslab.train.checkpoint import decode, encode
    from senslab.train.rundir import CONFIG_DIGEST

    for path in (run / "checkpoints").iterdir():
        state = decode(path.read_bytes(), path)
        state.pop(CONFIG_DIGEST)
        path.write_bytes(encode(state))
    with pytest.raises(RunDirError, match=r"step-00000030.safetensors holds a model that does "
                                          r"not match.*size mismatch for"):
        fit(apply_overrides(RunConfig.from_dict(config), []), run, progress=False)


def test_a_checkpoint_copied_in_from_another_run_is_refused(
        finished: Path, tmp_path: Path) -> None:
    """A checkpoint of a run with another seed, copied into a run's directory, was resumed
    without a word: the run's summary said seed 0 and held numbers of neither seed."""
    cfg = tiny()
    other = tmp_path / "other"
    fit(tiny(1, ["seed=1"]), other, progress=False)
    run = _copy(finished, tmp_path / "run")
    (run / "summary.json").unlink()
    foreign = run / "checkpoints" / "step-00000030.safetensors"
    foreign.write_bytes((other / "checkpoints" / "step-00000015.safetensors").read_bytes())
    with pytest.raises(RunDirError, match=r"step-00000030.safetensors was written beside "
                                          r"another config.json.*move it back"):
        fit(cfg, run, progress=False)
    with pytest.raises(RunDirError, match="was written beside another config.json"):
        RunDir(run).load_latest(resume=True)
    # its own run reads it as before
    (other / "checkpoints" / "step-00000015.safetensors").write_bytes(foreign.read_bytes())
    assert RunDir(other).load_latest(resume=True)[1]["position"]["step"] == 15


def test_a_damaged_verdict_is_kept_as_damaged_not_as_other_settings(tmp_path: Path) -> None:
    """A truncated verdict.json was logged as "written for other settings" and kept as
    verdict.superseded.json; it is unreadable, and now said to be so."""
    from senslab.experiments import run_experiment

    demo = ["train.epochs=1", "data.train_subset=200", "track.num_examples=16",
            "track.eval_examples=100", "seeds=1"]
    exp = tmp_path / "exp"
    run_experiment("demo", exp, overrides=demo, log=lambda _: None)
    damaged = (exp / "verdict.json").read_bytes()[:40]
    (exp / "verdict.json").write_bytes(damaged)
    lines: list[str] = []
    again = run_experiment("demo", exp, overrides=demo, log=lines.append)
    said = [line for line in lines if "verdict.json" in line]
    assert said and "is damaged (not valid JSON" in said[0] and "verdict.damaged.json" in said[0]
    assert not any("other settings" in line for line in lines)
    assert (exp / "verdict.damaged.json").read_bytes() == damaged
    assert not (exp / "verdict.superseded.json").exists()
    assert json.loads((exp / "verdict.json").read_text()) == again


def test_report_says_a_damaged_last_line_of_a_finished_run_is_no_crash(
        finished: Path, tmp_path: Path) -> None:
    """A finished run's last metrics line cannot be torn by a crash (summary.json comes after
    it): the warning names the file and line and says so, instead of "probably killed", and
    the run is refused (records are missing from its log: cut at 30% of its bytes, 41 of 58
    records had gone with only the warning, and an experiment rewrote its verdict from the
    rest)."""
    from senslab.report import RunFormatError, load_run

    run = _copy(finished, tmp_path / "run")
    metrics = run / "metrics.jsonl"
    lines = metrics.read_text().splitlines(keepends=True)
    metrics.write_text("".join(lines[:-1]) + lines[-1][:20])
    with pytest.warns(UserWarning) as caught, pytest.raises(
            RunFormatError, match=r"metrics\.jsonl, the records they come from, ends in a torn "
                                  r"line: it was damaged after the run ended"):
        load_run(run)
    text = " ".join(str(w.message) for w in caught)
    assert f"{metrics}: skipping truncated last line {len(lines)}" in text
    assert "the run finished, so no crash cut it" in text and "probably killed" not in text
    # emptied: refused too (before, read as a run that logged nothing)
    metrics.write_text("")
    with pytest.raises(RunFormatError, match=r"metrics\.jsonl, the records they come from, is "
                                             r"empty"):
        load_run(run)
    metrics.write_text("".join(lines[:-1]) + lines[-1][:20])
    # an unfinished run: still the crash it most likely was
    (run / "summary.json").unlink()
    with pytest.warns(UserWarning, match="probably killed while writing it"):
        load_run(run)


def test_a_finished_run_without_its_metric_log_is_refused(finished: Path, tmp_path: Path) -> None:
    """summary.json's final numbers come from metrics.jsonl, which experiments read after the
    run too: with the log gone, a finished run was judged "froze before 3 logged steps"."""
    run = _copy(finished, tmp_path / "run")
    (run / "metrics.jsonl").unlink()
    match = r"summary\.json gives the run's final numbers, but .*metrics\.jsonl.* is missing"
    with pytest.raises(RunDirError, match=match):
        RunDir(run).read_json("summary.json")
    with pytest.raises(RunDirError, match=match):
        fit(tiny(), run, progress=False)
    with pytest.raises(RunDirError, match=match):
        RunDir(run).final_checkpoint()


def test_fit_refuses_to_resume_past_a_checkpoint_of_a_newer_senslab(
        finished: Path, tmp_path: Path) -> None:
    """The run's last checkpoint written by a newer senslab (it resumed the run there): fit
    took it for a damaged one, fell back to step 15 and retrained over it. Refused, the file
    named with the fix, every file left as it was; a damaged one still falls back."""
    run = _copy(finished, tmp_path / "run")
    (run / "summary.json").unlink()
    newest = run / "checkpoints" / "step-00000030.safetensors"
    rewrite_as_newer(newest)
    files = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    with pytest.raises(RunDirError) as err:
        fit(tiny(), run, progress=False)
    msg = str(err.value)
    assert msg.startswith(f"{newest} was written by a newer senslab (checkpoint format 2")
    assert "Upgrade senslab to use it, or choose another run directory (--out)" in msg
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == files
    assert not (run / "checkpoints" / "unusable").exists()
    # the final model of a finished run: refused with the same fix, not "delete it and re-run"
    (run / "summary.json").write_bytes((finished / "summary.json").read_bytes())
    with pytest.raises(RunDirError) as final:
        RunDir(run).final_checkpoint()
    assert "written by a newer senslab" in str(final.value)
    assert "delete" not in str(final.value)
