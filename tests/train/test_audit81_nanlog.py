"""Audit 81 (nanlog): RunDir.log writes a NaN or inf as null (strict JSON), once-per-metric
warning; every reader of a loop's logged values reads that null back as the NaN it was."""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from senslab.experiments import get_experiment
from senslab.experiments.base import Run
from senslab.experiments.hahn_rofin.parity_dynamics import DynamicsSettings, peaks
from senslab.experiments.implicit_bias.fixed_v import (
    FixedVSettings,
    first_step_reaching,
    norm_growth,
)
from senslab.experiments.lowsens.grokking import phases_before_jump
from senslab.experiments.lowsens.sparse_parity import plateau_curve
from senslab.train.looprun import LoopRun
from senslab.train.loops._common import EpochLoop, run_epochs
from senslab.train.loops.sparse_parity import parity_progress
from senslab.train.rundir import RunDir


def _quiet(_: str) -> None:
    pass


def _strict(line: str) -> Any:
    def refuse(name: str) -> Any:
        raise ValueError(f"not JSON: {name}")
    return json.loads(line, parse_constant=refuse)


def _logged(path: Path, records: list[dict[str, Any]]) -> None:
    """``records`` logged by RunDir.log (its warnings of a NaN silenced)."""
    rd = RunDir(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for r in records:
            rd.log(r)


# --------------------------------------------------------------------------- the writer
def test_log_writes_non_finite_as_null_and_warns_once_per_metric(tmp_path: Path) -> None:
    with LoopRun(tmp_path / "r", {"seed": 0}) as run, \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(1, 6):  # a diverging run: NaN at every evaluation
            run.log({"step": step, "train/loss": math.nan, "ok": 0.5,
                     "np": np.float64(np.inf), "t": torch.tensor(-math.inf),
                     "ci": [0.1, math.nan], "late": math.nan if step >= 4 else 1.0})
    said = [str(w.message) for w in caught]
    # once for the metrics of the first record, once for "late" when it first went NaN
    assert len(said) == 2, said
    assert "train/loss=nan" in said[0] and "ci[1]=nan" in said[0] and "step 1" in said[0]
    assert "late=nan" in said[1] and "train/loss" not in said[1] and "step 4" in said[1]
    lines = (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()
    rows = [_strict(line) for line in lines]  # no bare NaN / Infinity
    assert rows[-1]["train/loss"] is None and rows[-1]["np"] is None and rows[-1]["t"] is None
    assert rows[-1]["ci"] == [0.1, None] and rows[-1]["ok"] == 0.5 and rows[0]["late"] == 1.0


# --------------------------------------------------------------------------- hahn_rofin
def _dynamics_records() -> list[dict[str, Any]]:
    return [{"step": s, "epoch": float(s), "train/loss": 0.5 / s,
             "test/loss": math.nan if s == 25 else 0.5 / s,
             "sharpness/loss": math.nan if s == 25 else [0.1, 0.4, 0.3, 0.2][s // 25 - 1],
             "blowup/log10": 0.1 * s} for s in (25, 50, 75, 100)]


@pytest.mark.parametrize("t0_on", ["train", "eval"])
def test_parity_dynamics_reads_a_logged_nan_as_nan(tmp_path: Path, t0_on: str) -> None:
    records = _dynamics_records()
    _logged(tmp_path, records)
    settings = DynamicsSettings(eval_every=25, t0_on=t0_on)
    exp = get_experiment("hr_parity_dynamics")
    # was: TypeError (None < 0.01 for t0 from the evaluations; math.isnan(None) in peaks)
    out = exp.after_run(None, tmp_path, {"first_below_001": 50}, settings, _quiet)
    t0 = 50 if t0_on == "train" else next(r["step"] for r in records if r["test/loss"] < 0.01)
    want = peaks(records, t0, settings.window, settings.eval_every)
    assert json.dumps(out["peaks"]) == json.dumps(want)  # NaN equal to NaN
    assert out["peaks"]["sharpness"]["nan_steps"] == [25]
    assert out["peaks"]["sharpness"]["peak_step"] == 50 and math.isnan(
        out["peaks"]["sharpness"]["start"])


# --------------------------------------------------------------------------- implicit_bias
def test_fixed_v_reads_a_logged_nan_as_nan(tmp_path: Path) -> None:
    records = [{"step": s, "attn/W_norm": math.nan if s == 400 else 1.0 + 0.01 * s,
                "attn/alignment": math.nan if s == 200 else 0.5,
                "attn/sparsity": 1.0 if s >= 300 else 0.1} for s in (100, 200, 300, 400)]
    _logged(tmp_path, records)
    exp = get_experiment("ib_fixed_v")
    # was: TypeError (math.isfinite(None); None >= 0.9)
    out = exp.after_run(None, tmp_path, {"name": "x"}, FixedVSettings(fit_from=100), _quiet)
    assert out["fit"] == norm_growth(records, 100) == {"fit_points": 3.0, "diverged_at": 400.0}
    assert out["reach"]["alignment"] == first_step_reaching(records, "attn/alignment", 0.9)
    assert out["reach"] == {"alignment": math.inf, "sparsity": 300.0}


# --------------------------------------------------------------------------- lowsens
def test_grokking_claim_phases_read_a_logged_nan_as_nan(tmp_path: Path) -> None:
    from senslab.train.loops.grokking import GrokkingRun

    sens = [0.1, 0.1, 0.1, 0.08, math.nan, 0.06, 0.05, 0.03, 0.02, 0.01]
    acc = [0.5, math.nan, *[1.0] * 8]  # train acc NaN: read as not memorised, as NaN was
    history = [{"step": e, "epoch": 10 * e, "train/acc": a,
                "test/acc": 0.1 if e < 8 else 0.97, "sens/train": s}
               for e, (s, a) in enumerate(zip(sens, acc, strict=True))]
    _logged(tmp_path, history)
    (tmp_path / "summary.json").write_text(json.dumps({"name": "g"}))
    out = get_experiment("grokking").after_run(Run("g", GrokkingRun(name="g"), trainer="grokking"),
                                               tmp_path, {"name": "g"}, None, _quiet)
    want = phases_before_jump(history)
    assert json.dumps(out["claim_phases"], sort_keys=True) == json.dumps(want, sort_keys=True)
    assert out["claim_phases"]["memorisation_epoch"] == 20
    assert out["claim_phases"]["sens_not_finite_epochs"] == [40]


def test_sparse_parity_plateau_reads_a_logged_nan_as_nan(tmp_path: Path) -> None:
    from senslab.train.loops.sparse_parity import SparseParityRun

    history = [{"step": e, "epoch": e, "test/acc": math.nan if e == 1 else 0.5,
                "bool_sens": math.nan if e == 2 else 0.1 * e, "bool_sens_se": 0.01}
               for e in range(4)]
    _logged(tmp_path, history)
    (tmp_path / "summary.json").write_text(json.dumps({"name": "p"}))
    run = Run("p", SparseParityRun(name="p"), trainer="sparse_parity")
    out = get_experiment("sparse_parity").after_run(run, tmp_path, {"name": "p"}, None, _quiet)
    want = plateau_curve(history, run.config.bool_samples)
    assert json.dumps(out["plateau"]) == json.dumps(want)
    assert len(out["plateau"]["sens"]) == 4 and math.isnan(out["plateau"]["sens"][2])


# --------------------------------------------------------------------------- a resumed loop
@dataclass
class _Cfg:
    name: str
    epochs: int = 6
    eval_every: int = 1


def _epochs(path: Path, crash_at: int | None = None) -> dict[str, Any]:
    """A tiny epoch loop (sparse parity's summary) whose sensitivity is NaN after its second
    step; with ``crash_at``, the process dies in that epoch (after the checkpoint of the one
    before) and the run is started again, resuming from that checkpoint."""
    def build(crash: int | None) -> EpochLoop:
        torch.manual_seed(0)
        model = torch.nn.Linear(2, 1)
        model.register_buffer("steps", torch.zeros(()))  # in the checkpoint
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        calls = [0]

        def train_epoch() -> int:
            calls[0] += 1
            if calls[0] == crash:
                raise RuntimeError("killed")
            opt.zero_grad()
            model(torch.ones(1, 2)).sum().backward()
            opt.step()
            model.steps += 1
            return 1

        def evaluate() -> dict[str, Any]:
            w = float(model.weight.sum())
            return {"test/acc": 0.5, "bool_sens": math.nan if int(model.steps) == 2 else w,
                    "bool_sens_se": 0.01}

        return EpochLoop(model, opt, train_epoch, evaluate,
                         lambda h: {"progress": parity_progress(h)})

    if crash_at is not None:
        with pytest.raises(RuntimeError, match="killed"):
            run_epochs(_Cfg(path.name), path, "toy", lambda: build(crash_at))
    return run_epochs(_Cfg(path.name), path, "toy", lambda: build(None))


def test_a_resumed_epoch_loop_reads_its_logged_nan_as_nan(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        whole = _epochs(tmp_path / "whole")
        # was: TypeError in the summary (max() over a None read back from metrics.jsonl)
        cut = _epochs(tmp_path / "whole-cut", crash_at=4)
    assert [r["step"] for r in RunDir(tmp_path / "whole-cut").metrics()] == list(range(7))
    drop = ("seconds", "name")
    assert (json.dumps({k: v for k, v in cut.items() if k not in drop}, sort_keys=True)
            == json.dumps({k: v for k, v in whole.items() if k not in drop}, sort_keys=True))
    assert whole["progress"]["plateau_evals"] == 7
    assert whole["progress"]["sens_plateau_max_epoch"] == 0  # NaN at epoch 2 is not the peak
