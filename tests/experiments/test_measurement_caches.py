"""The two caches of measurements of a finished run's final model, ``sigma_sweep.json``
(:func:`~senslab.experiments.lowsens._comparison.sigma_sweep`) and ``final_measure.json``
(:meth:`~senslab.experiments.lowsens._posthoc.FinalMeasureExperiment.after_run`):

* reused when the checkpoint step, the settings and the run's config.json digests all match,
  measured again when any one differs or is missing; a config.json re-indented by hand keeps its
  caches (its parsed JSON's digest matches), one with a setting changed does not; a cache of an
  older senslab, holding the raw digest only, is still read;
* a damaged file (not valid JSON) is warned about, set aside as ``<name>.damaged`` (``-2``, …:
  never over an earlier one) with its bytes kept, and the measurement taken again;
* valid JSON of the wrong shape (keys missing, a list where an object belongs) is measured again,
  never a KeyError or TypeError, and never served as the result.

The run is the smallest ``fit`` run (an MLP on digits, one epoch of 15 steps, one checkpoint),
trained once per module; each test works on its own copy.
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from senslab.experiments.base import Run
from senslab.experiments.lowsens._comparison import sigma_sweep
from senslab.experiments.lowsens._posthoc import FinalMeasureExperiment
from senslab.train.config import RunConfig, apply_overrides
from senslab.train.loop import fit
from senslab.train.rundir import RunDir

SIGMAS = (0.1, 0.5)
STEP = 15  # the run's only checkpoint


def tiny() -> RunConfig:
    """mlp on digits: one epoch of 15 steps, a checkpoint at its end."""
    return apply_overrides(RunConfig(name="tiny"), [
        "model.name=mlp", "data.name=digits", "track.num_examples=32", "train.epochs=1"])


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    run = tmp_path_factory.mktemp("caches") / "run"
    fit(tiny(), run, progress=False)
    return run


@pytest.fixture(scope="module")
def intact(finished: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The σ sweep measured on a copy without a cache, and the cache it wrote."""
    run = shutil.copytree(finished, tmp_path_factory.mktemp("intact") / "run")
    results = sigma_sweep(run, SIGMAS)
    return {"results": results, "cache": json.loads((run / "sigma_sweep.json").read_text())}


@pytest.fixture
def run(finished: Path, tmp_path: Path) -> Path:
    return shutil.copytree(finished, tmp_path / "run")


class Counting(FinalMeasureExperiment):
    """A real FinalMeasureExperiment whose measurement (the sum of the first weight) counts its
    calls."""

    def __init__(self, settings: dict[str, Any] | None = None) -> None:
        self.calls = 0
        self.settings = {"n": 1} if settings is None else settings

    def final_settings(self, settings: Any) -> dict[str, Any]:
        return self.settings

    def measure_final(self, cfg: RunConfig, model: Any, train: Any, test: Any,
                      settings: Any) -> dict[str, Any]:
        self.calls += 1
        return {"weight": float(next(model.parameters()).detach().sum())}


def _measure(exp: Counting, run: Path) -> dict[str, Any]:
    summary = json.loads((run / "summary.json").read_text())
    return exp.after_run(Run("run", tiny()), run, summary, None, lambda _: None)["final_measure"]


#: a stand-in result of the right shape: returned only when the cache is reused
MARKER = {"0.1": {"estimate": 9.0, "stderr": 0.0}, "0.5": {"estimate": 9.0, "stderr": 0.0}}
#: damaged files: truncated JSON, bytes that are not UTF-8, nesting json cannot parse
DAMAGE = {"truncated": b'{"config_sha256": "ab', "binary": b"\xff\xfe\x00{\x81",
          "nested": b"[" * 100_000}


#: the digests of config.json a cache records
DIGESTS = ("config_sha256", "config_canonical_sha256")
#: a cache of another config.json; one whose digests are missing (None: removed)
OTHER_CONFIG = dict.fromkeys(DIGESTS, "0" * 64)
NO_DIGESTS = dict.fromkeys(DIGESTS)


def _stale(cache: dict[str, Any], change: dict[str, Any]) -> dict[str, Any]:
    """``cache`` with ``change`` applied, entries changed to None removed."""
    return {k: v for k, v in {**cache, **change}.items() if v is not None}


def _aside(run: Path, name: str) -> list[Path]:
    return sorted(run.glob(f"{name}.damaged*"))


# -- sigma_sweep.json -----------------------------------------------------------------------------


def test_sigma_sweep_reuses_a_matching_cache(run: Path, intact: dict[str, Any]) -> None:
    cache = intact["cache"]
    assert cache["step"] == STEP and cache["sigmas"] == list(SIGMAS)
    assert {k: cache[k] for k in DIGESTS} == RunDir(run).config_digests()
    (run / "sigma_sweep.json").write_text(json.dumps({**cache, "results": MARKER}))
    assert sigma_sweep(run, SIGMAS) == MARKER  # served from the file, not measured


def _reindent(run: Path) -> None:
    """Write the run's config.json again with other indentation and its keys reversed: the
    same settings, other bytes."""
    config = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps(dict(reversed(config.items())), indent=4))


def test_a_sigma_sweep_cache_survives_a_reindented_config(run: Path,
                                                         intact: dict[str, Any]) -> None:
    """Keyed on the raw bytes' digest alone, a config.json re-indented by hand (the same
    settings) had the whole σ sweep measured again."""
    (run / "sigma_sweep.json").write_text(json.dumps({**intact["cache"], "results": MARKER}))
    before = RunDir(run).config_digests()
    _reindent(run)
    assert RunDir(run).config_digests()["config_sha256"] != before["config_sha256"]
    assert sigma_sweep(run, SIGMAS) == MARKER


def test_a_sigma_sweep_cache_of_an_older_senslab_is_read(run: Path,
                                                        intact: dict[str, Any]) -> None:
    """Before the canonical digest, a cache held ``config_sha256`` alone."""
    old = {k: v for k, v in intact["cache"].items() if k != "config_canonical_sha256"}
    (run / "sigma_sweep.json").write_text(json.dumps({**old, "results": MARKER}))
    assert sigma_sweep(run, SIGMAS) == MARKER


@pytest.mark.parametrize("change", [
    {"step": STEP - 1}, {"sigmas": [0.1, 0.25]}, OTHER_CONFIG,
    {"step": float(STEP)},  # not the step as written: 15.0, not 15
    NO_DIGESTS,
])
def test_sigma_sweep_measures_again_when_a_key_differs(
        run: Path, intact: dict[str, Any], change: dict[str, Any]) -> None:
    stale = _stale(intact["cache"], change)
    stale["results"] = MARKER
    (run / "sigma_sweep.json").write_text(json.dumps(stale))
    assert sigma_sweep(run, SIGMAS) == intact["results"]
    assert json.loads((run / "sigma_sweep.json").read_text()) == intact["cache"]


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_sigma_sweep_cache_is_set_aside_and_measured_again(
        run: Path, intact: dict[str, Any], damage: str) -> None:
    cache = run / "sigma_sweep.json"
    cache.write_bytes(DAMAGE[damage])
    with pytest.warns(UserWarning, match=r"sigma_sweep\.json is not valid JSON.*moved it to "
                      r".*sigma_sweep\.json\.damaged; measuring the σ sweep again"):
        assert sigma_sweep(run, SIGMAS) == intact["results"]
    assert _aside(run, "sigma_sweep.json") == [run / "sigma_sweep.json.damaged"]
    assert (run / "sigma_sweep.json.damaged").read_bytes() == DAMAGE[damage]
    assert json.loads(cache.read_text()) == intact["cache"]
    # damaged again: the first file set aside stays, the second gets the next free name
    cache.write_bytes(b"{")
    with pytest.warns(UserWarning, match=r"sigma_sweep\.json\.damaged-2"):
        assert sigma_sweep(run, SIGMAS) == intact["results"]
    assert (run / "sigma_sweep.json.damaged").read_bytes() == DAMAGE[damage]
    assert (run / "sigma_sweep.json.damaged-2").read_bytes() == b"{"
    assert json.loads(cache.read_text()) == intact["cache"]


@pytest.mark.parametrize("stored", [
    "list",  # a list where the object belongs
    "no results", "results a list", "a σ missing", "estimate a string", "point a number",
])
def test_a_sigma_sweep_cache_of_the_wrong_shape_is_measured_again(
        run: Path, intact: dict[str, Any], stored: str) -> None:
    cache = intact["cache"]
    data: Any = {
        "list": [cache],
        "no results": {k: v for k, v in cache.items() if k != "results"},
        "results a list": {**cache, "results": [MARKER["0.1"], MARKER["0.5"]]},
        "a σ missing": {**cache, "results": {"0.1": MARKER["0.1"]}},
        "estimate a string": {**cache, "results": {
            **MARKER, "0.5": {"estimate": "9.0", "stderr": 0.0}}},
        "point a number": {**cache, "results": {**MARKER, "0.5": 9.0}},
    }[stored]
    (run / "sigma_sweep.json").write_text(json.dumps(data))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing damaged to warn about: a cache to redo
        warnings.filterwarnings("ignore", "the standard error rests on")  # a toy's few flips
        assert sigma_sweep(run, SIGMAS) == intact["results"]
    assert json.loads((run / "sigma_sweep.json").read_text()) == intact["cache"]
    assert not _aside(run, "sigma_sweep.json")


# -- final_measure.json ---------------------------------------------------------------------------


def test_final_measure_reuses_a_matching_cache(run: Path) -> None:
    exp = Counting()
    first = _measure(exp, run)
    cache = json.loads((run / "final_measure.json").read_text())
    assert cache == {"settings": {"n": 1}, "step": STEP, **RunDir(run).config_digests(),
                     "values": first}
    assert exp.calls == 1
    assert _measure(exp, run) == first and exp.calls == 1  # reused
    (run / "final_measure.json").write_text(json.dumps({**cache, "values": {"weight": 9.0}}))
    assert _measure(exp, run) == {"weight": 9.0} and exp.calls == 1  # served from the file


def test_final_measure_survives_a_reindented_config(run: Path) -> None:
    exp = Counting()
    first = _measure(exp, run)
    _reindent(run)
    assert _measure(exp, run) == first and exp.calls == 1


def test_final_measure_settings_with_a_tuple_match_the_list_stored(run: Path) -> None:
    """JSON stores a tuple as a list; compared as given, the cache never matched again."""
    exp = Counting({"fractions": (0.25, 0.5)})
    first = _measure(exp, run)
    assert json.loads((run / "final_measure.json").read_text())["settings"] == {
        "fractions": [0.25, 0.5]}
    assert _measure(exp, run) == first and exp.calls == 1


@pytest.mark.parametrize("change", [
    {"step": STEP - 1}, {"settings": {"n": 2}}, {"settings": {"n": True}},
    OTHER_CONFIG, NO_DIGESTS,
])
def test_final_measure_measures_again_when_a_key_differs(run: Path, change: dict[str, Any]
                                                         ) -> None:
    exp = Counting()
    first = _measure(exp, run)
    cache = json.loads((run / "final_measure.json").read_text())
    stale = {**_stale(cache, change), "values": {"weight": 9.0}}
    (run / "final_measure.json").write_text(json.dumps(stale))
    assert _measure(exp, run) == first and exp.calls == 2
    assert json.loads((run / "final_measure.json").read_text()) == cache


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_final_measure_cache_is_set_aside_and_measured_again(
        run: Path, damage: str) -> None:
    exp = Counting()
    first = _measure(exp, run)
    cache = json.loads((run / "final_measure.json").read_text())
    (run / "final_measure.json").write_bytes(DAMAGE[damage])
    (run / "final_measure.json.damaged").write_bytes(b"an earlier one")  # the name is taken
    with pytest.warns(UserWarning, match=r"final_measure\.json is not valid JSON.*moved it to "
                      r".*final_measure\.json\.damaged-2; measuring the final model again"):
        assert _measure(exp, run) == first
    assert exp.calls == 2
    assert (run / "final_measure.json.damaged").read_bytes() == b"an earlier one"
    assert (run / "final_measure.json.damaged-2").read_bytes() == DAMAGE[damage]
    assert json.loads((run / "final_measure.json").read_text()) == cache


@pytest.mark.parametrize("stored", ["list", "no values", "values a list"])
def test_a_final_measure_cache_of_the_wrong_shape_is_measured_again(run: Path, stored: str
                                                                    ) -> None:
    exp = Counting()
    first = _measure(exp, run)
    cache = json.loads((run / "final_measure.json").read_text())
    data: Any = {
        "list": [cache],
        "no values": {k: v for k, v in cache.items() if k != "values"},
        "values a list": {**cache, "values": [9.0]},
    }[stored]
    (run / "final_measure.json").write_text(json.dumps(data))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _measure(exp, run) == first
    assert exp.calls == 2
    assert json.loads((run / "final_measure.json").read_text()) == cache
    assert not _aside(run, "final_measure.json")
