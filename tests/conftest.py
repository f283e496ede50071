"""Test-wide isolation: derived files (trained tokenizers) go to a per-session temporary cache,
never to the user's ~/.cache; torch's thread count is restored after every test."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    cache = tmp_path_factory.mktemp("senslab-cache")
    before = os.environ.get("SENSLAB_CACHE")
    os.environ["SENSLAB_CACHE"] = str(cache)
    yield cache
    if before is None:
        os.environ.pop("SENSLAB_CACHE", None)
    else:
        os.environ["SENSLAB_CACHE"] = before


@pytest.fixture(autouse=True)
def _restore_torch_threads() -> Iterator[None]:
    """A test that changes torch's thread count (``--threads``, the benchmark) must not change
    the numerics of the tests after it."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)
