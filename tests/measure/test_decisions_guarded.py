"""Decisions that used to return a silent wrong number (audit numbers51): saturated sigmoid heads,
undeclared probabilities under output='sign', random callables, degree's tolerance, declared
(N, 2) probabilities, 0/1 bits in the reference functions, structured outputs."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from senslab.measure import token_sensitivity
from senslab.measure.boolean import (
    all_inputs,
    boolean_sensitivity,
    degree,
    first,
    majority,
    mean,
    parity,
    random_function,
    sparse_parity,
    truth_table,
)
from senslab.measure.outputs import check_perturbed_kind, inferred_from_zero_one
from senslab.tokens import Sequence


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def sigmoid_head(weight: float, bias: float, n: int = 4) -> nn.Module:
    """Flatten → Linear(n, 1) with every weight ``weight`` → sigmoid: one probability column."""
    lin = nn.Linear(n, 1)
    with torch.no_grad():
        lin.weight.fill_(weight)
        lin.bias.fill_(bias)
    return nn.Sequential(nn.Flatten(), lin, nn.Sigmoid()).eval()


# ------------------------------------------------------------ 1: saturated sigmoid, token-wise


def test_zero_one_helpers():
    """A clean column of exact 0s and 1s is read as logits provisionally; perturbed outputs
    strictly inside (0, 1) then refuse it, hard decisions and logits pass."""
    hard = torch.tensor([[1.0], [0.0], [1.0]])
    assert inferred_from_zero_one(hard, None)
    assert inferred_from_zero_one(torch.ones(4), None)
    assert not inferred_from_zero_one(hard, "logits")  # declared: nothing to confirm
    assert not inferred_from_zero_one(torch.tensor([2.0, -1.0]), None)  # logits
    assert not inferred_from_zero_one(torch.ones(3, 2), None)  # argmax decides
    assert not inferred_from_zero_one(torch.tensor([1, 0]), None)  # integer labels
    with pytest.raises(ValueError, match="exact 0s and 1s.*probabilities or logits.*output_kind"):
        check_perturbed_kind(torch.tensor([[0.99], [1.0]]), True)
    check_perturbed_kind(torch.tensor([[0.0], [1.0]]), True)  # hard decisions again
    check_perturbed_kind(torch.tensor([[0.5], [1.7]]), True)  # outside [0, 1]: logits
    check_perturbed_kind(torch.tensor([[0.5], [0.7]]), False)  # not inferred: not checked


def test_token_sensitivity_refuses_a_sigmoid_saturated_on_every_clean_example():
    """sigmoid(17) is exactly 1.0 in float32, so every clean output is 1.0 and was read as a
    logit: p > 0 never changes, a false 0 (the truth with output_kind='probabilities' is > 0)."""
    model = sigmoid_head(1.0, 17.0)
    x = torch.zeros(16, 4, 1)
    assert model(x).unique().tolist() == [1.0]
    with pytest.raises(ValueError, match="probabilities or logits.*output_kind"):
        token_sensitivity(model, x, Sequence(), sigma=10.0, repeats=4, generator=0,
                          chunk_size=64)
    told = token_sensitivity(model, x, Sequence(), sigma=10.0, repeats=4, generator=0,
                             chunk_size=64, output_kind="probabilities")
    assert told.estimate > 0


class _HardDecision(nn.Module):
    """Exact 0/1 decisions as a float column (a thresholded model)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x.flatten(1).sum(1, keepdim=True) > 0).float()


def test_token_sensitivity_still_measures_hard_decisions():
    """Exact 0s and 1s on the clean and the perturbed inputs: read as logits, flips counted."""
    x = torch.linspace(-1, 1, 16 * 4).reshape(16, 4, 1)
    res = token_sensitivity(_HardDecision(), x, Sequence(), sigma=1.0, repeats=4, generator=0,
                            chunk_size=64)
    assert 0 < res.estimate < 1


# ------------------------------------------------------------ 2: undeclared probabilities


def test_sign_rule_refuses_undeclared_probabilities():
    """A sigmoid head measured with output='sign' at the default boundary 0: every value is
    > 0, the table constant, as = 0. Refused (exact, sampled, truth_table); threshold=0.5 gives
    MAJORITY's 1.875, and a declared kind or an explicit threshold is taken as given."""
    model = sigmoid_head(1.0, 0.0, n=5)
    for call in (lambda: boolean_sensitivity(model, 5, output="sign"),
                 lambda: boolean_sensitivity(model, 5, output="sign", method="sample",
                                             num_samples=50, generator=0),
                 lambda: truth_table(model, 5, output="sign")):
        with pytest.raises(ValueError, match="probabilities or logits.*threshold=0.5"):
            call()
    assert boolean_sensitivity(model, 5, output="sign", threshold=0.5).average == \
        pytest.approx(1.875)
    assert boolean_sensitivity(model, 5, output="sign", threshold=0.0).average == 0.0
    model.output_kind = "probabilities"
    assert boolean_sensitivity(model, 5, output="sign").average == pytest.approx(1.875)
    # hard 0/1 values are no probabilities: still measured at 0, as before
    assert boolean_sensitivity(majority, 5, output="sign").average == pytest.approx(1.875)


def test_threshold_must_be_finite():
    with pytest.raises(ValueError, match="finite"):
        boolean_sensitivity(majority, 5, output="sign", threshold=float("nan"))


# ------------------------------------------------------------ 3: random callables


def _dropout_net(n: int) -> nn.Module:
    net = nn.Sequential(nn.Linear(n, 64), nn.ReLU(), nn.Dropout(0.5), nn.Linear(64, 2))
    with torch.no_grad():
        g = gen(3)
        for p in net.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    return net


def test_a_random_callable_is_refused():
    """Dropout in training mode behind a wrapper: each call gave another as(f). Refused, and so
    is the module itself; in eval mode the same wrapper is measured."""
    n = 6
    net = _dropout_net(n).train()
    with torch.random.fork_rng():
        torch.manual_seed(0)
        for call in (lambda: boolean_sensitivity(lambda x: net(x), n),
                     lambda: boolean_sensitivity(lambda x: net(x), n, method="sample",
                                                 num_samples=20, generator=0),
                     lambda: truth_table(lambda x: net(x), n)):
            with pytest.raises(ValueError, match=r"random.*model\.eval\(\)"):
                call()
        with pytest.warns(UserWarning, match="training mode"), \
                pytest.raises(ValueError, match=r"model\.eval\(\)"):
            boolean_sensitivity(net, n)
    net.eval()
    a = boolean_sensitivity(lambda x: net(x), n).average
    assert a == boolean_sensitivity(net, n).average


def test_the_repeat_check_costs_one_small_batch():
    """A deterministic f is evaluated on its table plus twice on at most 64 strings."""
    rows: list[int] = []

    def f(x: torch.Tensor) -> torch.Tensor:
        rows.append(len(x))
        return parity(x)

    assert boolean_sensitivity(f, 8).average == 8.0
    assert sum(rows) == 256 + 2 * 64


# ------------------------------------------------------------ 7: degree tolerance


def test_degree_is_relative_to_the_table_scale():
    """float32 rounding leaves coefficients of ~1e-9 at every degree of a linear model's table
    (an absolute 1e-9 read it as degree 5 to 10); a function of scale 1e-10 is not constant."""
    n = 10
    lin = nn.Linear(n, 1)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(1, n, generator=gen(0)))
        lin.bias.fill_(0.3)
    table = truth_table(lin.eval(), n, output="real")
    assert degree(table) == 1
    assert degree(truth_table(lin.double(), n, output="real")) == 1
    assert degree(1e-10 * parity(all_inputs(6)).double()) == 6
    assert degree(table, tol=0.0) > 1  # an absolute cut, as asked
    assert degree(table, rtol=1.0) == 0  # no coefficient of a non-constant f exceeds ‖f‖₂
    with pytest.raises(ValueError, match="not both"):
        degree(table, tol=1e-9, rtol=1e-6)
    with pytest.raises(ValueError, match="rtol"):
        degree(table, rtol=-1.0)


def test_degree_keeps_the_smallest_boolean_coefficients():
    """A ±1 function on 21 bits that is −1 at one string has every coefficient ±2¹⁻ⁿ (below
    1e-6): the default cut stays under it, so the degree is 21."""
    n = 21
    table = torch.ones(1 << n, dtype=torch.float64)
    table[-1] = -1.0
    assert degree(table) == n


# ------------------------------------------------------------ 9: declared (N, 2) probabilities


class _Softmax2(nn.Module):
    """MAJORITY as a two-class softmax, declared as probabilities."""

    output_kind = "probabilities"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = (x.sum(1) > 0).float() * 4 - 2
        return torch.stack([-z, z], 1).softmax(1)


def test_declared_probabilities_in_two_columns_are_read_by_argmax():
    """It was refused with 'drop threshold' although no threshold was passed; the argmax
    decides, as in the token-wise estimator. A threshold the caller gives is still refused."""
    model = _Softmax2().eval()
    want = boolean_sensitivity(majority, 5).average
    for output in ("auto", "sign"):
        assert boolean_sensitivity(model, 5, output=output).average == pytest.approx(want)
    assert torch.equal(truth_table(model, 5), truth_table(majority, 5))
    with pytest.raises(ValueError, match="class labels.*drop threshold"):
        boolean_sensitivity(model, 5, threshold=0.5)


# ------------------------------------------------------------ 10: reference functions


@pytest.mark.parametrize("f", [parity, majority, first, mean, sparse_parity([0, 1])])
def test_reference_functions_refuse_zero_one_bits(f):
    """On 0/1 bits parity computed AND and majority OR, silently."""
    x01 = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    with pytest.raises(ValueError, match="±1 strings.*1 − 2·x"):
        f(x01)
    assert f(1 - 2 * x01).shape == (2,)


def test_random_function_takes_an_int_seed():
    assert torch.equal(random_function(5, 3), random_function(5, gen(3)))
    with pytest.raises(TypeError, match="torch.Generator or an int seed"):
        random_function(5, "3")  # type: ignore[arg-type]


# ------------------------------------------------------------ 11: structured outputs


class _Pair(nn.Module):
    """(features, logits), as many models return."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(5, 2)
        with torch.no_grad():
            self.lin.weight.copy_(torch.randn(2, 5, generator=gen(1)))
            self.lin.bias.copy_(torch.randn(2, generator=gen(2)))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x, self.lin(x)


class _Dict(_Pair):
    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:  # type: ignore[override]
        return {"logits": self.lin(x)}


def test_structured_outputs():
    """A (features, logits) pair failed inside torch.as_tensor; it is refused with the fix,
    and a {'logits': …} dict is read as the token-wise estimator reads it."""
    pair = _Pair().eval()
    with pytest.raises(TypeError, match=r"tuple.*lambda x: model\(x\)\[1\]"):
        boolean_sensitivity(pair, 5)
    want = boolean_sensitivity(lambda x: pair(x)[1], 5).average
    assert boolean_sensitivity(_Dict().eval(), 5).average == want


def test_declared_probabilities_outside_the_unit_interval_are_refused():
    """As the token-wise path refuses it: a column declared probabilities that leaves [0, 1]
    is not one, and reading it at 1/2 would count other changes."""
    from senslab.measure import boolean_sensitivity, truth_table

    class Logit(torch.nn.Module):
        output_kind = "probabilities"

        def forward(self, x):
            return x.sum(1, keepdim=True)  # ranges over [-4, 4]

    with pytest.raises(ValueError, match="outside \\[0, 1\\]"):
        boolean_sensitivity(Logit(), 4)
    with pytest.raises(ValueError, match="outside \\[0, 1\\]"):
        truth_table(Logit(), 4)


def test_a_threshold_outside_the_unit_interval_on_declared_probabilities_is_refused():
    """threshold=0.0 was the default before None: on a declared probability column it would
    count nothing (every p > 0), so it is refused rather than giving a false 0."""
    from senslab.measure import boolean_sensitivity

    class Prob(torch.nn.Module):
        output_kind = "probabilities"

        def forward(self, x):
            return torch.sigmoid(x.sum(1, keepdim=True))

    assert boolean_sensitivity(Prob(), 5).average == pytest.approx(1.875)  # majority's
    for t in (0.0, 1.0, -0.5):
        with pytest.raises(ValueError, match="outside \\(0, 1\\)"):
            boolean_sensitivity(Prob(), 5, threshold=t)
    assert boolean_sensitivity(Prob(), 5, threshold=0.5).average == pytest.approx(1.875)


def test_a_column_of_exact_zeros_is_a_logit_head_measured_not_refused():
    """Clean outputs all exactly 0 (a ReLU'd or zero-initialised logit head) are no saturated
    sigmoid (float32's sigmoid reaches 0.0 only past a logit of about −103): perturbed values
    inside (0, 1) are logits that moved, measured by the token-wise estimator and by ShPred."""
    from senslab import Patches, token_sensitivity
    from senslab.measure.sharpness import output_sharpness

    g = torch.Generator().manual_seed(0)
    lin = torch.nn.Linear(16, 1)
    model = torch.nn.Sequential(torch.nn.Flatten(), lin, torch.nn.ReLU())
    with torch.no_grad():
        lin.weight.fill_(0.05)
        lin.bias.fill_(-0.5)  # pixels in [0, 1]: every clean logit below 0, ReLU'd to 0.0
    x = torch.rand(6, 1, 4, 4, generator=g)
    assert (model(x) == 0).all()
    r = token_sensitivity(model, x, Patches(2), sigma=1.0, repeats=4, generator=1,
                          chunk_size=64)
    assert r.estimate > 0  # some copies rise above 0: class changes, counted
    with torch.no_grad():
        lin.weight.zero_()
        lin.bias.zero_()  # a zero-initialised head: weight noise moves it off 0
    s = output_sharpness(model, x[:1], sigma_w=0.05, repeats=5, generator=1)
    assert s.shpred is not None and s.shpred.estimate > 0
