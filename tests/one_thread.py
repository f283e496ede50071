"""A fixture shared by the trainers' tests: one torch thread, and the measurements' few-flips
warnings at tiny scale kept quiet."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread_quiet() -> Any:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the measurements' few-flips warnings at tiny scale
        yield
    torch.set_num_threads(before)
