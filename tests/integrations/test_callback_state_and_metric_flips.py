"""TokenSensitivityMetric warns where its standard error rests on few flips, as
``TokenSensitivity.compute`` does, with the flip counts carried as states (merge, state dict,
reset); the Lightning callback's results survive a resumed fit, and two callbacks logging under
one key are refused rather than averaged."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import pytest
import torch

pytest.importorskip("lightning")

import lightning  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from lightning_toys import Module, data  # noqa: E402

from senslab.integrations.lightning import SensitivityCallback  # noqa: E402
from senslab.integrations.torchmetrics import TokenSensitivityMetric  # noqa: E402
from senslab.measure import TokenSensitivity  # noqa: E402
from senslab.tokens import Patches, Sequence  # noqa: E402

logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)

NONE = "the standard error rests on no flip"
FEW = "the standard error rests on few flips"
FLIPS = {"sigma": 1.0, "repeats": 4}


def first_entry(inp: torch.Tensor) -> torch.Tensor:
    """The logit is token 0's first entry: a copy of an example where it is 0 flips when its
    noise there is positive; where it is 100.5, never."""
    return inp[:, 0, 0]


def inputs(b: int, offset: float = 0.0) -> torch.Tensor:
    x = torch.zeros(b, 4, 2)
    x[:, 0, 0] = offset
    return x


def said(caught: list[warnings.WarningMessage], text: str) -> int:
    return sum(text in str(w.message) for w in caught)


# -- the metric: flip counts as states, the warning said once ----------------------------------

def test_the_metric_warns_of_few_flips_once_as_token_sensitivity_does():
    """Before: the metric carried no flip counts and its compute() said nothing where
    TokenSensitivity.compute() on the same batches warns (1–9 flips: a standard error that
    moves with them). Now the counts are TokenSensitivity's and the warning is said once, also
    over reset(); a batch without a flip after a reset is another cause, said once."""
    ref = TokenSensitivity(first_entry, Sequence(), generator=1, **FLIPS)
    ref.update(inputs(4))
    metric = TokenSensitivityMetric(Sequence(), generator=1, **FLIPS)
    metric.update(first_entry, inputs(4))
    assert (float(metric.num_copies), float(metric.num_events)) == (ref.state.copies,
                                                                    ref.state.events)
    assert 0 < ref.state.events < 10
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        want = ref.compute()
        got = metric.result()
        metric.compute()
        metric.reset()
        metric.update(first_entry, inputs(4))
        metric.compute()
    assert (got.estimate, got.stderr) == (want.estimate, want.stderr)
    assert said(caught, FEW) == 2  # the reference's and the metric's, once
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        metric.reset()
        metric.update(first_entry, inputs(4, offset=100.5))
        metric.compute()
        metric.compute()
    assert float(metric.num_events) == 0 and said(caught, NONE) == 1


def test_the_flip_counts_merge_load_and_reset():
    """The counts add up through merge_state and a state dict (two metrics of a few flips each
    hold enough merged: nothing said), and reset() zeroes them. States without them (an older
    senslab's) merge and load, their counts unknown: nothing said either way."""
    a = TokenSensitivityMetric(Sequence(), generator=1, **FLIPS)
    b = TokenSensitivityMetric(Sequence(), generator=2, **FLIPS)
    a.update(first_entry, inputs(4))
    b.update(first_entry, inputs(4))
    ka, kb = float(a.num_events), float(b.num_events)
    assert 0 < ka < 10 and 0 < kb < 10 and ka + kb >= 10
    b.persistent(True)
    saved = b.state_dict()
    merged = TokenSensitivityMetric(Sequence(), generator=3, **FLIPS)
    merged.merge_state(a)
    merged.merge_state(saved)
    assert (float(merged.num_copies), float(merged.num_events)) == (128, ka + kb)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        a.compute()  # alone, a few flips: said
        merged.compute()  # merged, enough: not
    assert said(caught, FEW) == 1
    loaded = TokenSensitivityMetric(Sequence(), generator=3, **FLIPS)
    loaded.persistent(True)
    loaded.load_state_dict(saved)
    assert (float(loaded.num_copies), float(loaded.num_events)) == (64, kb)
    merged.reset()
    assert float(merged.num_copies) == float(merged.num_events) == 0
    # an older senslab's state dict: no counts; merged and loaded, unknown (NaN), not 0
    old = {k: v for k, v in saved.items() if k not in ("num_copies", "num_events")}
    c = TokenSensitivityMetric(Sequence(), generator=4, **FLIPS)
    c.update(first_entry, inputs(4, offset=100.5))
    c.merge_state(old)
    assert torch.isnan(c.num_copies)
    c.load_state_dict(old)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert torch.isnan(c.num_events) and c.result().num_examples == 4
    assert said(caught, NONE) == said(caught, FEW) == 0


# -- the Lightning callback -------------------------------------------------------------------

def trainer(tmp_path: Path, callbacks: list, epochs: int) -> lightning.Trainer:
    return lightning.Trainer(
        max_epochs=epochs, accelerator="cpu", devices=1, callbacks=callbacks, logger=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # few flips on this small subset
def test_a_resumed_fit_continues_the_results(tmp_path: Path):
    """A fit resumed from the epoch-1 checkpoint: before, the new process's callback.results
    held epochs 2 and 3 only (epoch 1 was lost with the process); now the checkpoint holds
    results (as plain values: weights_only loads it) and the resumed fit continues them. A
    callback that held results already keeps them in set_aside, with a warning."""
    loader, subset = data()
    first = SensitivityCallback(subset, Patches(4), sigma=0.5, repeats=2)
    saver = ModelCheckpoint(dirpath=tmp_path / "ck", save_top_k=-1, filename="{epoch}")
    trainer(tmp_path, [first, saver], 2).fit(Module(), loader)
    path = tmp_path / "ck" / "epoch=0.ckpt"
    torch.load(path, weights_only=True)
    resumed = SensitivityCallback(subset, Patches(4), sigma=0.5, repeats=2)
    trainer(tmp_path, [resumed], 3).fit(Module(), loader, ckpt_path=str(path))
    assert [e for e, _ in resumed.results] == [1, 2, 3]
    for (_, got), (_, want) in zip(resumed.results[:2], first.results, strict=True):
        assert (got.estimate, got.stderr) == (want.estimate, want.stderr)
        assert torch.equal(got.per_sample, want.per_sample)
    with pytest.warns(UserWarning, match=r"kept in callback.set_aside"):
        trainer(tmp_path, [first], 2).fit(Module(), loader, ckpt_path=str(path))
    assert [[e for e, _ in series] for series in first.set_aside] == [[1, 2]]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # few flips on this small subset
@pytest.mark.parametrize("names", [("sensitivity", "sensitivity"),
                                   ("sensitivity", "sensitivity_stderr")])
def test_two_callbacks_logging_under_one_key_are_refused(tmp_path: Path, names):
    """Before: two callbacks of one name logged the mean of their values weighted by the
    subsets' sizes (0.098 for 0.05 and 0.219) under 'sensitivity', as either's value."""
    loader, subset = data()
    a = SensitivityCallback(subset, Patches(4), sigma=0.5, repeats=2, name=names[0])
    b = SensitivityCallback(subset[:4], Patches(4), sigma=2.0, repeats=2, name=names[1])
    with pytest.raises((ValueError, RuntimeError), match=r"name=|state_key"):
        trainer(tmp_path, [a, b], 1).fit(Module(), loader)
    assert not a.results and not b.results
