"""Token-wise sensitivity, session 79: flips of examples whose clean class is a tie said (as
output sharpness says ShPred's), and a NaN fixed-subset standard error of single units of draws
said with the draws that give a finite one."""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from torch import nn

from senslab.measure import TokenSensitivity, token_sensitivity
from senslab.measure.sharpness import output_sharpness
from senslab.models import create_model
from senslab.tokens import Embedding, Sequence

TIE = "clean class is a tie"
UNIT = "single unit of noise draws"


def _blank(b: int = 16, blanks: int = 5) -> torch.Tensor:
    """``b`` examples of 6 tokens of 4 entries, the first ``blanks`` all zero."""
    x = torch.randn(b, 6, 4, generator=torch.Generator().manual_seed(0))
    x[:blanks] = 0.0
    return x


def _head(classes: int) -> nn.Module:
    """A head without bias: a blank input gives all-zero logits, a tie (one column: exactly on
    its boundary 0, read as class 0) that any noise breaks."""
    torch.manual_seed(1)
    return nn.Sequential(nn.Flatten(), nn.Linear(24, classes, bias=False))


def _said(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = fn()
    return res, [str(w.message) for w in caught]


def _ties(messages: list[str]) -> list[str]:
    return [m for m in messages if TIE in m]


def _counts(message: str) -> tuple[int, ...]:
    """(tied examples, examples, their flipped copies, all flipped copies)."""
    found = re.search(r"([\d,]+) of the ([\d,]+) examples .*They made ([\d,]+) of the ([\d,]+) "
                      r"flipped copies", message)
    assert found is not None, message
    return tuple(int(g.replace(",", "")) for g in found.groups())


@pytest.mark.parametrize("classes", [1, 3])
def test_flips_of_tied_examples_are_said_at_any_sigma(classes: int) -> None:
    # before: 0.16 (one column) or 0.24 (three classes) at sigma=1e-4 without a word, every
    # flip from the five blank examples, whose rate does not fall with sigma
    x, model = _blank(), _head(classes)
    kind = "logits" if classes == 1 else None
    for sigma in (1e-4, 1e-2):
        r, said = _said(lambda s=sigma: token_sensitivity(model, x, Sequence(), sigma=s,
                                                          repeats=8, output_kind=kind))
        ties = _ties(said)
        assert len(ties) == 1 and r.estimate > 0.1
        assert ties[0].startswith("the sensitivity counts flips of examples whose clean")
        tied, b, theirs, total = _counts(ties[0])
        assert (tied, b) == (5, 16) and theirs == total > 0
        assert "the sensitivity over the other 11 examples is 0." in ties[0]
        assert r.per_sample[5:].sum() == 0  # the number itself is unchanged: theirs alone
        assert r.estimate == pytest.approx(float(r.per_sample.double().mean()), abs=1e-6)
    # an untied model at the same sigma flips nothing and hears nothing
    torch.manual_seed(3)
    plain = nn.Sequential(nn.Flatten(), nn.Linear(24, 3))
    r, said = _said(lambda: token_sensitivity(plain, _blank(blanks=0), Sequence(), sigma=1e-4))
    assert r.estimate == 0 and not _ties(said)


def test_the_counts_are_the_same_through_chunks_streams_merges_and_shards() -> None:
    x, model = _blank(), _head(3)
    opts = {"sigma": 1e-4, "repeats": 2, "generator": 4}
    whole, said = _said(lambda: token_sensitivity(model, x, Sequence(), **opts))
    ref = _counts(_ties(said)[0])
    chunked, said = _said(lambda: token_sensitivity(model, x, Sequence(), chunk_size=3, **opts))
    assert _counts(_ties(said)[0]) == ref and chunked.estimate == whole.estimate
    # streamed updates: once per metric, with every batch's counts
    metric = TokenSensitivity(model, Sequence(), **opts)
    for lo in range(0, 16, 4):
        metric.update(x[lo:lo + 4])
    _, said = _said(lambda: (metric.compute(), metric.compute()))
    assert len(_ties(said)) == 1 and _counts(_ties(said)[0])[:2] == (5, 16)
    # shards merged by hand: the sums are the state's
    parts = [TokenSensitivity(model, Sequence(), shard=(rank, 3), **opts) for rank in range(3)]
    for part in parts:
        part.update(x)
    merged = parts[0].merge(parts[1]).merge(parts[2])
    r, said = _said(merged.compute)
    assert _counts(_ties(said)[0]) == ref and r.estimate == pytest.approx(whole.estimate)


def test_ties_are_said_with_every_design_and_checked_precision() -> None:
    x, model = _blank(), _head(3)
    for opts in ({"antithetic": True, "repeats": 2}, {"control_variate": "linear"},
                 {"allocation": "linear"}, {"allocation": "uniform"},
                 {"mode": "whole", "repeats": 8}, {"num_tokens": 2}, {"target_stderr": 0.05},
                 {"precision": "bf16-checked"}):
        _, said = _said(lambda o=opts: token_sensitivity(model, x, Sequence(), sigma=1e-4, **o))
        ties = _ties(said)
        assert len(ties) == 1 and _counts(ties[0])[:2] == (5, 16), opts
        # checked bf16 decides the copies in float32: float32's exact ties, not bf16's
        assert "bfloat16" not in ties[0]


@pytest.mark.parametrize("kind", ["probabilities", "scores"])
def test_a_column_exactly_on_its_boundary_is_a_tie(kind: str) -> None:
    class Column(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = _head(1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            z = self.lin(x)
            return torch.sigmoid(z) if kind == "probabilities" else z + 0.25

    opts = {"output_kind": kind, **({"threshold": 0.25} if kind == "scores" else {})}
    _, said = _said(lambda: token_sensitivity(Column(), _blank(), Sequence(), sigma=1e-4,
                                              repeats=4, **opts))
    assert len(_ties(said)) == 1 and _counts(_ties(said)[0])[:2] == (5, 16)


def test_a_clamped_output_is_no_tie_but_a_tie_some_tokens_cannot_reach_is() -> None:
    # a ReLU'd logit of 0 (negative pre-activation) flips only where the noise overcomes it,
    # and sits on 0 in the other copies: never on the clean class's side, not a tie
    torch.manual_seed(0)
    relu = nn.Sequential(nn.Flatten(), nn.Linear(24, 1), nn.ReLU())
    with torch.no_grad():
        relu[1].bias.fill_(-0.5)
    x = torch.randn(16, 6, 4, generator=torch.Generator().manual_seed(2)) * 0.01
    r, said = _said(lambda: token_sensitivity(relu, x, Sequence(), sigma=3.0, repeats=4,
                                              output_kind="logits"))
    assert r.estimate > 0.05 and not _ties(said)

    # a tie that noise on the last three tokens cannot reach: those copies sit exactly on it
    # (as noise too small to move a large model's outputs leaves some), the others move it
    # both ways; said (the rule of "no copy back on the tie" alone had kept silent)
    class FirstTokens(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(12, 3, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x[:, :3].flatten(1))

    torch.manual_seed(1)
    r, said = _said(lambda: token_sensitivity(FirstTokens(), _blank(), Sequence(), sigma=1e-4,
                                              repeats=4))
    assert len(_ties(said)) == 1 and _counts(_ties(said)[0])[:2] == (5, 16)


@pytest.mark.parametrize(("name", "reuse"), [("lstm", True), ("roberta", False)])
def test_padded_text_with_prefix_reuse_or_trimming(name: str, reuse: bool) -> None:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(2, 50, (10, 12), generator=g)
    lengths = torch.randint(1, 11, (10,), generator=g)
    lengths[0] = 10
    mask = torch.arange(12)[None] < lengths[:, None]
    inputs = {"input_ids": ids.masked_fill(~mask, 1), "attention_mask": mask}
    model = create_model(name, vocab_size=50, max_len=16, dim=16, layers=2, heads=2,
                         dropout=0.0, seed=3).eval()
    with torch.inference_mode():
        threshold = float(model(**inputs)[2, 0])  # example 2 sits exactly on its boundary
    metric = TokenSensitivity(model, Embedding("embed_ln", reuse_prefix=reuse), sigma=1e-4,
                              repeats=4, output=lambda o: o[:, 0], output_kind="scores",
                              threshold=threshold)
    metric.update(inputs)
    assert metric.last_trimmed != reuse  # prefix reuse stops at the last real token itself
    r, said = _said(metric.compute)
    assert len(_ties(said)) == 1 and _counts(_ties(said)[0])[:2] == (1, 10)
    # the tie-breaks flip (how often depends on the CPU's rounding of the boundary example:
    # 0.125 on an AVX2 EPYC, above 0.2 on AVX-512 machines) and nothing else does
    assert r.per_sample[2] > 0.05 and float(r.per_sample.sum()) == float(r.per_sample[2])


def _bf16_tie() -> nn.Module:
    """bf16 logits 1 + small changes for two classes: exactly tied at a blank input."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(24, 2))
    with torch.no_grad():
        model[1].weight.mul_(0.1)
        model[1].bias.fill_(1.0)
    return model.bfloat16()


def test_bf16_ties_are_said_only_where_rounding_decides_their_flips() -> None:
    model, x = _bf16_tie(), _blank(blanks=16).bfloat16()
    # the noise moves the tied margin by about bf16's spacing at 1 (0.0039 below, 0.0078
    # above): rounding decides the flips
    r, said = _said(lambda: token_sensitivity(model, x, Sequence(), sigma=0.1, repeats=4))
    ties = _ties(said)
    assert r.estimate > 0 and len(ties) == 1
    assert "bfloat16 outputs' spacing" in ties[0] and "float32 copy" in ties[0]
    # by tens of spacings: the noise decides, as it would in float32
    r, said = _said(lambda: token_sensitivity(model, x, Sequence(), sigma=3.0, repeats=4))
    assert r.estimate > 0.2 and not _ties(said)


def test_output_sharpness_says_a_tie_that_some_draws_leave_in_place() -> None:
    # the rule is the token-wise one (senslab.measure.outputs.tie_breaks): an output rounded to
    # 0.01 sits exactly on its boundary in the draws whose change rounds away, and moves to
    # either side in the others, a tie; before, a draw back on the tie read as a clamp, unsaid
    class Rounded(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 1)
            with torch.no_grad():
                self.lin.weight.zero_()
                self.lin.bias.zero_()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.round(self.lin(x) * 100) / 100

    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(0))
    _, said = _said(lambda: output_sharpness(Rounded(), x, sigma_w=0.005, repeats=20,
                                             generator=0, output_kind="logits"))
    ties = [m for m in said if m.startswith("ShPred counts flips of examples whose clean")]
    assert len(ties) == 1 and "16 of the 16 examples (index 0, 1, 2, 3, 4, ...) have" in ties[0]
    assert "no other example is left" in ties[0] and "flipped predictions" in ties[0]


# -- a NaN fixed-subset standard error -------------------------------------------------------


def _units(**opts):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(24, 3))
    x = torch.randn(32, 6, 4, generator=torch.Generator().manual_seed(0))
    return _said(lambda: token_sensitivity(model, x, Sequence(), sigma=1.0, estimand="subset",
                                           **opts))


@pytest.mark.parametrize(("opts", "fix"), [
    ({"mode": "whole", "repeats": 1}, "repeats=2 or more (mode='whole'"),
    ({"mode": "whole", "repeats": 2, "antithetic": True}, "repeats=4 or more"),
    ({"num_tokens": 1, "repeats": 3}, "num_tokens=2 or more"),
])
def test_one_unit_per_example_is_said_with_the_draws_that_fix_it(opts, fix) -> None:
    # before: 0.1562 ± nan (95% CI nan–nan, subset) without a word, or with the few-flips one
    r, said = _units(**opts)
    units = [m for m in said if UNIT in m]
    assert r.stderr != r.stderr and len(units) == 1
    assert "32 of the 32 examples had one" in units[0] and fix in units[0]
    assert "estimand='data'" in units[0] and "finite here" in units[0]
    assert r.stderr_subset != r.stderr_subset


def test_one_short_example_is_said_and_finite_designs_are_not() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(24, 3))
    x = torch.randn(8, 6, 4, generator=torch.Generator().manual_seed(0))
    mask = torch.ones(8, 6, dtype=torch.bool)
    mask[3, 1:] = False  # one real token: one copy with repeats=1, no spread
    metric = TokenSensitivity(model, Sequence(), sigma=1.0, estimand="subset")
    metric.update(x, mask)
    r, said = _said(lambda: (metric.compute(), metric.compute())[0])
    units = [m for m in said if UNIT in m]
    assert r.stderr != r.stderr and len(units) == 1  # once per metric
    assert "1 of the 8 examples had one" in units[0] and "repeats=2 or more" in units[0]
    # two draws per token: stratified, finite; the data estimand: not asked for, not said
    r, said = _said(lambda: token_sensitivity(model, x, Sequence(), mask=mask, sigma=1.0,
                                              estimand="subset", repeats=2))
    assert r.stderr == r.stderr and not [m for m in said if UNIT in m]
    r, said = _said(lambda: token_sensitivity(model, x, Sequence(), mask=mask, sigma=1.0))
    assert r.stderr == r.stderr and not [m for m in said if UNIT in m]


def test_the_new_counts_survive_an_all_reduce(tmp_path) -> None:
    import torch.distributed as dist

    if not dist.is_available() or dist.is_initialized():
        pytest.skip("needs torch.distributed, and no process group of the caller's")
    metric = TokenSensitivity(_head(3), Sequence(), sigma=1e-4, estimand="subset", mode="whole")
    metric.update(_blank())
    local = metric.state
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        metric.all_reduce()
    finally:
        dist.destroy_process_group()
    total = metric.state
    for field in ("n", "copies", "events", "single", "ties", "tie_flips", "flips", "forward"):
        assert getattr(total, field) == getattr(local, field), field
    assert total.tie_rates == pytest.approx(local.tie_rates) and total.ties > 0
    assert total.single == 16 and torch.equal(total.pos_cnt, local.pos_cnt)
    _, said = _said(metric.compute)
    assert len(_ties(said)) == 1 and len([m for m in said if UNIT in m]) == 1


def test_the_few_flips_warning_names_a_single_units_nan_for_what_it_is() -> None:
    """With a single unit of draws the few-flips warning showed ``± nan (95% CI nan–nan,
    subset)`` as an interval that "can cover the rate far less often"; it now says the NaN is
    the single unit's, which its own warning explains."""
    import warnings as _warnings

    from senslab.measure import token_sensitivity as _ts
    from senslab.tokens import Patches as _Patches

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(48, 10))
    x = torch.randn(8, 3, 4, 4, generator=torch.Generator().manual_seed(0))
    with _warnings.catch_warnings(record=True) as caught:
        _warnings.simplefilter("always")
        _ts(model, x, _Patches(2), sigma=3.0, repeats=1, mode="whole", estimand="subset",
            generator=0)
    few = [str(w.message) for w in caught if "rests on few flips" in str(w.message)]
    assert len(few) == 1 and "NaN for a single unit of draws, said apart" in few[0], [
        str(w.message)[:120] for w in caught]
