"""Each integration imports its library only when imported itself, and without it says which
extra to install."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

CASES = [
    ("senslab.integrations.torchmetrics", "torchmetrics", "senslab[lightning]"),
    ("senslab.integrations.lightning", "lightning", "senslab[lightning]"),
    ("senslab.integrations.hf", "transformers", "senslab[hf]"),
]


@pytest.mark.parametrize(("module", "library", "extra"), CASES)
def test_missing_library_names_the_extra(module: str, library: str, extra: str,
                                         monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delitem(sys.modules, module, raising=False)
    for name in [m for m in sys.modules if m == library or m.startswith(library + ".")]:
        monkeypatch.setitem(sys.modules, name, None)  # as if it were not installed
    monkeypatch.setitem(sys.modules, library, None)
    with pytest.raises(ImportError, match=extra.replace("[", r"\[").replace("]", r"\]")):
        importlib.import_module(module)


def test_import_senslab_loads_none_of_them():
    code = ("import sys, senslab, senslab.integrations, senslab.measure; "
            "print([m for m in ('torchmetrics', 'lightning', 'transformers') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
