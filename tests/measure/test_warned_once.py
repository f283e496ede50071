"""A metric evaluated again and again (a training loop's callback: reset, updates, compute, every
N steps) says a cause once, not at every evaluation; warnings of another cause are said as
before. Recorded with ``simplefilter("always")``, as a logging framework sees them: Python's
default filter would hide repeats of one text from one line, which is no dedup to rely on."""

from __future__ import annotations

import warnings

import torch

from senslab.measure import TokenSensitivity
from senslab.measure.tokenwise import STOPPING_WARN_BATCHES
from senslab.tokens import Embedding

from .test_padding import MeanOfAll, right_padded

STOPPING = "target_stderr stops each update() batch"
UNTRIMMED = "padding-aware batching is off"


def evaluations(metric, batch, times=3):
    """``times`` evaluations of ``metric`` on ``batch``, each a reset, more updates than
    STOPPING_WARN_BATCHES and a compute: every warning said, as text."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(times):
            metric.reset()
            for _ in range(STOPPING_WARN_BATCHES + 2):
                metric.update(batch)
            metric.compute()
    return [str(w.message) for w in caught]


def test_the_stopping_bias_is_said_once_per_metric_and_another_cause_every_time():
    torch.manual_seed(0)  # test-only: model init
    model, batch = MeanOfAll(), right_padded(4, 8)  # it reads its padding: a warning per batch
    options = {"sigma": 3.0, "target_stderr": 0.2, "max_forward": 200, "generator": 0}
    said = evaluations(TokenSensitivity(model, Embedding("embed_ln"), **options), batch)
    assert sum(STOPPING in s for s in said) == 1  # was one per evaluation: 3
    assert sum(UNTRIMMED in s for s in said) == 3 * (STOPPING_WARN_BATCHES + 2)
    # another metric object is another measurement: told once too
    again = evaluations(TokenSensitivity(model, Embedding("embed_ln"), **options), batch, 2)
    assert sum(STOPPING in s for s in again) == 1
