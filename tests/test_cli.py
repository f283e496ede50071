"""Command-line options shared by every command."""

from __future__ import annotations

import pytest
import torch

from senslab.cli import main


def test_threads_option_sets_torch_threads(capsys: pytest.CaptureFixture[str]) -> None:
    before = torch.get_num_threads()
    try:
        assert main(["list", "models", "vit_*", "--threads", "1"]) == 0
        assert torch.get_num_threads() == 1
        assert "vit_small" in capsys.readouterr().out
    finally:
        torch.set_num_threads(before)


def test_threads_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    before = torch.get_num_threads()
    assert main(["list", "models", "--threads", "0"]) == 2
    assert "--threads must be ≥ 1" in capsys.readouterr().err
    assert torch.get_num_threads() == before
