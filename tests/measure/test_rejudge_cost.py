"""``"auto"``'s re-judgement of checked precision after every checked chunk
(``PrecisionCheck._rejudge``) prices a checked copy once (``_checked_cost``, a pure function of
the timings), not once for the verdict and again for a reason that is only kept when checking
stops; the verdict and the reason are those of the calibration's numbers."""

from __future__ import annotations

import pytest

from senslab.measure import _precision

CAL = _precision.CALIBRATION_COPIES


def judged(share_rechecked: int) -> _precision.PrecisionCheck:
    """A check whose calibration predicted a gain (10% re-checked, a low copy a third of a
    float32 one), after 2 × CALIBRATION_COPIES checked copies of which ``share_rechecked``
    were re-checked in float32."""
    check = _precision.PrecisionCheck()
    check.use("int8", judge=True)
    check._copies, check._seconds, check.predicted_recheck = CAL, [0.5, 1.5], 0.1
    check._timed = [1.0, 2 * CAL, 1.8, share_rechecked]
    return check


@pytest.fixture
def priced(monkeypatch):
    """The calls to ``_checked_cost`` (each runs the real method)."""
    calls = []
    real = _precision.PrecisionCheck._checked_cost

    def counted(self):
        calls.append(self)
        return real(self)

    monkeypatch.setattr(_precision.PrecisionCheck, "_checked_cost", counted)
    return calls


def test_rejudging_prices_a_checked_copy_once_and_judges_as_before(priced):
    check = judged(share_rechecked=10)
    cost = _precision.PrecisionCheck._checked_cost(check)
    assert cost <= 1 / _precision.MIN_SPEEDUP  # checking pays
    priced.clear()
    for _ in range(5):  # after every checked chunk
        check._rejudge()
    assert len(priced) == 5  # was twice per call: the verdict's and an unused reason's
    assert not check.idle and check.why_idle is None
    # where the measured copies show a loss: the same verdict, and the price in the reason
    check = judged(share_rechecked=300)
    check._rejudge()
    cost = _precision.PrecisionCheck._checked_cost(check)
    assert cost > 1 / _precision.MIN_SPEEDUP
    assert check.idle and check.why_idle == (
        f"\"auto\" measured no gain over {2 * CAL} checked copies: int8 re-checked "
        f"{300 / (2 * CAL):.0%} of them in float32, and a checked copy cost {cost:.2f} of a "
        "float32 one")
    priced.clear()
    check._rejudge()  # checking stopped: nothing is judged again
    assert not priced
