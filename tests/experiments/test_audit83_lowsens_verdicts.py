"""Audit 83: the lowsens verdicts on summaries as a resumed experiment gives them.

A number that is not finite is written to summary.json and to final_measure.json as null
(:meth:`~senslab.train.rundir.RunDir.write_json`); a reused run's summary, and a reused final
measurement, come back with None where the first pass had NaN. The verdicts took NaN (named, or
judged as not finite) and failed on None with a raw TypeError, so resuming a finished experiment
lost its verdict.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from senslab.experiments.base import Run
from senslab.experiments.lowsens._language_verdict import language_verdict
from senslab.experiments.lowsens._posthoc import FinalMeasureExperiment
from senslab.experiments.lowsens.cifar import Cifar10Sigma
from senslab.experiments.lowsens.synthetic import sparse_frequent_verdict
from senslab.train.config import RunConfig, apply_overrides
from senslab.train.loop import fit
from senslab.verdicts import NOT_COMPARABLE, SUPPORTED

sys.path.insert(0, str(Path(__file__).parent))
from test_lowsens_language import paper_like  # noqa: E402
from test_lowsens_small import _cases  # noqa: E402


def _as_read_back(summaries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``summaries`` as a reused run's summary.json gives them: every NaN as null (None)."""
    text = json.dumps(summaries)
    return json.loads(text.replace("NaN", "null"))


# -- synthetic ------------------------------------------------------------------------------------


def test_synthetic_names_a_null_solution_sensitivity_instead_of_failing() -> None:
    runs = _cases([0.02, 0.05, 0.01], [0.99, 0.97, 0.98])
    runs[0]["final"]["solution/sparse"] = math.nan
    runs[4]["final"]["align/frequent"] = math.nan
    fresh = sparse_frequent_verdict(runs)
    again = sparse_frequent_verdict(_as_read_back(runs))  # TypeError: None < float before
    for v in (fresh, again):
        assert v["verdict"] == NOT_COMPARABLE
        assert "case1-s0: solution/sparse not a finite number" in v["reason"]
        assert "case2-s1: align/frequent not a finite number" in v["reason"]
        # no feature read off a comparison with NaN ("frequent" before, NaN < x being False)
        assert v["evidence"]["case1-s0"]["low_sensitivity_feature"] is None
        assert v["evidence"]["case2-s1"]["relies_on"] is None
    assert again["reason"] == fresh["reason"]


# -- language -------------------------------------------------------------------------------------


def test_language_verdict_of_a_reused_run_with_a_null_standard_error() -> None:
    # one seed's recency s.e. NaN (one end example): fine on the first pass, and the same verdict
    # on summaries read back from disk (float(None) in recency() failed the whole verdict)
    runs = paper_like()
    for s in runs:
        if s["label"] == "lstm" and s["seed"] == 0:
            s["final"]["recency/diff_se"] = math.nan
            s["final"]["sens_first/train_se"] = math.nan
    fresh = language_verdict(runs)
    again = language_verdict(_as_read_back(runs))
    assert fresh["verdict"] == again["verdict"] == SUPPORTED
    f, a = fresh["evidence"]["claims"], again["evidence"]["claims"]
    assert a["lstm_recency"]["verdict"] == f["lstm_recency"]["verdict"]
    assert a["lstm_recency"]["detail"] == f["lstm_recency"]["detail"]
    assert again["reason"] == fresh["reason"]


def test_language_null_train_accuracy_is_not_comparable_not_a_crash() -> None:
    runs = paper_like()
    runs[1]["final"]["train/acc"] = None  # a NaN train accuracy, read back
    v = language_verdict(runs)
    assert v["verdict"] == NOT_COMPARABLE and "train accuracies differ by nan" in v["reason"]


# -- final_measure.json ---------------------------------------------------------------------------


def _tiny() -> RunConfig:
    return apply_overrides(RunConfig(name="tiny"), [
        "model.name=mlp", "data.name=digits", "track.num_examples=32", "train.epochs=1"])


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    run = tmp_path_factory.mktemp("audit83") / "run"
    fit(_tiny(), run, progress=False)
    return run


class NotFinite(FinalMeasureExperiment):
    """A final measurement with a NaN value and a NaN in a list (an undefined s.e.)."""

    def measure_final(self, cfg: RunConfig, model: Any, train: Any, test: Any,
                      settings: Any) -> dict[str, Any]:
        return {"sweep": [{"sigma": 0.5, "sensitivity": 0.2, "stderr": math.nan}],
                "per_sample": [0.1, math.nan], "estimate": math.nan, "n": 3, "name": "x"}


def test_a_reused_final_measurement_gives_nan_where_the_first_gave_nan(finished: Path,
                                                                       tmp_path: Path) -> None:
    run = shutil.copytree(finished, tmp_path / "run")
    exp = NotFinite()

    def measure() -> dict[str, Any]:
        summary = json.loads((run / "summary.json").read_text())
        return exp.after_run(Run("run", _tiny()), run, summary, None, lambda _: None)[
            "final_measure"]

    first, again = measure(), measure()  # the second from final_measure.json (nulls there)
    assert json.loads((run / "final_measure.json").read_text())["values"]["estimate"] is None
    for m in (first, again):
        assert math.isnan(m["estimate"]) and math.isnan(m["sweep"][0]["stderr"])
        assert m["per_sample"][0] == 0.1 and math.isnan(m["per_sample"][1])
        assert m["n"] == 3 and m["name"] == "x" and m["sweep"][0]["sensitivity"] == 0.2


def _sigma_run(label: str, seed: int, sens: list[float], se: float = 0.01) -> dict[str, Any]:
    return {"label": label, "name": f"{label}-s{seed}", "seed": seed, "stopped": "target_train_acc",
            "final": {"train/acc": 0.9},
            "final_measure": {"sweep": [{"sigma": s, "sensitivity": v, "stderr": se}
                                        for s, v in zip((0.1, 1.0), sens, strict=True)]}}


def test_cifar10_sigma_verdict_takes_nan_stderrs() -> None:
    # what a reused final_measure.json now gives (NaN, not None): the verdict goes ahead, the
    # gap at σ = 1 clearly positive on every seed
    runs = []
    for k in range(3):
        runs += [_sigma_run("vit_small", k, [0.10, 0.20 + 0.01 * k], se=math.nan),
                 _sigma_run("resnet18", k, [0.12, 0.50 + 0.02 * k])]
    v = Cifar10Sigma().verdict(runs)
    lowest = v["effects"]["lowest"]
    assert lowest["effect"] == pytest.approx((0.30 + 0.31 + 0.32) / 3)
    assert v["verdict"] == SUPPORTED
    assert "vit_small/seed 0 at σ=0.1" in v["reason"]  # the NaN s.e. named
