"""``senslab measure``'s table where ``precision="auto"`` chose checking but its timed
calibration sent the copies back to float32: the re-checked column says "-" (not the
calibration's 100%, which read as a contradiction beside the note's predicted share)."""

import argparse

import pytest
import torch

from senslab import cli
from senslab.measure._precision import auto_precision
from senslab.tokens import Sequence


class _Steps(torch.nn.Module):
    """Outputs that are steps of a linear map: bf16's rounding moves a copy across a step or
    not at all, so the calibrated band re-checks every copy and checking cannot pay."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.lin(x.mean(1)) > 0).float() * torch.tensor([1.0, 2.0, 4.0])


class _Batches:
    def __init__(self, x: torch.Tensor, size: int) -> None:
        self.x, self.count, self.size = x, len(x), size

    def __call__(self, lo: int, hi: int) -> torch.Tensor:
        return self.x[lo:hi]


def test_auto_back_to_float32_shows_no_recheck_share(capsys: pytest.CaptureFixture) -> None:
    low = auto_precision(torch.device("cpu"))
    if low is None or low[0] != "bf16":
        pytest.skip("this CPU's timed bf16 product does not beat float32: 'auto' picks no "
                    "checked bf16 here")
    torch.manual_seed(0)
    model = _Steps()
    x = torch.randn(512, 6, 8, generator=torch.Generator().manual_seed(1))
    args = argparse.Namespace(autocast=None, compile=False, precision="auto", sigma=[0.5],
                              repeats=2, seed=0)
    cli._table(model, Sequence(), _Batches(x, 256), args, "cpu")
    out, err = capsys.readouterr()
    row = out.splitlines()[-1].split()
    assert row[0] == "0.5" and row[-1] == "-", out
    # either reason "auto" goes back to float32 for (which one depends on the noise drawn)
    assert ("the copies ran in float32 — \"auto\"'s timed calibration found no gain" in err
            or "the copies ran in float32 — bf16 changed no output's margin" in err), err
    assert "all decided in float32" in err


def test_report_again_keeps_the_experiments_own_plots(tmp_path, capsys) -> None:
    """`senslab report runs/EXP` rewrote the report.html `senslab run` wrote without the
    experiment's own plots: hr_norm_vs_blowup's two scatters were gone (4 figures became 2)."""
    from senslab.experiments import run_experiment

    out = tmp_path / "sweep"
    run_experiment("hr_norm_vs_blowup", out, log=lambda _: None,
                   overrides=["dim=8", "steps=6", "eval_every=3", "batch=32", "eval_size=32",
                              "sharp_draws=2", "runs=2", "n_values=[3]"])
    assert cli.main(["report", str(out)]) == 0
    page = (out / "report.html").read_text()
    assert page.count("<figure>") == 4, page.count("<figure>")
    assert "blowup against param_norm, one point per run" in page
    assert "param_norm against bool_sens, one point per run" in page
    # a plain directory of runs (no experiment) keeps the defaults: no scatter
    assert cli.main(["report", str(out / next(p.name for p in out.iterdir() if p.is_dir())),
                     "--out", str(tmp_path / "one")]) == 0
    assert (tmp_path / "one" / "report.html").read_text().count("<figure>") < 4
