"""Audit 86 (hrib): the Hahn & Rofin and implicit-bias experiments."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from senslab.experiments.implicit_bias.text import loss_curve, steps_to
from senslab.train.rundir import RunDirError


def test_ib_text_loss_curve_skips_a_blank_line_of_the_metric_log(tmp_path: Path) -> None:
    # a blank line (an edit) stopped the verdict with a bare JSONDecodeError naming no file
    (tmp_path / "metrics.jsonl").write_text(
        '{"step": 0, "train/loss": 0.69}\n\n{"step": 45, "train/loss": null}\n'
        '{"step": 90, "train/loss": 0.3}\n')
    curve = loss_curve(tmp_path)
    assert curve == [[0, 0.69], [45, None], [90, 0.3]]
    assert steps_to(curve, 0.5 * math.log(2)) == 90.0


def test_ib_text_loss_curve_refuses_a_log_with_a_step_twice(tmp_path: Path) -> None:
    # a repeated step entered the curve twice, and the first step below the threshold was read
    # from whichever record came first, without a word
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0, "train/loss": 0.69}\n{"step": 45, "train/loss": 0.3}\n'
                    '{"step": 45, "train/loss": 0.6}\n')
    with pytest.raises(RunDirError, match=r"metrics\.jsonl: line 3 repeats step 45"):
        loss_curve(tmp_path)
