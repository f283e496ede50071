"""Every registered trainer: the same run directory, reuse of a finished run, refusal of another
configuration, and a resume after SIGKILL that is bit-identical to a run never interrupted."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from senslab.train.rundir import RunDir, checkpoint_step
from senslab.train.trainers import get_trainer, list_trainers, train_run

TRAINERS = list_trainers()

# the child trains the trainer's example at the parent's thread count (float reductions split
# across another number of threads round differently)
_CHILD = """
import sys
import torch
from senslab.train.trainers import get_trainer, train_run
torch.set_num_threads(int(sys.argv[3]))
name = sys.argv[1]
train_run(name, get_trainer(name).example(), sys.argv[2], progress=False, log=lambda _: None)
"""


def _quiet(_: str) -> None:
    pass


def _newest_step(path: Path) -> int:
    found = RunDir(path).checkpoints()
    return checkpoint_step(found[-1]) if found else -1


def _untimed(node: object) -> object:
    """``node`` without its wall-clock entries (time, seconds, elapsed), at any depth."""
    if isinstance(node, dict):
        return {k: _untimed(v) for k, v in node.items()
                if k not in ("time", "seconds", "elapsed")}
    if isinstance(node, list):
        return [_untimed(v) for v in node]
    return node


def _records(path: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "time"} for r in RunDir(path).metrics()]


def _final_tensors(path: Path) -> dict:
    state = RunDir.load_checkpoint(RunDir(path).checkpoints()[-1])
    flat: dict = {}

    def walk(node: object, prefix: str) -> None:
        if isinstance(node, torch.Tensor):
            flat[prefix] = node
        elif isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{prefix}/{k}")
        elif isinstance(node, (list, tuple)):
            for i, v in enumerate(node):
                walk(v, f"{prefix}/{i}")
        elif prefix.rsplit("/", 1)[-1] not in ("elapsed", "time"):  # wall-clock seconds
            flat[prefix] = node

    walk(state, "")
    return flat


def test_the_registry_lists_the_six_kinds_of_training() -> None:
    assert {"fit", "boolean", "attention", "sparse_frequent", "grokking",
            "sparse_parity"} <= set(TRAINERS)
    with pytest.raises(KeyError, match="unknown trainer 'fitt'. Did you mean 'fit'"):
        get_trainer("fitt")


@pytest.mark.parametrize("name", TRAINERS)
def test_example_config_is_a_dataclass_of_the_trainers_type(name: str) -> None:
    t = get_trainer(name)
    assert t.example is not None, f"trainer {name} registers no example configuration"
    cfg = t.example()
    assert dataclasses.is_dataclass(cfg) and isinstance(cfg, t.config_type)
    with pytest.raises(TypeError, match=f"trainer '{name}' takes a {t.config_type.__name__}"):
        train_run(name, object(), "unused")


@pytest.mark.slow
@pytest.mark.parametrize("name", TRAINERS)
def test_sigkill_then_resume_is_bit_identical(tmp_path: Path, name: str) -> None:
    cfg = get_trainer(name).example()
    ref = tmp_path / "uninterrupted"
    summary = train_run(name, cfg, ref, progress=False, log=_quiet)
    assert RunDir(ref).read_json("summary.json") == summary
    checkpoints = [checkpoint_step(p) for p in RunDir(ref).checkpoints()]
    assert len(checkpoints) >= 1 and max(checkpoints) > 0, f"{name} wrote no checkpoint"
    # the same configuration again: reused, not retrained
    mtime = (ref / "metrics.jsonl").stat().st_mtime_ns
    assert train_run(name, cfg, ref, progress=False, log=_quiet) == summary
    assert (ref / "metrics.jsonl").stat().st_mtime_ns == mtime

    run = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, name, str(run),
                             str(torch.get_num_threads())])
    # kill at the first checkpoint after step 0: the resume redoes most of the run
    deadline = time.time() + 120
    while time.time() < deadline and _newest_step(run) <= 0 and proc.poll() is None:
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, f"{name}'s example finished before the kill"
    assert not (run / "summary.json").exists()
    resumed = train_run(name, cfg, run, progress=False, log=_quiet)
    assert _records(run) == _records(ref)
    a, b = _final_tensors(ref), _final_tensors(run)
    assert a.keys() == b.keys()
    for k in a:
        same = torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k]
        assert same, f"{name}: {k} differs after the resume"
    assert _untimed(resumed) == _untimed(summary)


@pytest.mark.heavy
@pytest.mark.parametrize("name", TRAINERS)
def test_the_trainers_label_rule_gives_its_summarys_label(tmp_path: Path, name: str) -> None:
    """A report shows an unfinished run under the label its summary will have; where the
    summary's label is neither config.json's ``label`` nor the run's name, the trainer's
    ``label`` rule, read from config.json alone, must give it (the rule lives beside the
    trainer's ``run.finish``, and this keeps the two in step)."""
    from senslab.report.runs import default_label

    cfg = get_trainer(name).example()
    if "label" in {f.name for f in dataclasses.fields(cfg)}:
        cfg = dataclasses.replace(cfg, label="")
    summary = train_run(name, cfg, tmp_path, progress=False, log=_quiet)
    config = RunDir(tmp_path).read_json("config.json")
    given = summary.get("label") or ""
    if config.get("label") or given in ("", config.get("name")):
        assert default_label(config) in (None, given)
        return
    assert get_trainer(name).label is not None, f"{name} labels its summary {given!r} unsaid"
    assert default_label(config) == given


@pytest.mark.parametrize("name", TRAINERS)
def test_a_run_of_another_configuration_is_refused(tmp_path: Path, name: str) -> None:
    if name == "fit":
        pytest.skip("fit's refusal is tested in tests/train/test_engine.py")
    t = get_trainer(name)
    cfg = t.example()
    RunDir(tmp_path).acquire()
    RunDir(tmp_path).write_json("config.json", {"something": "else"})
    RunDir(tmp_path).write_json("summary.json", {"final": {}})
    RunDir(tmp_path).release()
    with pytest.raises(ValueError, match="holds a run with a different configuration"):
        train_run(name, cfg, tmp_path, progress=False, log=_quiet)


@pytest.mark.parametrize("name", [n for n in TRAINERS if n not in ("fit", "pretrained")])
def test_a_field_added_later_at_its_default_keeps_the_run(tmp_path: Path, name: str) -> None:
    """A config.json written before a field existed reads that field as its default: the run is
    reused when the new configuration leaves the field there, refused when it does not."""
    from senslab.train.config import defaults_of, json_form

    cfg = get_trainer(name).example()
    full = json_form(dataclasses.asdict(cfg))
    defaults = defaults_of(type(cfg))
    key = next(k for k in reversed(list(full)) if k in defaults and full[k] == defaults[k]
               and not isinstance(full[k], dict))
    old = {k: v for k, v in full.items() if k != key}
    run = RunDir(tmp_path)
    run.acquire()
    run.write_json("config.json", old)
    run.write_json("summary.json", {"final": {"marker": 1}})
    run.log({"step": 1, "marker": 1})  # the record the summary's final numbers come from
    run.release()
    assert train_run(name, cfg, tmp_path, progress=False, log=_quiet) == {"final": {"marker": 1}}
    # the field at a value other than its default: another run
    changed = {**full, key: "another value"}
    run.acquire()
    run.write_json("config.json", changed)
    run.release()
    with pytest.raises(ValueError, match="holds a run with a different configuration"):
        train_run(name, cfg, tmp_path, progress=False, log=_quiet)
    run.acquire()
    run.write_json("config.json", old)
    run.release()
    other = next(k for k, v in full.items() if k != key and type(v) is int)
    with pytest.raises(ValueError, match="holds a run with a different configuration"):
        train_run(name, dataclasses.replace(cfg, **{other: full[other] + 1}), tmp_path,
                  progress=False, log=_quiet)
