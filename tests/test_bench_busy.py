"""benchmarks/busy_neighbour.py: the neighbour that keeps cores busy while the suite is timed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "busy_neighbour.py"


def _module():
    spec = importlib.util.spec_from_file_location("senslab_busy_neighbour", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_neighbour_runs_for_its_time_and_reports_its_rate(capsys):
    threads = torch.get_num_threads()
    rate = _module().main(["--threads", "1", "--seconds", "0.2", "--size", "16"])
    assert rate > 0 and "on 1 thread(s)" in capsys.readouterr().out
    torch.set_num_threads(threads)
    with pytest.raises(SystemExit):
        _module().main(["--threads", "0"])
