"""A ``--set`` number below a float's range is refused (audit of session 76):
``track.sigma=1e-400`` read as 0.0 and turned sensitivity tracking off without a word."""

from __future__ import annotations

import pytest

from senslab.train.config import RunConfig, apply_overrides


@pytest.mark.parametrize("text", ["1e-400", "-1e-400", "0.5e-330"])
def test_a_number_below_a_floats_range_is_refused(text):
    with pytest.raises(ValueError, match=rf"track\.sigma={text} is below a float's range"):
        apply_overrides(RunConfig(name="x"), [f"track.sigma={text}"])


@pytest.mark.parametrize("text,value", [("0", 0.0), ("0.0", 0.0), ("0e5", 0.0),
                                        ("1e-300", 1e-300), ("2.5", 2.5)])
def test_zero_and_numbers_in_range_are_taken(text, value):
    assert apply_overrides(RunConfig(name="x"), [f"track.sigma={text}"]).track.sigma == value
