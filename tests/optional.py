"""The suite's optional packages: import them or skip the test that needs them."""

from __future__ import annotations

from types import ModuleType

import pytest


def timm() -> ModuleType:
    """timm, or a skip: it is installed only in ``make test-timm``'s environment, and its
    import fails on a torchvision that does not match torch, so any exception skips."""
    try:
        import timm as module  # type: ignore[import-not-found]
    except Exception as err:  # noqa: BLE001  (timm's import fails on a broken torchvision too)
        pytest.skip(f"timm does not import here ({type(err).__name__}: {err}); make test-timm "
                    "runs the timm paths, and the timm-shaped tests run everywhere")
    return module
