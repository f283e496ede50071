"""Run records (summary.json, config.json, verdict.json, …) are strict JSON: a number that is
not finite is written as null, as metrics.jsonl writes it, and the verdicts read that null as
the NaN a fresh run hands them."""
from __future__ import annotations

import copy
import json
import math
import warnings

import numpy as np
import pytest
import torch

from senslab.experiments.hahn_rofin.norm_vs_blowup import norm_blowup_verdict
from senslab.experiments.hahn_rofin.random_functions import completion_verdict
from senslab.train.rundir import RunDir


def _strict(text: str):
    def refuse(token: str):
        raise ValueError(f"not JSON: {token}")
    return json.loads(text, parse_constant=refuse)


def test_summary_with_nan_is_strict_json(tmp_path):
    rd = RunDir(tmp_path / "run")
    summary = {"final": {"step": 3, "train/acc": 0.5, "sens/train_se": math.nan,
                         "train/loss": math.inf, "a": np.float32("nan"),
                         "b": torch.tensor(float("-inf")), "c": np.float64(0.25)},
               "per_sample": [0.1, math.nan]}
    with warnings.catch_warnings():  # null is "not known" by design: no warning
        warnings.simplefilter("error")
        rd.write_json("summary.json", summary)
    data = _strict((rd.path / "summary.json").read_text())
    assert data["final"] == {"step": 3, "train/acc": 0.5, "sens/train_se": None,
                             "train/loss": None, "a": None, "b": None, "c": 0.25}
    assert data["per_sample"] == [0.1, None]


def test_summary_nulls_agree_with_the_metric_log(tmp_path):
    rd = RunDir(tmp_path / "run")
    rd.path.mkdir(parents=True)
    record = {"step": 1, "train/acc": 0.5, "sens/train_se": math.nan}
    with pytest.warns(UserWarning, match="metrics.jsonl"):
        rd.log(record)
    with warnings.catch_warnings():  # log warned of the metric already
        warnings.simplefilter("error")
        rd.write_json("summary.json", {"final": record})
    assert rd.read_json("summary.json")["final"]["sens/train_se"] is None


def test_truncate_metrics_keeps_an_old_bare_nan_strict(tmp_path):
    rd = RunDir(tmp_path / "run")
    rd.path.mkdir(parents=True)
    rd.metrics_path.write_text('{"step": 1, "x": NaN}\n{"step": 2, "x": 1.0}\n')
    rd.truncate_metrics(1)
    assert [_strict(line) for line in rd.metrics_path.read_text().splitlines()] == [
        {"step": 1, "x": None}]


def _as_read_back(summaries):
    """``summaries`` as a reused run reads them: written by RunDir.write_json and read back."""
    return [json.loads(json.dumps(s, allow_nan=True).replace("NaN", "null"))
            for s in summaries]


def test_norm_blowup_verdict_reads_null_as_nan():
    fresh = [{"name": f"r{i}", "converged": True,
              "final": {"param_norm": 2.0 + i, "blowup/log10": math.nan if i == 0 else 0.5 * i,
                        "bool_sens": 0.1 * i}} for i in range(3)]
    before = norm_blowup_verdict(copy.deepcopy(fresh))
    after = norm_blowup_verdict(_as_read_back(fresh))  # was TypeError: float(None)
    assert after["verdict"] == before["verdict"] == "not comparable"
    assert after["evidence"]["not_finite"] == before["evidence"]["not_finite"]
    assert "log10 blow-up nan" in after["evidence"]["not_finite"][0]


def test_completion_verdict_reads_null_as_nan():
    fresh = []
    for seed in (0, 1):
        for kind in ("learned", "random"):
            final = {"step": 10, "train/acc": 1.0, "bool_sens": 0.2 + 0.1 * (kind == "random"),
                     "sharpness/loss": math.nan if seed == 0 and kind == "learned" else 0.3,
                     "sharpness/loss_se": math.nan if seed == 0 else 0.01}
            fresh.append({"name": f"{kind}-k4-s{seed}", "train_size": 4, "seed": seed,
                          "converged": True, "final": final,
                          **({"random_completion_sens": 0.4} if kind == "learned" else {})})
    before = completion_verdict(copy.deepcopy(fresh))
    after = completion_verdict(_as_read_back(fresh))  # was TypeError: None < float
    assert json.dumps(after, sort_keys=True, default=str) == json.dumps(
        before, sort_keys=True, default=str)


def test_sigma_sweep_cache_with_a_null_stays_valid():
    from senslab.experiments.lowsens._comparison import _is_sweep

    # a σ whose standard error was not finite is cached as null: still a sweep, not re-measured
    assert _is_sweep({"0.5": {"estimate": 0.1, "stderr": None}}, (0.5,))
    assert not _is_sweep({"0.5": {"estimate": "x", "stderr": None}}, (0.5,))
