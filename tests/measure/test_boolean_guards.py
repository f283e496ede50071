"""Guards of ``boolean_sensitivity`` against forwards that depend on their batch (BatchNorm in
training mode), against changing the model it measures, and the warning when ``output="auto"``
reads a model's one real column as a real-valued function (audit 53, D2 and S1)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from senslab.measure.boolean import boolean_sensitivity, truth_table
from senslab.measure.fourier import degree


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def bn_mlp(n: int = 10) -> nn.Sequential:
    """Linear → BatchNorm1d → ReLU → Linear(2), with running statistics of its own."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(n, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2))
    with torch.no_grad():
        for _ in range(5):
            m(torch.randn(64, n, generator=gen(1)) * 3 + 1)
    return m


def buffers(m: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in m.named_buffers()}


def same_buffers(m: nn.Module, saved: dict[str, torch.Tensor]) -> bool:
    now = dict(m.named_buffers())
    return now.keys() == saved.keys() and all(torch.equal(now[k], v) for k, v in saved.items())


# ----------------------------------------------------------------- batch dependence (D2)


def test_train_mode_batchnorm_behind_a_wrapper_is_refused_and_the_model_kept():
    """It gave 0.1211 at the default chunk and 0.3125 at chunk_size=64 (eval mode: 0.3633),
    without a word, and updated running_mean. Now the one-forward-vs-two-halves check refuses
    it, naming the cause and model.eval(), and the buffers are as they were."""
    n = 10
    m = bn_mlp(n).train()
    saved = buffers(m)
    calls = (lambda: boolean_sensitivity(lambda x: m(x), n, method="exact"),
             lambda: boolean_sensitivity(lambda x: m(x), n, method="exact", chunk_size=64),
             lambda: boolean_sensitivity(lambda x: m(x), n, method="sample", num_samples=300,
                                         generator=0),
             lambda: truth_table(lambda x: m(x), n))
    for call in calls:
        with pytest.raises(ValueError, match=r"depends on the other strings.*two halves"
                                             r".*BatchNorm in training.*model\.eval\(\)"):
            call()
        assert same_buffers(m, saved)
    m.eval()
    truth = boolean_sensitivity(lambda x: m(x), n, method="exact")
    assert boolean_sensitivity(m, n, method="exact", chunk_size=64).average == truth.average
    assert same_buffers(m, saved)


def test_train_mode_batchnorm_in_the_module_is_refused_before_any_forward():
    """The module itself got only a UserWarning and the chunk-dependent number. Refused now,
    before a forward (nothing updated); BatchNorm without running statistics normalises by
    the batch in eval mode too, and is refused as well."""
    n = 10
    m = bn_mlp(n).train()
    saved, forwards = buffers(m), []
    m.register_forward_hook(lambda *_: forwards.append(1))
    for call in (lambda: boolean_sensitivity(m, n), lambda: truth_table(m, n),
                 lambda: boolean_sensitivity(m, 40, num_samples=50)):
        with pytest.raises(ValueError, match=r"BatchNorm.*\('1': training mode.*chunk_size"
                                             r".*model\.eval\(\)"):
            call()
    assert not forwards and same_buffers(m, saved)
    stateless = nn.Sequential(nn.Linear(n, 8), nn.BatchNorm1d(8, track_running_stats=False),
                              nn.Linear(8, 1)).eval()
    with pytest.raises(ValueError, match="track_running_stats=False.*running statistics"):
        boolean_sensitivity(stateless, n, output="sign")


def test_a_batch_normalised_function_is_refused():
    """No module and no BatchNorm: a function that centres on its batch's mean."""
    w = torch.randn(30, generator=gen(5))

    def f(x: torch.Tensor) -> torch.Tensor:
        z = x @ w[: x.shape[1]]
        return z - z.mean()

    with pytest.raises(ValueError, match="depends on the other strings"):
        boolean_sensitivity(f, 6, output="sign")
    with pytest.raises(ValueError, match="depends on the other strings"):
        boolean_sensitivity(f, 30, method="sample", num_samples=50, output="real")


def test_dropout_is_still_named_as_randomness():
    """The extra forward that follows a failed halves check tells randomness apart."""
    n = 6
    net = nn.Sequential(nn.Linear(n, 32), nn.ReLU(), nn.Dropout(0.5), nn.Linear(32, 2)).train()
    with torch.random.fork_rng():
        torch.manual_seed(0)
        with pytest.raises(ValueError, match=r"f is random.*model\.eval\(\)"):
            boolean_sensitivity(lambda x: net(x), n)


class _Counting(nn.Module):
    """Deterministic output; its forward updates one buffer in place and replaces another."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.lin = nn.Linear(n, 1)
        self.register_buffer("seen", torch.zeros(()))
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen += len(x)
        self.calls = self.calls + 1
        return self.lin(x)


def test_the_buffers_of_the_model_are_kept():
    """Each forward counted into the buffers; the module, a lambda over it and a bound method
    leave them as they were, and the original tensor objects stay in place."""
    n = 5
    m = _Counting(n).eval()
    seen, calls = m.seen, m.calls
    for f in (m, lambda x: m(x), m.forward):
        for method in ("exact", "sample"):
            boolean_sensitivity(f, n, method=method, output="sign", num_samples=20)
        truth_table(f, n, output="sign")
        assert m.seen is seen and m.calls is calls
        assert float(m.seen) == 0.0 and float(m.calls) == 0.0


def test_ordinary_models_pass_and_keep_their_numbers():
    """An eval-mode MLP: the same number at every chunk size, through a wrapper, as its table;
    the checks cost one forward of at most 64 strings and two halves of it."""
    n = 7
    m = bn_mlp(n).eval()
    rows: list[int] = []

    def f(x: torch.Tensor) -> torch.Tensor:
        rows.append(len(x))
        return m(x)

    ref = boolean_sensitivity(f, n)
    assert sum(rows) == 2**n + 2 * 64
    for chunk in (3, 64, 1000):
        assert boolean_sensitivity(m, n, chunk_size=chunk).average == ref.average
    assert boolean_sensitivity(truth_table(m, n)).average == ref.average


# ----------------------------------------------------------------- one real column (S1)


def _logit_mlp(n: int = 8) -> nn.Module:
    m = nn.Sequential(nn.Linear(n, 16), nn.Tanh(), nn.Linear(16, 1))
    with torch.no_grad():
        for p in m.parameters():  # of the size of PyTorch's default initialisation
            p.copy_(torch.randn(p.shape, generator=gen(0)) / p.shape[-1] ** 0.5)
        m[2].bias.zero_()  # a boundary the strings cross
    return m.eval()


def test_auto_reading_a_model_column_as_real_warns_without_changing_the_number():
    """A (N, 1) logit came out as 'real' (squared change / 4), far below its flip count, with
    no word; token_sensitivity reads the column as a logit. The number stays, with a warning
    naming output='sign' and output='real'."""
    n = 8
    m = _logit_mlp(n)
    real = boolean_sensitivity(m, n, output="real")
    sign = boolean_sensitivity(m, n, output="sign")
    assert real.average < sign.average / 4  # 0.287 against 1.3125 class changes
    for f in (m, lambda x: m(x)):
        for method in ("exact", "sample"):
            with pytest.warns(UserWarning, match=r"real-valued.*output='sign'.*output='real'"):
                r = boolean_sensitivity(f, n, method=method, num_samples=100)
            assert r.output == "real"
        with pytest.warns(UserWarning, match="real-valued"):
            assert boolean_sensitivity(f, n).average == real.average


def test_a_wrapper_that_hides_a_declared_kind_is_named():
    """The model declares logits and is counted by class; ``lambda x: model(x)`` declares
    nothing and got the 'real' number silently (the zoo's Boolean transformer: 1.0 vs 0.58)."""
    n = 8
    inner = _logit_mlp(n)

    class Declared(nn.Module):
        output_kind = "logits"

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return inner(x)

    m = Declared().eval()
    assert boolean_sensitivity(m, n).output == "sign"
    with pytest.warns(UserWarning, match="declares output_kind='logits', which the wrapper hides"):
        r = boolean_sensitivity(lambda x: m(x), n)
    assert r.average == boolean_sensitivity(m, n, output="real").average


def test_no_warning_where_the_rule_is_said_or_the_function_is_real():
    from senslab.measure.functions import mean

    n = 8
    m = _logit_mlp(n)

    class Declared(nn.Module):
        output_kind = "logits"

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return m(x)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        boolean_sensitivity(m, n, output="real")
        boolean_sensitivity(m, n, output="sign")
        assert boolean_sensitivity(Declared().eval(), n).output == "sign"
        assert boolean_sensitivity(mean, n).output == "real"  # a plain real-valued function
        boolean_sensitivity(truth_table(m, n, output="real"))  # a table says what it holds


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_real_table_of_reduced_precision_outputs_warns_that_degree_needs_rtol(dtype):
    """truth_table returns float64, so degree() could not tell that a bf16 linear model's table
    carries bf16 rounding: read with the default rtol, degree 10 for a degree-1 function."""
    model = nn.Linear(10, 1).to(dtype).eval()
    with pytest.warns(UserWarning, match=r"significant bits(?s:.*)degree\(table, rtol=1e-2\)"):
        table = truth_table(model, 10, output="real")
    assert table.dtype == torch.float64
    assert degree(table) > 1 and degree(table, rtol=1e-2) == 1


def test_a_float32_real_table_does_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        table = truth_table(nn.Linear(6, 1).eval(), 6, output="real")
    assert degree(table) == 1


def test_exact_bf16_outputs_do_not_warn():
    """x0·x1 is exact in bf16: its degree reads 2 at any rtol, so nothing to warn about."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        table = truth_table(lambda x: (x[:, 0] * x[:, 1]).bfloat16(), 6, output="real")
    assert degree(table) == 2


def test_a_model_of_another_input_width_is_named_by_n():
    with pytest.raises(RuntimeError, match=r"strings of n=6(?s:.*)input width"):
        boolean_sensitivity(nn.Linear(5, 1).eval(), 6, output="sign")


def test_a_correlation_of_the_wrong_type_is_named():
    from senslab.measure.fourier import noise_stability
    with pytest.raises(TypeError, match="rho is a correlation: pass a number"):
        noise_stability(truth_table(nn.Linear(4, 1).eval(), 4, output="sign"), "a")
