"""A metric evaluated again and again (a training loop's callback: reset, updates, compute, every
N steps) says a cause once, not at every batch nor at every evaluation; a cause of another
kind, and a new metric object, are said again. Recorded with ``simplefilter("always")``, as a
logging framework sees them: Python's default filter would hide repeats of one text from one
line, which is no dedup to rely on."""

from __future__ import annotations

import pickle
import warnings

import pytest
import torch
from torch import nn

from senslab.measure import TokenSensitivity
from senslab.measure.tokenwise import STOPPING_WARN_BATCHES
from senslab.tokens import Embedding, Patches

from .test_padding import PAD, MeanOfAll, right_padded
from .test_precision_spotcheck import batches as spot_batches
from .test_precision_spotcheck import cancelling_linear

STOPPING = "target_stderr stops each update() batch"
UNTRIMMED = "padding-aware batching is off"
FEW_PAIRS = "allocation='uniform' drew fewer than"
SPOT = "precision='bf16-checked': a float32 spot check found bf16"
WEIGHTS = "precision='bf16-checked' checks a lower precision against float32"


def evaluations(metric, batches, times=3):
    """``times`` evaluations of ``metric``, each a reset, an update per batch of ``batches``
    and a compute: every warning said, as text."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(times):
            metric.reset()
            for batch in batches:
                metric.update(batch)
            metric.compute()
    return [str(w.message) for w in caught]


def count(said, text):
    return sum(text in s for s in said)


def test_the_stopping_bias_is_said_once_per_metric():
    torch.manual_seed(0)  # test-only: model init
    model, batch = MeanOfAll(), right_padded(4, 8)  # it reads its padding: another cause
    options = {"sigma": 3.0, "target_stderr": 0.2, "max_forward": 200, "generator": 0}
    updates = [batch] * (STOPPING_WARN_BATCHES + 2)
    said = evaluations(TokenSensitivity(model, Embedding("embed_ln"), **options), updates)
    assert count(said, STOPPING) == 1  # was one per evaluation: 3
    assert count(said, UNTRIMMED) == 1  # was one per batch: 36
    # another metric object is another measurement: told once too
    again = evaluations(TokenSensitivity(model, Embedding("embed_ln"), **options), updates, 2)
    assert count(again, STOPPING) == 1


def few_pairs_case():
    """An MLP over 8 × 8 images in 16 patches, 8 images a batch: allocation='uniform' without a
    target draws a quarter of 128 tokens twice, fewer than MIN_PAIRS, at every batch."""
    g = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.LeakyReLU(), nn.Linear(32, 3))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
    options = {"sigma": 1.0, "allocation": "uniform", "estimand": "subset",
               "precision": "float32", "generator": 0}
    return model.eval(), torch.randn(8, 1, 8, 8, generator=g), options


def test_uniform_allocation_on_few_pairs_is_said_once_per_metric():
    """The warning names no batch and no number that changes: the cause is the metric's
    (batches too small for its budget, no target). It was said at every batch of every
    evaluation: 12 times here."""
    model, x, options = few_pairs_case()
    said = evaluations(TokenSensitivity(model, Patches(2), **options), [x] * 4)
    assert count(said, FEW_PAIRS) == 1
    again = evaluations(TokenSensitivity(model, Patches(2), **options), [x] * 4, 1)
    assert count(again, FEW_PAIRS) == 1  # a new metric: said again


def test_the_spot_check_beyond_the_calibration_is_said_once_per_metric():
    """Each evaluation calibrates again after its reset, on its first batch, which is unlike
    the later one: the bound is widened in every evaluation (the decisions stay float32's),
    and it was said in every one: 3 times here."""
    model = cancelling_linear(3)
    first, later = spot_batches(16, 64)
    options = {"sigma": 0.003, "repeats": 4, "precision": "bf16-checked", "generator": 0}
    metric = TokenSensitivity(model, Patches(2), **options)
    said = evaluations(metric, [first, later])
    assert count(said, SPOT) == 1
    # the last evaluation widened its bound too, silently: check_bound says so
    assert metric._check.widened >= 1
    assert metric.check_bound > 4 * metric._check.calibrated
    again = evaluations(TokenSensitivity(model, Patches(2), **options), [first, later], 1)
    assert count(again, SPOT) == 1


class ReadsPaddingFailsShort(MeanOfAll):
    """Reads its padding (MeanOfAll) and fails on inputs shorter than 3 tokens: cut after
    their last real token, examples of 3 tokens or more change their outputs, shorter ones
    fail — two kinds of change."""

    def forward(self, input_ids, attention_mask):
        if input_ids.shape[1] < 3:
            raise RuntimeError("this model needs at least 3 tokens")
        return super().forward(input_ids, attention_mask)


def padded(lengths: list[int], t: int = 8, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, 50, (len(lengths), t), generator=g)
    mask = torch.arange(t)[None] < torch.tensor(lengths)[:, None]
    return {"input_ids": ids.masked_fill(~mask, PAD), "attention_mask": mask}


def test_padding_aware_fallback_is_said_once_per_metric_and_kind_and_counted():
    """A model that reads its padding does so at every batch: the fallback to full width was
    said at every one (9 times here, the example and the change differing), and is now said
    once per kind of change — the model failing on cut inputs is another cause than it
    changing its outputs, and said too — with every batch it cost counted."""
    torch.manual_seed(0)  # test-only: model init
    model = ReadsPaddingFailsShort()
    changes, fails = padded([6, 3, 5, 4]), padded([2, 1, 2, 1], seed=1)
    options = {"sigma": 3.0, "repeats": 2, "precision": "float32", "generator": 0}
    metric = TokenSensitivity(model, Embedding("embed_ln"), **options)
    said = evaluations(metric, [changes, fails, changes])
    untrimmed = [s for s in said if UNTRIMMED in s]
    assert len(untrimmed) == 2
    assert "changed its clean output" in untrimmed[0]
    assert "failed on inputs cut to 2 tokens" in untrimmed[1]
    assert metric.untrimmed_batches == 3  # since the last reset: every batch, said or not
    assert not metric.last_trimmed
    metric.reset()
    assert metric.untrimmed_batches == 0
    again = evaluations(TokenSensitivity(model, Embedding("embed_ln"), **options), [fails], 1)
    assert count(again, UNTRIMMED) == 1  # a new metric: said again


def test_checked_precision_on_float64_weights_is_said_once_per_metric_and_dtype():
    """precision='bf16-checked' on a float64 model runs float64: asked at every batch, it was
    said at every one (12 times here), and pointed into senslab's own code. A model converted
    to another dtype that is not float32 is another cause, said again."""
    model, x, _ = few_pairs_case()
    model, x = model.double(), x.double()
    options = {"sigma": 1.0, "precision": "bf16-checked", "generator": 0}
    metric = TokenSensitivity(model, Patches(2), **options)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            metric.reset()
            for _ in range(4):
                metric.update(x)
            metric.compute()
    said = [w for w in caught if WEIGHTS in str(w.message)]
    assert len(said) == 1
    assert said[0].filename == __file__  # the caller's line, not senslab's
    again = evaluations(TokenSensitivity(model, Patches(2), **options), [x] * 2, 1)
    assert count(again, WEIGHTS) == 1  # a new metric: said again
    model.bfloat16()
    other = evaluations(metric, [x.bfloat16()] * 2, 1)
    assert count(other, WEIGHTS) == 1 and "torch.bfloat16" in other[0]


def older(metric: TokenSensitivity) -> TokenSensitivity:
    """``metric`` as pickled by a senslab that said every cause at every occurrence: no
    ``_said``, no ``untrimmed_batches``, a precision check with ``warned`` and no ``said``."""
    for name in ("_said", "untrimmed_batches"):
        metric.__dict__.pop(name, None)
    metric._check.__dict__.pop("said", None)
    metric._check.warned = False
    return pickle.loads(pickle.dumps(metric))


@pytest.mark.parametrize("case", ["uniform", "spot check"])
def test_an_older_pickle_loads_measures_and_says_a_cause_once(case):
    if case == "uniform":
        model, x, options = few_pairs_case()
        updates, text = [x] * 2, FEW_PAIRS

        def build():
            return TokenSensitivity(model, Patches(2), **options)
    else:
        first, later = spot_batches(16, 64)
        updates, text = [first, later], SPOT

        def build():
            return TokenSensitivity(cancelling_linear(3), Patches(2), sigma=0.003, repeats=4,
                                    precision="bf16-checked", generator=0)
    loaded = older(build())
    said = evaluations(loaded, updates, 2)
    assert count(said, text) == 1
    assert loaded.compute().num_examples == sum(len(u) for u in updates)
    resumed = older(build())  # a checkpoint taken mid-evaluation: measured on, no reset
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its first batch's causes: said above
        resumed.update(updates[0])
    assert resumed.untrimmed_batches == 0
