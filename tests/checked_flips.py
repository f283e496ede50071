"""Helpers of the checked-precision tests (``tests/measure/test_bf16_checked.py`` and
``test_int8_checked.py``): a metric that records every copy's flip, and the assertion that a
checked precision gives float32's flips, copy by copy, for fewer float32 forwards."""

from __future__ import annotations

import torch

from senslab.measure import TokenSensitivity, compare_sensitivity
from senslab.models import create_model
from senslab.tokens import Embedding

PAD = 1


class Recorder(TokenSensitivity):
    """Keeps every copy's value (its flip), in plan order."""

    def _add(self, vals, *rest) -> None:  # type: ignore[override]
        self.copies = torch.cat([getattr(self, "copies", torch.zeros(0)), vals.cpu()])
        super()._add(vals, *rest)


def run(model, inputs, tokens, **options) -> Recorder:
    metric = Recorder(model, tokens, generator=5, **options)
    metric.update(inputs)
    return metric


def assert_float32_flips(model, inputs, tokens, low: str = "bf16", **options) -> Recorder:
    """Checked ``low`` ("bf16" or "int8") gives float32's flip on every copy, and re-checks
    only some copies."""
    full = run(model, inputs, tokens, precision="float32", **options)
    checked = run(model, inputs, tokens, precision=f"{low}-checked", **options)
    assert checked.checked_precision == low
    assert torch.equal(checked.copies, full.copies)
    a, b = checked.compute(), full.compute()
    assert a.estimate == b.estimate and torch.equal(a.per_sample, b.per_sample)
    assert a.num_forward == b.num_forward  # every copy counted once …
    assert b.num_forward_fp32 == 0 and b.recheck_fraction is None
    assert checked.check_bound is not None and checked.check_bound > 0
    # bf16_bound is the bound of bf16 alone
    assert checked.bf16_bound == (checked.check_bound if low == "bf16" else None)
    assert a.num_forward_fp32 == round(a.recheck_fraction * len(checked.copies))  # … plus these
    assert a.recheck_fraction < 1  # it saves float32 forwards
    assert 0.0 < b.estimate < 1.0  # flips happen: the comparison is not vacuous
    return checked


def assert_shifted_example_keeps_float32_flips(model, seed: int, repeats: int) -> None:
    """Calibrated on N(0, 1) sequences (32 × 8 × 8), then a batch in which one example is
    shifted by 64: the low precision's error grows with the shift, so the band must widen for
    it. Checked bf16's flips must equal float32's, the model's estimate strictly inside (0, 1),
    and not every copy re-checked."""
    from senslab.tokens import Sequence

    g = torch.Generator().manual_seed(seed)
    first, second = torch.randn(32, 8, 8, generator=g), torch.randn(32, 8, 8, generator=g)
    second[3] += 64.0
    runs = {}
    for precision in ("float32", "bf16-checked"):
        m = Recorder(model, Sequence(), sigma=0.3, repeats=repeats, generator=5,
                     precision=precision)
        m.update(first)
        m.update(second)
        runs[precision] = m
    full, checked = runs["float32"], runs["bf16-checked"]
    assert checked.checked_precision == "bf16"
    assert int((checked.copies != full.copies).sum()) == 0
    a, b = checked.compute(), full.compute()
    assert a.estimate == b.estimate and 0 < b.estimate < 1
    assert a.recheck_fraction < 1


def right_padded(b: int, t: int, seed: int = 0, vocab: int = 50) -> dict[str, torch.Tensor]:
    """Random token ids, right padded with ``PAD`` to ``t``, and their attention mask."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, vocab, (b, t), generator=g)
    lengths = torch.randint(t // 2, t + 1, (b,), generator=g)
    mask = torch.arange(t)[None] < lengths[:, None]
    return {"input_ids": ids.masked_fill(~mask, PAD), "attention_mask": mask}


def assert_paired_comparison_equals_float32(low: str, dim: int) -> None:
    """``compare_sensitivity`` of two zoo text models (``dim`` wide) in checked ``low``: the
    float32 run's difference and standard error, with some copies re-checked."""
    models = {name: create_model(name, vocab_size=50, max_len=16, dim=dim, layers=2, heads=2,
                                 dropout=0.0, seed=3) for name in ("roberta", "gpt2")}
    batch, tokens = right_padded(32, 12), Embedding("embed_ln")
    runs = [compare_sensitivity(models, batch, tokens, sigma=3.0, repeats=2, precision=p)
            for p in ("float32", f"{low}-checked")]
    d = [r.difference("roberta", "gpt2") for r in runs]
    assert d[0].estimate == d[1].estimate and d[0].stderr == d[1].stderr
    assert runs[0].results["gpt2"].num_forward_fp32 == 0
    assert runs[1].results["gpt2"].num_forward_fp32 > 0
