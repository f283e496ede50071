"""Test-wide isolation: derived files (trained tokenizers) go to a per-session temporary cache,
never to the user's ~/.cache."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest


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
