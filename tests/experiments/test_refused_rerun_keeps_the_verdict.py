"""A ``senslab run`` that its runs refuse leaves a finished experiment directory finished.

Re-running a finished directory with other settings (``--set steps=7``) set its verdict.json
aside as verdict.superseded.json first, and only then did the runs refuse the settings: the
directory read as unfinished until re-run with its old settings. The runs' own checks now come
before the verdict is set aside, and a failure no check could foresee, before any run trained,
puts the verdict and experiment.json back. Each case goes through :func:`run_experiment`, the
function ``senslab run`` calls, on the tiny Hahn & Rofin runs (``boolean`` trainer) and the
demo's (``fit``)."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
from newer_checkpoint import rewrite_as_newer

from senslab.experiments import run_experiment
from senslab.experiments.base import SUPERSEDED
from senslab.train.rundir import RunDir, RunDirError

EXP = "hr_sharpness_vs_length"
TINY = ["dim=8", "steps=6", "eval_every=3", "batch=32", "eval_size=32", "sharp_draws=2",
        "n_values=[3]", "seeds=1", "functions=['parity']"]
RUN = "parity-n3-s0"


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("refused") / "exp"
    run_experiment(EXP, out, overrides=TINY, log=lambda _: None)
    return out


def _copy(finished: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(finished, tmp_path / "exp"))


def _top(out: Path) -> dict[str, bytes]:
    """The experiment directory's own files (verdicts, experiment.json), by name."""
    return {p.name: p.read_bytes() for p in out.iterdir()
            if p.is_file() and not p.name.startswith(".")}


def test_settings_the_runs_refuse_leave_the_verdict_in_place(finished: Path,
                                                             tmp_path: Path) -> None:
    out = _copy(finished, tmp_path)
    before = _top(out)
    lines: list[str] = []
    with pytest.raises(ValueError, match=rf"{RUN} holds a run with a different configuration "
                                         r"\(differs in steps\)"):
        run_experiment(EXP, out, overrides=[*TINY, "steps=7"], log=lines.append)
    assert _top(out) == before  # verdict.json, experiment.json as they were; nothing set aside
    assert not (out / SUPERSEDED).exists()
    assert lines == []  # refused before anything was said to be moved or trained
    # the directory still reads as finished: the old settings reuse every run
    again = run_experiment(EXP, out, overrides=TINY, log=lambda _: None)
    old = json.loads(before["verdict.json"])
    assert {k: again[k] for k in ("verdict", "evidence", "runtime_s")} == {
        k: old[k] for k in ("verdict", "evidence", "runtime_s")}


def test_a_newer_checkpoint_is_refused_before_the_verdict_is_set_aside(
        finished: Path, tmp_path: Path) -> None:
    """The run, unfinished, holds a checkpoint of a newer senslab; the settings are the same
    ones, written in another order (so the verdict is of "other settings")."""
    out = _copy(finished, tmp_path)
    (out / RUN / "summary.json").unlink()
    newest = RunDir(out / RUN).checkpoints()[-1]
    rewrite_as_newer(newest)
    before, kept = _top(out), newest.read_bytes()
    lines: list[str] = []
    with pytest.raises(RunDirError, match=rf"{newest.name} was written by a newer senslab"):
        run_experiment(EXP, out, overrides=TINY[::-1], log=lines.append)
    assert _top(out) == before and not (out / SUPERSEDED).exists()
    assert lines == []  # refused before the verdict was moved (not moved and put back)
    assert newest.read_bytes() == kept


def test_a_failure_before_any_run_trained_puts_the_verdict_back(finished: Path,
                                                                tmp_path: Path) -> None:
    """A refusal the runs make only once they load their checkpoints (here: a damaged line in
    the middle of an unfinished run's metric log), under settings whose verdict is set aside:
    no run trained, so the verdict and experiment.json are put back and the log says so. Once a
    run has trained before the refusal, the directory changed: the verdict stays aside."""
    out = _copy(finished, tmp_path)
    run = out / RUN
    (run / "summary.json").unlink()
    log = run / "metrics.jsonl"
    first, *rest = log.read_text().splitlines(keepends=True)
    log.write_text(first[:10] + "\n" + "".join(rest))
    before = _top(out)
    lines: list[str] = []
    with pytest.raises(RunDirError, match=r"metrics.jsonl:1 is not valid JSON"):
        run_experiment(EXP, out, overrides=TINY[::-1], log=lines.append)
    assert _top(out) == before and not (out / SUPERSEDED).exists()
    assert lines[0].endswith(f"moved to {SUPERSEDED}")
    assert lines[-1] == (f"{out}: no run was trained, so verdict.json (set aside as {SUPERSEDED}) "
                         "and experiment.json are put back as they were")
    # other settings that add a run before it: that run trains, then the old one is refused
    over = [o for o in TINY if not o.startswith("n_values")] + ["n_values=[4, 3]"]
    with pytest.raises(RunDirError, match=r"metrics.jsonl:1 is not valid JSON"):
        run_experiment(EXP, out, overrides=over, log=lambda _: None)
    assert (out / "parity-n4-s0" / "summary.json").exists()
    assert not (out / "verdict.json").exists()
    assert (out / SUPERSEDED).read_bytes() == before["verdict.json"]


def test_fit_runs_refusals_come_before_the_verdict_is_set_aside(tmp_path: Path) -> None:
    """The demo's ``fit`` runs: a reporter whose package is missing (refused by fit before it
    wrote anything, but only once the first run started) and a finished run's other epochs."""
    demo = ["train.epochs=1", "data.train_subset=200", "track.num_examples=16",
            "track.eval_examples=100", "seeds=1"]
    out = tmp_path / "exp"
    run_experiment("demo", out, overrides=demo, log=lambda _: None)
    before = _top(out)
    lines: list[str] = []
    if importlib.util.find_spec("wandb") is None:
        with pytest.raises(ImportError, match="the wandb package is not installed"):
            run_experiment("demo", out, overrides=[*demo, 'track.report_to=["wandb"]'],
                           log=lines.append)
        assert _top(out) == before and lines == []
    with pytest.raises(ValueError, match=r"holds a run with a different configuration "
                                         r"\(differs in train.epochs\)"):
        run_experiment("demo", out, overrides=[*demo[1:], "train.epochs=2"], log=lines.append)
    assert _top(out) == before and not (out / SUPERSEDED).exists()
    assert lines == []  # refused before the verdict was moved (not moved and put back)
