"""Audit 81 (sharpness and Boolean sensitivity): a positional embedding the default exclude
misses is said; truth_table beyond enumeration names a fix it can take; a model that looks its
bits up as indices is told the wrapper."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from senslab.measure.boolean import boolean_sensitivity, first, truth_table
from senslab.measure.sharpness import loss_sharpness, parameter_norm


class _Positions(nn.Module):
    """Bits through a Linear plus a learned (6, 8) table named ``name``, mean-pooled to a
    scalar."""

    def __init__(self, name: str, extra: str | None = None) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.bit = nn.Linear(1, 8)
        self.table_name = name
        setattr(self, name, nn.Parameter(torch.randn(6, 8, generator=g)))
        if extra is not None:
            setattr(self, extra, nn.Parameter(torch.zeros(3)))
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.bit(x.unsqueeze(-1)) + getattr(self, self.table_name))
        return self.head(h.mean(1)).squeeze(-1)


def _bits(rows: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = 1 - 2 * torch.randint(0, 2, (rows, 6), generator=g).float()
    return x, (x.prod(1) > 0).float()


def _said(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if "look positional" in str(w.message)]


def test_a_positional_embedding_the_default_exclude_misses_is_said() -> None:
    torch.manual_seed(0)
    model = _Positions("abs_pos_embed")
    x, y = _bits()
    # the default "positional" reads whole name components: abs_pos_embed is counted
    plain = parameter_norm(model, exclude=())
    with pytest.warns(UserWarning, match=r"'abs_pos_embed' look positional") as caught:
        assert parameter_norm(model) == plain  # the number is unchanged
    message = _said(caught)[0]
    assert "exclude=('positional', 'abs_pos_embed')" in message and "exclude=()" in message
    with pytest.warns(UserWarning, match="look positional"):
        loss_sharpness(model, F.mse_loss, x, y, draws=3, generator=0)
    # either fix is silent: the entry named, or the exclude without "positional"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kept = parameter_norm(model, exclude=("positional", "abs_pos_embed"))
        parameter_norm(model, exclude=())
        loss_sharpness(model, F.mse_loss, x, y, draws=3, generator=0,
                       exclude=("positional", "abs_pos_embed"))
    assert not _said(caught)
    assert kept < plain


@pytest.mark.parametrize("name, extra", [
    ("pos_embedding", None),  # matched by the rule: excluded, nothing to say
    ("pos_embed", "rel_pos_bias"),  # the rule matched one: the other is left as it is
    ("table", None),  # nothing looks positional
    ("post_table", None),  # "post" is no position
])
def test_nothing_is_said_where_the_rule_matched_or_no_name_looks_positional(
        name: str, extra: str | None) -> None:
    model = _Positions(name, extra)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        parameter_norm(model)
    assert not _said(caught)


def test_camel_case_position_names_are_said() -> None:
    model = _Positions("posEmbed")
    with pytest.warns(UserWarning, match="'posEmbed' look positional"):
        parameter_norm(model)


def test_a_truth_table_beyond_enumeration_names_a_fix_it_can_take() -> None:
    # the error named method='sample', which truth_table does not take
    with pytest.raises(ValueError, match=r"boolean_sensitivity\(f, 23, method='sample'") as err:
        truth_table(first, 23)
    assert "(or 'auto')" not in str(err.value)
    # boolean_sensitivity's own refusal of exact enumeration is unchanged
    with pytest.raises(ValueError, match="method='sample'"):
        boolean_sensitivity(first, 23, method="exact")


class _BitEmbedding(nn.Module):
    """Looks 0/1 bit ids up in an embedding (as a trained bit-token transformer does)."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.embed = nn.Embedding(2, 4)
        self.head = nn.Linear(4, 1)
        with torch.no_grad():
            self.embed.weight.copy_(torch.randn(2, 4, generator=g))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(ids).mean(1)).squeeze(-1)


@pytest.mark.parametrize("dtype, error", [(None, RuntimeError), (torch.long, IndexError)])
def test_a_model_that_looks_its_bits_up_is_told_the_wrapper(dtype: torch.dtype | None,
                                                           error: type) -> None:
    model = _BitEmbedding().eval()
    with pytest.raises(error, match=r"lambda x: model\(\(x < 0\)\.long\(\)\)"):
        boolean_sensitivity(model, 5, dtype=dtype, output="sign")
    with pytest.raises(error, match="used as indices"):
        truth_table(model, 5, dtype=dtype, output="sign")
    # the wrapper the message names measures it
    res = boolean_sensitivity(lambda x: model((x < 0).long()), 5, output="real")
    assert res.method == "exact" and res.num_evaluations == 32 and res.average > 0
