r"""Low-precision forwards with float32's decisions: ``precision="bf16-checked"`` (bf16
autocast) and ``precision="int8-checked"`` (on a CPU, the model's linear layers as int8
products, or a convolutional model's static int8 copy; :mod:`._int8`), chosen by ``"auto"``
where the hardware runs them measurably faster (the static copy on large batches only).

A perturbed copy is evaluated in the low precision; its class is read from that output unless
the output is close to a class boundary, where rounding could put it on the other side, and
then the copy is evaluated again in float32 and float32's class is used. The rule and the
calibration below are written for bf16 (:math:`m_{16}`); int8 follows them word for word, with
its own, larger, bound.

**Rule.** Let :math:`c` be the class the bf16 output predicts and :math:`m_{16}` its margin in
the output's own units (:func:`~senslab.measure.outputs.margins`: the top logit minus the
runner-up, or the distance of one column to its threshold; :math:`m_{16} \ge 0`). Float32
predicts the same class whenever the float32 margin of :math:`c`, :math:`m_{32}`, is positive,
i.e. whenever :math:`|m_{16} - m_{32}| < m_{16}`. The copy is re-evaluated in float32 iff

.. math::

    m_{16} \le b \cdot \max(1,\; s / S) \cdot w,

:math:`s` the copy's largest absolute output, :math:`S` the largest finite one seen during
calibration, over the copies :math:`b` is calibrated on (rounding errors grow with the size of
the values, so copies with larger outputs than any calibrated one get a proportionally wider
band; a class masked with ``-inf`` on some copies made :math:`S` infinite, and no band wider),
and :math:`w \ge 1` the widening for inputs larger than the calibration's
(:meth:`PrecisionCheck._widening`): the calibration records, for
every call whose error grows with its inputs' size (:class:`_Ranges`: bf16's products, int8's
linear layers, a static int8 copy's hand-overs to int8), the sizes that error grows with —
the largest absolute value of its inputs (a static copy: per copy, that alone), their root
mean square (errors summed over many values) and their range (max − min; for int8's linear
layers the quantisation range, which includes 0) — and a chunk whose sizes exceed those gets a
band wider by the largest ratio: a normalisation layer can hide larger values before it from the
output, and a model can cancel a constant shift of its inputs (first-layer weight rows summing
to 0), which leaves the range and the output as they were while bf16's rounding and int8's
quantisation step grow with the shift. A model with a discontinuity inside (a hard router, an
``argmax`` between layers) can change it under the low precision on rare copies with an error
of any size, which no calibration bounds: docs/definitions.md says to measure such models in
float32.

**Calibration** (per metric, so per model). No rigorous bound on bf16's error exists for a deep
network, so :math:`b` is measured: the first :data:`CALIBRATION_COPIES` perturbed copies (and up
to :data:`CALIBRATION_CLEAN` clean examples of the first batch) are evaluated in both precisions
and :math:`b = ` :data:`SAFETY` :math:`\times \max_i \delta_i`, with
:math:`\delta_i = \max_{c \in \{c_{16}, c_{32}\}} |m_{16}(c) - m_{32}(c)|` the change of the
margin of either precision's class. The calibration copies are decided in float32 (their bf16
values only serve the calibration), so nothing is decided before :math:`b` is known; a batch
with fewer copies continues the calibration into the next ``update``, and a model whose
parameters or buffers changed since the last batch (a training step) calibrates afresh. A copy
whose low-precision output holds a NaN or an infinity is always re-checked and left out of
:math:`\max_i \delta_i`. The converse, a copy whose float32 output decides nothing (a NaN,
which a float32 run refuses) while its low-precision one is finite and away from a boundary,
shows only where the copy is evaluated in float32 (calibration, re-check, spot check): there
it is refused as float32 refuses it, and a spot check that finds one re-checks every later copy
in float32 (``check_bound`` inf, said once); copies never evaluated in float32 cannot show it.
A calibration in which the low precision ran (a bf16 product, an int8 layer) yet changed no
margin at all bounds nothing: the outputs are constant, discrete (a step
``(z > 0).float()``, a one-hot argmax) or saturated, where the error is invisible or a jump, so
the copies run in float32 from then on, said once (:meth:`PrecisionCheck._unchanged`). The
bound is empirical — a safety factor over the worst error seen, not a proof — and the tests
check it where it matters: the flips equal float32's, copy by copy, on the zoo and on trained
Hugging Face models where plain bf16 changes some.

**Spot checks.** The calibration sees only the first copies; later ones can differ from them in
a way no widening sees (a linear model whose first batch uses input features with small
weights and whose later batches use large weights that cancel: bf16's error there was ten
times the bound, and 542 of 5,120 copies took bf16's class). So the bound is verified as it is
used: in every checked call, :data:`SPOT_SHARE` of the copies outside the band (at least
:data:`SPOT_MIN`) is also evaluated in float32, chosen by a generator of the check's own
(:data:`SPOT_SEED`: the noise stream and the numbers never move). Where a spot-checked copy's
margin changed by more than its band / :data:`SAFETY` (the calibration's premise), or its
class changed, :math:`b` becomes :data:`SAFETY` times that change (per unit of widening), the
call's copies inside the wider band are re-checked, and new copies outside it are
spot-checked, until a spot check passes: the call's decisions are float32's and later calls
use the wider bound (``check_bound``; :attr:`PrecisionCheck.calibrated` keeps the calibrated
one). A change beyond the band itself, where copies outside it could have taken the low
precision's class, is said once (a ``RuntimeWarning``); a smaller one, which the safety factor
absorbed, continues the calibration silently. Calls already returned are not revisited: a
shift in the copies is caught in the first call whose spot checks draw a shifted copy.

**Cost.** ``num_forward`` counts every copy once (its bf16 forward); ``num_forward_fp32`` counts
the float32 re-evaluations (calibration and spot checks included), and ``recheck_fraction`` is
their share of the copies that ran checked, the calibration's among them (evaluated in both).
Where the calibration sends every copy to float32 before any runs checked (no gain under
``"auto"``, no margin changed, a failed static int8 copy), its copies are taken back from the
checked ones: ``recheck_fraction`` is None, not the calibration's 100%, and
``num_forward_fp32`` counts the calibration's float32 forwards.
Clean examples are evaluated in float32 (their prediction is the reference every flip is
measured against). The models' clean caches of prefix and local reuse
are computed in float32, as in a float32 run, so a re-checked copy is computed as float32 would.

**Automatic choice** (``precision="auto"``, the default). Checked bf16 runs where it pays: float32
weights of an ``nn.Module``, ``compare="class"``, and a device with native bf16 matrix units — a
CUDA GPU of compute capability ≥ 8.0, or a CPU with AVX-512 BF16 or AMX whose bf16 matrix product
is measured (once per process and thread count) at least :data:`MIN_SPEEDUP` × float32's. The
flags alone are not enough: on a 2-core Xeon VM reporting AVX-512 BF16 (no AMX) a 512³ bf16 product
ran at half float32's speed. Where bf16 does not pay, checked int8 runs on a CPU whose int8
linear layer (512³) is measured at least :data:`MIN_SPEEDUP` × float32's (AVX-512 VNNI runs
it several times faster). Elsewhere every forward runs in the model's own precision.

**Whether checking pays** (``"auto"`` on a CPU). A product measured faster does not make a
checked copy cheaper: the copies near a boundary are evaluated twice, and int8's error, far
larger than bf16's, widens the bound (on a real BERT most copies fell inside it:
docs/benchmarks.md, checked int8). So the calibration also times both
precisions, per copy, and ``"auto"`` goes back to float32 for the rest of the metric's life
(until ``reset``) unless a low-precision copy plus the predicted re-checked share of a float32
one costs at most ``1 / MIN_SPEEDUP`` of a float32 copy. It judges from :data:`JUDGE_AFTER`
calibration copies on: the share under the bound measured so far is a lower bound of the final
share, so a loss seen early is a loss at the end. The calibration copies are the first batch's
first few examples, so it judges again once :data:`CALIBRATION_COPIES` copies have run checked,
from their measured re-checked share and times, and goes back to float32 then where checking
turned out a loss. An explicit ``"bf16-checked"`` or ``"int8-checked"`` always runs checked.
"""

from __future__ import annotations

import functools
import math
import time
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from itertools import zip_longest
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.overrides import TorchFunctionMode

from .._autocast import autocast_dtype, autocast_on
from ..tokens.base import model_dtype
from . import _int8, _trim
from .outputs import margins, predictions

Precision = Literal["auto", "float32", "bf16-checked", "int8-checked"]
PRECISIONS: tuple[str, ...] = ("auto", "float32", "bf16-checked", "int8-checked")

#: perturbed copies evaluated in both precisions before the bound is fixed
CALIBRATION_COPIES = 256
#: clean examples of the first batch also evaluated in bf16 for the calibration
CALIBRATION_CLEAN = 64
#: the bound is this many times the largest margin change seen in the calibration
SAFETY = 4.0
#: past the calibration, this share of the copies outside the band (at least
#: :data:`SPOT_MIN` a call) is also evaluated in float32 to verify the bound
#: (:meth:`PrecisionCheck._checked`)
SPOT_SHARE = 1 / 64
SPOT_MIN = 2
#: seed of the spot checks' own generator (the noise stream never sees it)
SPOT_SEED = 0x5EED
#: ``"auto"`` picks a checked precision on a CPU only if its matrix products run this much
#: faster, and keeps checking only while the calibration predicts copies this much cheaper
MIN_SPEEDUP = 1.2
#: calibration copies after which ``"auto"`` may stop checking early (:meth:`PrecisionCheck._judge`)
JUDGE_AFTER = 32
#: a copy whose value at a static int8 copy's hand-over to int8 exceeds the calibrated largest
#: by this factor is re-checked whatever its margin (:meth:`PrecisionCheck._widening`)
STATIC_CLAMP = 1.5
#: ``"auto"`` tries a convolutional model's static int8 copy only on a batch of at least this
#: many perturbed copies: quantising the copy costs a few hundred whole forwards and FX's
#: graph passes, negligible beside this many copies and not worth it on small batches
AUTO_STATIC_COPIES = 16_384
#: ``"auto"`` builds that copy, for copies that would reuse the clean computation in float32
#: (local reuse), only where the int8 linear layer measured at least this many times float32's
#: speed: the static copy runs whole forwards, local reuse a part of one (ResNet-18 on 32×32:
#: 1.55× fewer FLOPs), so int8 must beat that and still gain :data:`MIN_SPEEDUP` (on an AVX2
#: CPU without VNNI, int8 at 1.4–1.5×, the static copy cost as much per copy as local reuse's
#: float32 one)
STATIC_OVER_LOCAL = 2.0


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` multiplies bf16 matrices in hardware: a CPU with AVX-512 BF16 or AMX
    (and a torch whose kernels use AVX-512), a CUDA GPU of compute capability ≥ 8.0."""
    if device.type == "cuda":
        return (torch.cuda.is_bf16_supported()
                and torch.cuda.get_device_capability(device) >= (8, 0))
    if device.type == "cpu":
        if torch.backends.cpu.get_cpu_capability() not in ("AVX512", "AVX512_BF16", "AMX"):
            return False
        return bool({"avx512_bf16", "amx_bf16"} & _int8.cpu_flags())
    return False


def _reduced_float32(chain: tuple[str, ...], legacy: str, new_api: bool) -> str | None:
    """The reduced precision (``"tf32"``, ``"bf16"``) PyTorch's settings give float32 work of
    one kind, or None for IEEE float32. ``chain``: the ``fp32_precision`` settings from the most
    specific to the global one (``"none"`` defers to the next; ``new_api``: PyTorch ≥ 2.9),
    ``legacy``: the ``allow_tf32`` flag older releases have."""
    if new_api:
        for name in chain:
            value = str(getattr(_attr(name), "fp32_precision", "none"))
            if value != "none":
                return None if value == "ieee" else value
        return None
    module, _, flag = legacy.rpartition(".")
    return "tf32" if getattr(_attr(module), flag, False) else None


def _has_new_api(chain: tuple[str, ...]) -> bool:
    """Whether this PyTorch has the ``fp32_precision`` settings (2.9 and later)."""
    try:
        return hasattr(_attr(chain[0]), "fp32_precision")
    except RuntimeError:  # it has them, and refuses to read a mix of them and the legacy ones
        return True


def _attr(path: str) -> Any:
    obj: Any = torch
    for part in path.split(".")[1:]:
        obj = getattr(obj, part, None)
    return obj


def reduced_float32(model: Any, device: torch.device) -> list[str]:
    """Where ``model``'s float32 forwards on ``device`` would not run in IEEE float32 under the
    current PyTorch settings: on a CUDA device, cuBLAS matrix products and cuDNN convolutions
    and recurrent layers may run in TF32 (cuDNN convolutions do by default) or bf16. Each entry
    names the kind of layer, the precision and the setting that restores float32."""
    if device.type != "cuda":
        return []
    modules = list(model.modules()) if isinstance(model, torch.nn.Module) else []
    found = []
    kinds = [("matrix products", ("torch.backends.cuda.matmul", "torch.backends.cuda",
                                  "torch.backends"), "torch.backends.cuda.matmul.allow_tf32")]
    if any(isinstance(m, torch.nn.modules.conv._ConvNd) for m in modules):
        kinds.append(("convolutions", ("torch.backends.cudnn.conv", "torch.backends.cudnn",
                                       "torch.backends"), "torch.backends.cudnn.allow_tf32"))
    if any(isinstance(m, torch.nn.RNNBase) for m in modules):
        kinds.append(("recurrent layers", ("torch.backends.cudnn.rnn", "torch.backends.cudnn",
                                           "torch.backends"), "torch.backends.cudnn.allow_tf32"))
    for what, chain, legacy in kinds:
        new_api = _has_new_api(chain)
        try:
            low = _reduced_float32(chain, legacy, new_api)
        except RuntimeError:  # a mix of PyTorch's legacy and new settings: cannot tell
            low = "an undetermined reduced precision"
        if low is not None:
            setting = f"{chain[0]}.fp32_precision = 'ieee'" if new_api else f"{legacy} = False"
            found.append(f"{what} in {low} (set {setting})")
    return found


def _clock(device: torch.device) -> float:
    """The host clock once ``device``'s queued work is done: GPU kernels run asynchronously, so
    a clock read right after launching them times the launch, not the work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _speedup(runs: dict[str, Callable[[], Any]]) -> float:
    """Best time of ``runs["float32"]`` over best time of ``runs["low"]`` (interleaved rounds,
    each after a warm-up call for kernel selection)."""
    best = dict.fromkeys(runs, float("inf"))
    with torch.inference_mode():
        for _ in range(3):
            for name, run in runs.items():
                run()
                start = time.perf_counter()
                for _ in range(4):
                    run()
                best[name] = min(best[name], time.perf_counter() - start)
    return best["float32"] / best["low"]


@functools.cache
def _bf16_gemm_speedup(threads: int) -> float:
    """Measured bf16 / float32 throughput of a 512³ matrix product on this CPU (cached per
    thread count). CPUs that report AVX-512 BF16 do not all run bf16 faster: on one 2-core
    Xeon VM bf16 ran at half float32's speed."""
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(512, 512, generator=gen), torch.randn(512, 512, generator=gen)
    a16, b16 = a.bfloat16(), b.bfloat16()
    return _speedup({"float32": lambda: a @ b, "low": lambda: a16 @ b16})


@functools.cache
def _int8_gemm_speedup(threads: int) -> float:
    """Measured int8 / float32 throughput of a 512 × 512 × 512 linear layer on this CPU
    (:mod:`._int8`; cached per thread count); 0 where the kernels are missing."""
    if not _int8.available():
        return 0.0
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(512, 512, generator=gen), torch.randn(512, 512, generator=gen)
    packed = _int8.pack(w, None)
    return _speedup({"float32": lambda: torch.nn.functional.linear(x, w),
                     "low": lambda: torch.ops.quantized.linear_dynamic(
                         x, packed, _int8.reduce_range())})


def bf16_pays(device: torch.device) -> bool:
    """``precision="auto"``'s test: native bf16 matrix units (:func:`native_bf16`) and, on a
    CPU, a bf16 matrix product measured at least :data:`MIN_SPEEDUP` × float32's."""
    if not native_bf16(device):
        return False
    return device.type != "cpu" or _bf16_gemm_speedup(torch.get_num_threads()) >= MIN_SPEEDUP


def int8_pays(device: torch.device) -> bool:
    """``precision="auto"``'s second test, where bf16 does not pay: a CPU whose int8 linear
    layer (:mod:`._int8`) is measured at least :data:`MIN_SPEEDUP` × float32's."""
    return device.type == "cpu" and _int8_gemm_speedup(torch.get_num_threads()) >= MIN_SPEEDUP


def auto_precision(device: torch.device) -> tuple[str, bool] | None:
    """The low precision ``"auto"`` checks on ``device`` (``"bf16"`` or ``"int8"``) and
    whether its calibration judges the gain (on a CPU, where the forwards are timed
    synchronously), or None."""
    judge = device.type == "cpu"
    if bf16_pays(device):
        return "bf16", judge
    if int8_pays(device):
        return "int8", judge
    return None


def check_precision(precision: Any, autocast: Any, compare: str) -> None:
    """Validate ``precision`` against the other options (an error names the fix)."""
    if precision not in PRECISIONS:
        raise ValueError(
            "precision must be 'auto', 'float32', 'bf16-checked' or 'int8-checked', "
            f"got {precision!r}"
        )
    if precision != "auto" and autocast is not None:
        raise ValueError(
            f"autocast={autocast} runs every forward in low precision and keeps its decisions; "
            f"precision={precision!r} contradicts it. Pass one of them: autocast=torch.bfloat16 "
            "(bf16's own decisions) or precision='bf16-checked' (float32's decisions)"
        )
    if precision in ("bf16-checked", "int8-checked") and compare != "class":
        raise ValueError(
            f"precision={precision!r} keeps float32's class decisions; compare={compare!r} "
            "measures output distances, which low precision would change — use "
            "precision='float32' or autocast=torch.bfloat16"
        )


def checked(metric: Any, device: torch.device, clean: Tensor) -> tuple[str, bool] | None:
    """The low precision this batch's copies run in and are checked against float32
    (``"bf16"`` or ``"int8"``) and whether its calibration judges the gain (under ``"auto"``
    on a CPU, :meth:`PrecisionCheck.use`), or None: float32 (or the model's own precision). Checked
    precision is asked for (or ``"auto"`` finds one that pays here), class decisions are read
    from a floating output, and the weights are float32 (a float64 model keeps its own
    precision; ``"auto"`` also leaves plain callables alone)."""
    if metric.precision == "float32" or metric.autocast is not None:
        return None
    if metric.compare != "class" or not clean.is_floating_point():
        return None
    dtype = model_dtype(metric.model)
    if metric.precision == "auto":
        return auto_precision(device) if dtype == torch.float32 else None
    if dtype not in (None, torch.float32):
        # asked at every batch: said once per metric and dtype (``metric._once``)
        if metric._once(f"precision with {dtype} weights"):
            warnings.warn(
                f"precision={metric.precision!r} checks a lower precision against float32, but "
                f"the model's weights are {dtype}: its forwards, and its decisions, run in "
                f"{dtype} as they are (pass precision='float32' to say so, or convert the model "
                "with model.float() for float32's decisions)",
                RuntimeWarning, stacklevel=_trim._user_level())
        return None
    if metric.precision == "int8-checked":
        if device.type != "cpu":
            raise ValueError(
                f"precision='int8-checked' runs int8 matrix products on the CPU; the model is "
                f"on {device.type}. Use precision='bf16-checked' there"
            )
        if not _int8.available():
            raise RuntimeError(
                "precision='int8-checked' needs torch's x86 quantised linear kernels (fbgemm), "
                "which this torch build lacks; use precision='float32'"
            )
        return "int8", False
    return "bf16", False


#: recurrent layers (``nn.LSTM``, ``nn.GRU``, ``nn.RNN``) and their cells: autocast runs their
#: input and hidden products in bf16 inside one call (a GRU's output even stays float32);
#: unsized, a later example shifted by 64 before a GRU kept the calibration's band and 8 of
#: 2,048 copies took bf16's class without a word (:func:`_recurrent_factors`)
_RNNS = (torch.lstm, torch.gru, torch.rnn_tanh, torch.rnn_relu)
_RNN_CELLS = (torch.lstm_cell, torch.gru_cell, torch.rnn_tanh_cell, torch.rnn_relu_cell)
#: the products whose inputs' sizes bf16's check records (:class:`_Ranges`): autocast runs
#: them in bf16, and their rounding error grows with their inputs' size
_PRODUCTS = frozenset({
    F.linear, F.bilinear, F.conv1d, F.conv2d, F.conv3d, F.conv_transpose1d, F.conv_transpose2d,
    F.conv_transpose3d, F.scaled_dot_product_attention, torch.matmul, torch.mm, torch.bmm,
    torch.addmm, torch.baddbmm, torch.addbmm, torch.einsum, Tensor.matmul, Tensor.__matmul__,
    Tensor.__rmatmul__, Tensor.mm, Tensor.bmm, Tensor.addmm, Tensor.baddbmm, Tensor.addbmm,
    # the rest of autocast's bf16 list (CPU: prelu, conv_tbc, linalg_vecdot, and linalg.matmul
    # and the composites tensordot, inner and multi_dot, whose products inside this mode cannot
    # see; CUDA also mv, addmv, addr, chain_matmul): unsized, a later chunk with larger inputs
    # to one of them kept the calibration's band (a tensordot's shifted example took bf16's
    # class on 16 copies)
    torch.linalg.matmul, torch.tensordot, torch.inner, Tensor.inner, torch.linalg.vecdot,
    torch.linalg.multi_dot, torch.chain_matmul, F.prelu, Tensor.prelu, F.conv_tbc, torch.mv,
    Tensor.mv, torch.addmv, Tensor.addmv, torch.addr, Tensor.addr,
    *_RNNS, *_RNN_CELLS,
})
#: products whose every tensor argument is a factor (an operand list, not input and weight)
_ALL_FACTORS = frozenset({torch.einsum, torch.linalg.multi_dot, torch.chain_matmul})
#: products of the form ``input + a @ b``: the factors are the second and third arguments (the
#: first, the added term, is not multiplied: BLOOM's ``alibi.baddbmm(query, key)``)
_ADDED = {torch.addmm: ("mat1", "mat2"), Tensor.addmm: ("mat1", "mat2"),
          torch.baddbmm: ("batch1", "batch2"), Tensor.baddbmm: ("batch1", "batch2"),
          torch.addbmm: ("batch1", "batch2"), Tensor.addbmm: ("batch1", "batch2"),
          torch.addmv: ("mat", "vec"), Tensor.addmv: ("mat", "vec"),
          torch.addr: ("vec1", "vec2"), Tensor.addr: ("vec1", "vec2")}
#: runs a function overridable in Python (``F.multi_head_attention_forward``) past its own
#: check for a mode, so that a mode re-entered around it sees the products inside (torch 2.5
#: on; None: older torch, where such a call is sized from its arguments, :func:`_factors`)
_REDISPATCH: Callable[..., Any] | None = getattr(torch._C, "_skip_one_hop_torch_function", None)


class _Ranges(TorchFunctionMode):
    """While active, records the input sizes of the calls a low precision's error depends on,
    in call order, so that a later chunk can be compared with the calibration's
    (:meth:`PrecisionCheck._widening`):

    * ``"bf16"``: each product of :data:`_PRODUCTS`, three values (:func:`_extents`, the
      largest over its factors, :func:`_factors`): the largest absolute value, the root mean
      square and the range (max − min). bf16 rounds each value to a step proportional to its
      size, so its error grows with the values' magnitude (inputs shifted by a constant, which
      a model can cancel, widen the first two though not the range), and a normalisation
      layer after it can hide a larger input from the output the band is scaled by. And in
      :attr:`products`, per group of factors multiplied together, the product of their three
      values: a product's error grows with both factors' sizes, so an input smaller than the
      weight it meets (whose largest is the weight's) grows unseen in the larger of the two.
      ``nn.MultiheadAttention``'s function is entered with the recording on, so the products
      inside it are recorded too.
    * ``"static"``: each ``torch.quantize_per_tensor`` of a static int8 copy (where a float layer
      hands over to int8), per copy (row), how far its values reach above 0 and below 0 (two
      values a call): its quantisation range is fixed and affine (its two ends need not be
      alike), so a value beyond every calibrated one on its side is clamped, an error of any
      size.

    Values stay on the device until read (:meth:`read`: one host sync). ``off()`` suspends the
    recording (the float32 clean caches of prefix and local reuse).

    A float32 ``F.linear`` under bf16 autocast is cast here, as autocast would cast it (input,
    weight and bias to bf16: the same product, bit for bit), so that the weights' bf16 copies and
    their sizes are kept between forwards (:meth:`_weights`, by storage address, version, shape
    and strides, holding the tensors, as int8's packed weights are) instead of cast and measured
    again in every forward; :meth:`forget` drops them (at the end of each batch)."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.ranges: list[Tensor] = []
        #: bf16: per group of factors multiplied together (:func:`_factors`), the product of
        #: their sizes (three values, as :attr:`ranges`'), reset with it
        self.products: list[Tensor] = []
        #: whether a recorded call ran in the low precision (bf16: a product under bf16
        #: autocast, not one a model ran with autocast switched off; static: any), reset with
        #: :attr:`ranges`
        self.lowered = False
        self._enabled = True
        self._cast: OrderedDict[Any, tuple[Any, ...]] = OrderedDict()

    def forget(self) -> None:
        """Drop the weights' bf16 copies."""
        self._cast.clear()

    def _weights(self, weight: Tensor, bias: Tensor | None) -> tuple[Tensor, Tensor | None, Tensor]:
        """``weight`` and ``bias`` in bf16, and the weight's :func:`_extents`."""
        return _int8.cached(self._cast, weight, bias, lambda: (
            weight.detach().to(torch.bfloat16),
            None if bias is None else bias.detach().to(torch.bfloat16),
            _extents(weight.detach())))

    def _linear(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A linear of float32 weights (input float32 or already bf16) under bf16 autocast,
        cast here (None: leave it to autocast)."""
        x = args[0] if args else kwargs.get("input")
        weight = args[1] if len(args) > 1 else kwargs.get("weight")
        bias = args[2] if len(args) > 2 else kwargs.get("bias")
        if not (isinstance(x, Tensor) and isinstance(weight, Tensor)
                and x.dtype in (torch.float32, torch.bfloat16)
                and weight.dtype == torch.float32 and x.numel()
                and (bias is None or (isinstance(bias, Tensor) and bias.dtype == torch.float32))
                and len(args) + len(kwargs) <= 3 and x.device == weight.device):
            return None
        device = x.device.type
        if not (autocast_on(device) and autocast_dtype(device) == torch.bfloat16):
            return None
        if torch.is_grad_enabled() and any(t is not None and t.requires_grad
                                           for t in (x, weight, bias)):
            return None
        w16, b16, w_sizes = self._weights(weight, bias)
        x16 = x.to(torch.bfloat16)  # what the product reads: its sizes cost half the bytes
        self.lowered = True
        x_sizes = _extents(x16.detach())
        self.ranges.extend(torch.maximum(x_sizes, w_sizes).unbind())
        self.products.append(x_sizes * w_sizes)
        return F.linear(x16, w16, b16)

    def off(self) -> AbstractContextManager[None]:
        return _int8.suspended(self)

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        if self._enabled:
            if self.kind == "bf16" and func is F.linear:
                out = self._linear(args, kwargs)
                if out is not None:
                    return out
            if self.kind == "bf16" and func is F.multi_head_attention_forward and _REDISPATCH:
                # a Python function that hands itself to the mode first: called as it is, the
                # products inside it would run with the mode off, unrecorded
                with self:
                    return _REDISPATCH(func, types, args, kwargs)
            if self.kind == "bf16" and (func in _PRODUCTS
                                        or func is F.multi_head_attention_forward):
                self._product(func, args, kwargs)
            elif self.kind == "static" and func is torch.quantize_per_tensor:
                x = (args[0] if args else kwargs["input"]).detach()
                if x.is_floating_point() and x.numel():
                    rows = x.reshape(len(x), -1) if x.dim() >= 2 else x.reshape(1, -1)
                    # each side of 0 apart: the range is affine (a post-activation range can
                    # reach far above 0 and barely below it), so a copy past its low end is
                    # clamped although its largest |x| is within the high end
                    lo, hi = torch.aminmax(rows, dim=1)
                    self.ranges.extend([hi.clamp(min=0).float(), (-lo).clamp(min=0).float()])
                    self.lowered = True
        return func(*args, **kwargs)

    def _product(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Record a product's sizes: the largest over its factors in :attr:`ranges`, and per
        group of factors multiplied together the product of theirs in :attr:`products`."""
        groups = [[a for a in group if isinstance(a, Tensor) and a.is_floating_point()
                   and a.numel()] for group in _factors(func, args, kwargs)]
        found = {id(a): a for group in groups for a in group}
        if not found:
            return
        # each tensor once (a self-attention's query is its key)
        sizes = {k: _extents(a.detach()) for k, a in found.items()}
        each = list(sizes.values())
        largest = each[0] if len(each) == 1 else torch.stack(each).amax(dim=0)
        self.ranges.extend(largest.unbind())
        self.products.extend(functools.reduce(torch.mul, [sizes[id(a)] for a in group])
                             for group in groups if group)
        self.lowered = self.lowered or any(
            a.dtype in (torch.float32, torch.bfloat16) and autocast_on(a.device.type)
            and autocast_dtype(a.device.type) == torch.bfloat16 for a in found.values())

    def read(self) -> list[float]:
        """Each recorded value (``"static"``: the largest over its rows), one host sync."""
        return self.read_all()[0]

    def read_all(self) -> tuple[list[float], list[float]]:
        """:meth:`read`'s values, and :attr:`products`' (three a group), one host sync."""
        if not self.ranges:
            return [], []
        values = torch.stack([r if r.dim() == 0 else r.amax() for r in self.ranges])
        if not self.products:
            return values.tolist(), []
        both = torch.cat([values, torch.stack(self.products).flatten()]).tolist()
        return both[:len(values)], both[len(values):]


def _factors(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[list[Any]]:
    """A product's factors (not an added term or a bias), grouped by the products they are
    multiplied together in: ``input + a @ b`` (:data:`_ADDED`), ``[a, b]``; attention,
    ``[query, key]`` (its scores); ``F.bilinear``, ``einsum``, ``multi_dot`` and
    ``chain_matmul``, all their factors; every other product its first two tensor arguments
    (input and weight). ``F.multi_head_attention_forward``
    (where the products inside cannot be recorded, :data:`_REDISPATCH`): its projections of
    query, key and value, its scores and its output projection, each group from the arguments
    that size it."""
    if func in _ADDED:
        return [[args[i] if len(args) > i else kwargs.get(name)
                 for i, name in zip((1, 2), _ADDED[func], strict=True)]]
    if func in _RNNS or func in _RNN_CELLS:
        return _recurrent_factors(func, args)
    if func is F.scaled_dot_product_attention or func is F.multi_head_attention_forward:
        q, k, v = (args[i] if len(args) > i else kwargs.get(name)
                   for i, name in enumerate(("query", "key", "value")))
        if func is F.scaled_dot_product_attention:
            # the values are weighted by the softmax (at most 1): what that product makes is
            # sized as the next product's input (an output projection's)
            return [[q, k]]
        w = (args[5] if len(args) > 5 else kwargs.get("in_proj_weight"),
             args[11] if len(args) > 11 else kwargs.get("out_proj_weight"))
        if not isinstance(w[0], Tensor):  # separate projection weights: sized by the input
            w = (None, w[1])
        return [[q, w[0]], [k, w[0]], [v, w[0]], [q, k], [v, w[1]]]
    found = _tensors(func, args, kwargs)
    return [found[:3] if func is F.bilinear else found if func in _ALL_FACTORS else found[:2]]


def _recurrent_factors(func: Any, args: tuple[Any, ...]) -> list[list[Any]]:
    """A recurrent layer's factors: its input with the first layer's input weight, and its
    initial hidden state (an LSTM's ``h``, not its cell state) with the first layer's hidden
    weight. ``torch.lstm`` / ``gru`` / ``rnn_*`` take ``(input, hx, params, …)`` or, packed,
    ``(data, batch_sizes, hx, params, …)``; the cells ``(input, hx, w_ih, w_hh, …)``. Later
    layers multiply the earlier ones' outputs, sized through the first layer's input (the
    output band widens for the rest)."""
    if func in _RNN_CELLS:
        x, hx, weights = args[0], args[1] if len(args) > 1 else None, list(args[2:4])
    else:
        packed = (len(args) > 1 and isinstance(args[1], Tensor)
                  and not args[1].is_floating_point())  # batch_sizes of a packed sequence
        x, rest = args[0], args[2:] if packed else args[1:]
        hx = rest[0] if rest else None
        weights = list(rest[1][:2]) if len(rest) > 1 and isinstance(rest[1], (list, tuple)) \
            else []
    h = hx[0] if isinstance(hx, (list, tuple)) and hx else hx
    w_ih, w_hh = (*weights, None, None)[:2]
    return [[x, w_ih], [h, w_hh]]


def _tensors(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Tensor]:
    """The tensor arguments of a product, in order (``einsum``'s operands after its equation,
    given as one list or one by one; ``multi_dot``'s list)."""
    if func in _ALL_FACTORS:
        ops = args[1:] if func is torch.einsum else args
        if not ops and func is torch.linalg.multi_dot:
            ops = (kwargs.get("tensors"),)
        if len(ops) == 1 and isinstance(ops[0], (list, tuple)):
            ops = tuple(ops[0])
        return [a for a in ops if isinstance(a, Tensor)]
    return [a for a in (*args, *kwargs.values()) if isinstance(a, Tensor)]


def _in_memory_order(a: Tensor) -> Tensor:
    """``a``'s elements as a 1-D view in the order they lie in memory, where they are dense
    (a channels-last map, a transposed weight), else ``a`` itself: a full reduction such as a
    minimum or maximum gives the same value either way, and torch's ``aminmax`` ran 4–6× slower
    over a channels-last map than over the same memory read in order (local reuse keeps its
    maps channels-last)."""
    if a.is_contiguous():
        return a.reshape(-1)
    order = sorted(range(a.dim()), key=lambda d: (a.stride(d), a.size(d)), reverse=True)
    dense = a.permute(order)
    return dense.reshape(-1) if dense.is_contiguous() else a


def _extents(a: Tensor) -> Tensor:
    """The sizes bf16's rounding error in a product with input ``a`` grows with, float32: the
    largest absolute value (one value's error), the root mean square (the sum of many
    values' errors) and the range (max − min)."""
    flat = _in_memory_order(a)
    lo, hi = torch.aminmax(flat)
    if a.dtype == torch.float32 and flat.dim() == 1:
        # the BLAS dot product: 1.8× faster than vector_norm on a 2-core CPU, and nearer the
        # exact sum (relative 2e-6 against 1e-4 on 4.7M values)
        norm = torch.dot(flat, flat).sqrt()
    else:
        # a bf16 tensor's norm accumulates in float32 and rounds the result to bf16 (a relative
        # 2^-8, far below any widening that matters), several times faster than a float32 copy's
        norm = torch.linalg.vector_norm(a if a.dtype == torch.bfloat16 else a.float())
    rms = norm.float() / math.sqrt(a.numel())
    return torch.stack([torch.maximum(hi, -lo).float(), rms, (hi - lo).float()])


class _Float32Caches:
    """Stands in for the model while copies are evaluated: the clean caches of prefix and
    local reuse (``prefix_cache``/``local_cache``) are computed in float32 (``plain()``
    suspends the low precision), as in a float32 run; everything else is the model's. With
    a static int8 copy (:class:`._int8.StaticInt8`) active, calls go to it, on whole copies
    (:attr:`full_copies`)."""

    def __init__(self, model: Any, plain: Callable[[], AbstractContextManager[Any]],
                 static: _int8.StaticInt8 | None = None) -> None:
        self._model, self._plain, self._static = model, plain, static

    @property
    def full_copies(self) -> bool:
        """Whether copies must be passed whole (no local reuse): the static int8 pass."""
        return self._static is not None and self._static.active

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.full_copies and len(args) == 1 and not kwargs:
            assert self._static is not None
            return self._static(args[0])
        return self._model(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._model, name)
        if name not in ("prefix_cache", "local_cache"):
            return attr

        def float32(*args: Any, **kwargs: Any) -> Any:
            with self._plain():
                return attr(*args, **kwargs)
        return float32


@contextmanager
def _both(*managers: AbstractContextManager[Any]) -> Iterator[None]:
    """The context managers entered in order, left in reverse."""
    with ExitStack() as stack:
        for m in managers:
            stack.enter_context(m)
        yield


def _on(widening: float | Tensor, like: Tensor) -> float | Tensor:
    return widening.to(like.device, like.dtype) if isinstance(widening, Tensor) else widening


@contextmanager
def _active(static: _int8.StaticInt8) -> Iterator[None]:
    """The static int8 copy in use for the calls inside."""
    static.active = True
    try:
        yield
    finally:
        static.active = False


#: why the copies run in float32 where a static int8 copy failed (:attr:`PrecisionCheck.why_idle`)
_STATIC_FAILED = ("the static int8 copy of the model could not be made or run (an operation "
                  "without an int8 kernel, or one FX cannot trace)")


class PrecisionCheck:
    """The calibrated bound of one metric and its bookkeeping (see the module docstring), for
    its low precision ``low``: ``"bf16"`` (autocast) or ``"int8"`` (:class:`._int8.Int8Linears`,
    whose packed weights the check keeps between batches, or a :class:`._int8.StaticInt8` copy
    of a convolutional model)."""

    def __init__(self) -> None:
        #: the low precisions whose spot checks found errors beyond the calibration, said once
        #: (:meth:`_widen`); kept by :meth:`reset`, which a metric's reset and every
        #: recalibration (a training step changed the weights) call
        self.said: set[str] = set()
        self.reset()

    def reset(self) -> None:
        self.low: str | None = None
        #: b, the margin below which a copy is re-checked (None: still calibrating)
        self.bound: float | None = None
        self.scale = 0.0  #: S, the largest absolute output seen in the calibration
        self._deltas: list[float] = []
        self._copies = 0  # calibration copies so far
        self.copies = self.fp32 = 0  # per update: copies evaluated, float32 re-evaluations
        #: calibration copies counted among the checked ones: handed out by :meth:`take_counts`,
        #: and of the update under way (:meth:`use` drops a failed update's, whose counts the
        #: metric discards); taken back where the calibration sends every copy to float32
        self._cal_reported = self._cal_new = 0
        self._int8 = _int8.Int8Linears()
        #: int8 on a convolutional model that FX traces (explicit ``"int8-checked"``): its
        #: static int8 copy, and the model it was made for
        self._static: _int8.StaticInt8 | None = None
        self._static_for: Any = None
        #: the model's parameters and buffers at the calibration (:func:`._int8.weights_state`)
        self._weights: list[tuple[Any, ...]] | None = None
        #: its plain Python attributes then (:func:`._int8.attributes_state`; int8 only)
        self._attrs: list[tuple[str, str, str]] | None = None
        #: the largest of each recorded input size (:meth:`_recorded`, in call order) in the
        #: calibration: int8's linear layers, bf16's products, a static int8 copy's quantisations
        self._ranges: list[float] = []
        #: bf16: the largest of each product of a group of factors' sizes
        #: (:attr:`_Ranges.products`, in call order) in the calibration
        self._products: list[float] = []
        #: whether a calibration forward ran a call in the low precision (:meth:`_unchanged`)
        self._lowered_seen = False
        self._rec: _Ranges | None = None
        #: the copies run in float32 from the next batch on: int8 found no layer to run (no
        #: eligible ``F.linear``), the static int8 copy failed, or ``"auto"``'s calibration
        #: predicted no gain
        self.idle = False
        #: why the copies run in float32 (:attr:`idle`), in words; None while they do not
        self.why_idle: str | None = None
        #: ``"auto"`` on a CPU: the calibration judges whether checking pays (:meth:`_pays`)
        self.judge = False
        #: the share of the calibration copies the bound would have re-checked
        self.predicted_recheck: float | None = None
        self._cal: list[tuple[Tensor, Tensor]] = []  # calibration copies' low margins, sizes
        #: seconds the calibration copies took in the low precision and in float32
        self._seconds = [0.0, 0.0]
        #: after the calibration: seconds and copies of the checked low-precision forwards,
        #: and of the float32 re-checks (:meth:`_rejudge`)
        self._timed = [0.0, 0, 0.0, 0]
        #: the bound as calibrated, before any spot check widened it (None: calibrating)
        self.calibrated: float | None = None
        #: how many times a spot check widened the bound (:meth:`_checked`)
        self.widened = 0
        #: the spot checks' own generator: which copies are verified never moves the noise
        self._spots = torch.Generator().manual_seed(SPOT_SEED)

    def use(self, low: str, judge: bool = False, model: Any = None, copies: int = 0,
            reuse: bool = False) -> None:
        """Check ``low`` from now on (a new low precision starts a new calibration); with
        ``judge`` (``"auto"`` on a CPU) stop checking if the calibration finds no gain. int8 on
        a convolutional ``model`` that FX traces runs its static int8 copy
        (:class:`._int8.StaticInt8`) — under ``judge`` only where the first batch of a
        calibration makes at least :data:`AUTO_STATIC_COPIES` ``copies`` (an allocation's: its
        first round's), so building the copy costs little beside them, and where the copies
        would otherwise reuse the clean computation (``reuse``) only on a CPU whose int8
        product runs at :data:`STATIC_OVER_LOCAL` × float32's; other models run their linear
        layers in int8. A ``model`` whose parameters or buffers changed since the last call
        starts a new calibration, and while a static int8 copy is in use so does one whose
        plain Python attributes changed (:func:`._int8.attributes_state`: the copy bakes them
        in)."""
        # a failed update's calibration copies: its counts are discarded (no take_counts)
        self._cal_new = 0
        self._fresh = True  # no copy evaluated since: a take_counts now discards (tokenwise)
        weights = _int8.weights_state(model)
        # a static int8 copy bakes the model's plain Python attributes in (the dynamic int8
        # layers and bf16 read them at every call): compared only while such a copy exists
        attrs = _int8.attributes_state(model) if low == "int8" else None
        baked = (self._static is not None and attrs is not None and self._attrs is not None
                 and attrs != self._attrs)
        changed = baked or low != self.low or (weights is not None and self._weights is not None
                                               and weights != self._weights)
        # int8's packed weights verified too: a plain callable's model, or a weight that is no
        # parameter or buffer, has no other check, and one written through .data would run as
        # its old int8 copy (and the bound as the old model's)
        if changed or self._int8.changed():
            # a new precision, or weights changed since the calibration (a training step): the
            # bound, and a static int8 copy, were the old model's
            self.reset()
            self.low = low
        self._weights, self._attrs = weights, attrs
        self.judge = judge
        fresh = self.bound is None and self._copies == 0 and not self.idle
        if (low == "int8" and model is not None and model is not self._static_for
                and (not judge or (fresh and copies >= AUTO_STATIC_COPIES and (
                    not reuse
                    or _int8_gemm_speedup(torch.get_num_threads()) >= STATIC_OVER_LOCAL)))):
            self._static_for = model
            self._static = _int8.StaticInt8(model) if _int8.StaticInt8.applies(model) else None

    def _pays(self) -> bool:
        """Whether a copy costs less checked than in float32 (:meth:`_checked_cost`: its
        low-precision forward plus the share re-checked in float32, as the calibration predicts
        it or, later, as measured) at most ``1 / MIN_SPEEDUP`` of a float32 forward. Without
        ``judge``, yes."""
        if not self.judge or self._seconds[1] <= 0 or self.predicted_recheck is None:
            return True
        return self._checked_cost() <= 1 / MIN_SPEEDUP

    def _checked_cost(self) -> float:
        """A checked copy's cost in float32 copies: its low-precision forward plus the share
        re-checked in float32. As timed in the calibration, with the share it predicts; from
        :data:`CALIBRATION_COPIES` checked copies on (:meth:`_rejudge`), with their measured
        share, and per-copy times pooled over the calibration and the checked copies (the
        float32 ones over the calibration and the re-checks)."""
        low, full = self._seconds
        share = self.predicted_recheck or 0.0
        low_s, low_n, full_s, full_n = self._timed
        if low_n >= CALIBRATION_COPIES and self._copies > 0:
            per_low = (low + low_s) / (self._copies + low_n)
            per_full = (full + full_s) / (self._copies + full_n)
            return (per_low + full_n / low_n * per_full) / per_full if per_full > 0 else math.nan
        return (low + share * full) / full if full > 0 else math.nan

    def take_counts(self) -> tuple[int, int]:
        """(copies run checked, float32 re-evaluations) since the last call; called at each
        batch's start and end, where the weights' bf16 copies are dropped
        (:meth:`_Ranges.forget`)."""
        if self._rec is not None:
            self._rec.forget()
        # the calibration copies count as checked ones (all re-evaluated) while checking is
        # on; where the calibration sends every copy to float32 before any runs checked (no
        # gain, no change, a failed static copy) they are taken back, so ``recheck_fraction``
        # is None, not 1.0 for a check that re-checked nothing (``num_forward_fp32`` still
        # counts their float32 forwards)
        if not self.__dict__.get("_fresh", False):  # not a discard of a failed update's counts
            self._cal_reported = (self.__dict__.get("_cal_reported", 0)
                                  + self.__dict__.get("_cal_new", 0))
            self._cal_new = 0
            if self._timed[1]:  # copies ran checked: the calibration's count with them
                self._cal_reported = 0
            elif self.idle:
                self.copies -= self._cal_reported
                self._cal_reported = 0
        out = (self.copies, self.fp32)
        self.copies = self.fp32 = 0
        return out

    def _recorder(self) -> _Ranges:
        """The recorder of this low precision's input sizes (:class:`_Ranges`): a static int8
        copy's quantisation inputs, or bf16's products."""
        kind = "static" if self.low == "int8" and self._static is not None else "bf16"
        if self._rec is None or self._rec.kind != kind:
            self._rec = _Ranges(kind)
        return self._rec

    def _lowered(self, device: torch.device) -> AbstractContextManager[Any]:
        if self.low == "int8" and self._static is None:
            self._int8.ranges = []
            return self._int8
        rec = self._recorder()
        rec.ranges, rec.products, rec.lowered = [], [], False
        if self.low == "int8":
            return _both(_active(self._static), rec)  # type: ignore[arg-type]
        return _both(torch.autocast(device_type=device.type, dtype=torch.bfloat16), rec)

    def _recorded(self) -> list[float]:
        """The last low forward's input sizes of each recorded call, in call order (dynamic
        int8: :func:`._int8.extents`; bf16: :func:`_extents`, three values a call; static int8:
        how far its rows reach above 0 and below 0, the largest over the rows, two a call)."""
        return self._recorded_all()[0]

    def _recorded_all(self) -> tuple[list[float], list[float]]:
        """:meth:`_recorded`, and bf16's products of its factors' sizes
        (:attr:`_Ranges.products`; none for int8)."""
        if self.low == "int8" and self._static is None:
            return list(self._int8.ranges or []), []
        return self._recorder().read_all()

    def _calibrated_ranges(self) -> None:
        """Calibration: keep each recorded value's largest (the last low forward's), and
        whether any call ran in the low precision (:attr:`_lowered_seen`)."""
        recorded, products = self._recorded_all()
        self._ranges = [max(a, b) for a, b in
                        zip_longest(self._ranges, recorded, fillvalue=0.0)]
        self._products = [max(a, b) for a, b in
                          zip_longest(self.__dict__.get("_products", []), products, fillvalue=0.0)]
        dynamic = self.low == "int8" and self._static is None
        self._lowered_seen = self.__dict__.get("_lowered_seen", False) or (
            bool(recorded) if dynamic else self._recorder().lowered)

    def _widening(self, rows: int) -> float | Tensor:
        """How much wider the band is for the ``rows`` copies of the last low forward, whose
        calls' input sizes may exceed the calibration's. Dynamic int8 (quantisation steps,
        and the weight's rounding times the input) and bf16 (rounding grows with the values):
        the largest ratio of a recorded value (:meth:`_recorded`: a call's largest absolute
        input, root mean square and range) to its calibrated one, at least 1 (inf for a call
        never calibrated). A static int8 copy, whose quantisation ranges are fixed, per copy
        (row): the ratio of how far its values reach at each hand-over to int8, above 0 and
        below 0 apart, to the calibrated reach on that side, and inf beyond
        :data:`STATIC_CLAMP` times it (clamped far past anything the calibration saw: an error
        of any size; on a side the calibration never reached, one quantisation step, the other
        side's reach / 255, stands for the calibrated reach)."""
        if self.low == "int8" and self._static is not None:
            worst = torch.ones(rows)
            for i, r in enumerate(self._recorder().ranges):
                cal = self._ranges[i] if i < len(self._ranges) else 0.0
                if cal == 0 and (i ^ 1) < len(self._ranges):  # a side never reached: its end
                    cal = self._ranges[i ^ 1] / 255  # is 0, a step from the values beyond it
                r = r.cpu()
                ratio = r / cal if cal > 0 else torch.where(r > 0, math.inf, 0.0)
                ratio = torch.where(ratio > STATIC_CLAMP, math.inf, ratio)
                worst = torch.maximum(worst, ratio if len(ratio) == rows else ratio.max())
            return worst
        worst = 1.0
        recorded, products = self._recorded_all()
        for now, calibrated in ((recorded, self._ranges),
                                (products, self.__dict__.get("_products", []))):
            for i, r in enumerate(now):
                cal = calibrated[i] if i < len(calibrated) else 0.0
                if r > cal:
                    worst = max(worst, r / cal if cal > 0 else math.inf)
        return worst

    @property
    def wants_inputs(self) -> bool:
        """Whether a static int8 copy waits for model inputs to calibrate on (:meth:`build`)."""
        return (self.low == "int8" and self._static is not None and self._static.model is None
                and not self._static.failed)

    def build(self, inputs: Tensor | None) -> None:
        """Quantise the static int8 copy on ``inputs`` (whole perturbed copies); a copy that
        cannot be made leaves the copies in float32 (:attr:`idle`). Without floating inputs
        to calibrate on (token ids: the noise enters inside the model) there is no static copy:
        the linear layers run in int8 instead."""
        if self._static is None:
            return
        if inputs is None or not inputs.is_floating_point():
            self._static = None
            return
        self._static.build(inputs)
        self._set_idle(self._static.failed, _STATIC_FAILED)

    def wrap(self, model: Any, device: torch.device) -> _Float32Caches:
        if self.low == "int8":
            return _Float32Caches(model, self._int8.off, self._static)
        return _Float32Caches(model, lambda: _both(
            torch.autocast(device_type=device.type, enabled=False), self._recorder().off()))

    def _observe(self, low: Tensor, full: Tensor, kind: str,
                 threshold: float | None) -> tuple[Tensor, Tensor]:
        """Record the margin changes of ``low`` against ``full``; returns the low outputs'
        margins of their own class and their largest absolute outputs. Rows whose low output
        holds a NaN or an infinity (bf16's cancellation in a hand-written variance, say) are
        left out of the changes: every such copy is re-checked whatever the bound (its margin
        or its size is not finite), and one of them would otherwise make the bound infinite
        and re-check every later copy. A calibration of such rows alone records no change:
        its bound is infinite (:meth:`_judge`)."""
        finite = torch.isfinite(low.reshape(len(low), -1)).all(dim=1)
        seen = (low, full) if bool(finite.all()) else (low[finite], full[finite])
        if len(seen[0]):
            self._deltas.append(float(_changes(*seen, kind, threshold).max()))
            # S of the rows b is calibrated on, their finite values: a float32 -inf (a class
            # masked on some copies) made S infinite, and every later copy's band unwidened
            # however large its outputs (max(1, s / inf) = 1)
            values = seen[1].reshape(len(seen[1]), -1).abs()
            values = torch.where(torch.isfinite(values), values, torch.zeros_like(values))
            self.scale = max(self.scale, float(values.max()) if values.numel() else 0.0)
        own = margins(low, predictions(low, kind, threshold), kind, threshold)
        return own, low.reshape(len(low), -1).abs().amax(dim=1)

    def _judge(self, final: bool) -> None:
        """After a calibration chunk: the share of the calibration copies the bound re-checks;
        at the end (``final``) the bound is fixed. Under
        ``judge`` checking stops (:attr:`idle`) once it cannot pay: from
        :data:`JUDGE_AFTER` copies on, the share under the bound so far, with no widening for
        large outputs, is at most the final share (the bound only grows, and the widening
        never narrows it), so a loss predicted early is a loss at the end."""
        bound = SAFETY * max(self._deltas, default=math.inf)  # none: non-finite rows alone
        m, size = (torch.cat(t) for t in zip(*self._cal, strict=True))
        if final:
            self.bound = self.calibrated = bound
            self._cal = []
            if self._deltas and max(self._deltas) == 0 and self.__dict__.get("_lowered_seen"):
                self._unchanged()
                return
            band = self._band(size)
        elif self.judge and self._copies >= JUDGE_AFTER:
            band = torch.full_like(size, bound)
        else:
            return
        share = (m <= band) | ~torch.isfinite(m)
        self.predicted_recheck = float(share.float().mean()) if len(m) else 0.0
        if self._pays():
            self._set_idle(False, "")
            return
        self._set_idle(True,
                       f"\"auto\"'s timed calibration found no gain: {self.low} would re-check "
                       f"{self.predicted_recheck:.0%} of the copies in float32, and a checked copy "
                       f"would cost {self._checked_cost():.2f} of a float32 one")

    def _unchanged(self) -> None:
        """The calibration ends without a single change although the model ran in the low
        precision (bf16 autocast ran a product, or int8 a layer): not one calibration output's
        margin changed, so the bound would be 0. A model whose outputs the low precision's
        rounding reaches changes some; these are discrete (a step ``(z > 0).float()``, a
        rounding, a one-hot argmax) or saturated (a sigmoid at exactly 1.0) there, so its
        error is either invisible or a jump of any size, and no band bounds it: a band of 0
        re-checks only the margins of 0, and a copy the low precision moves across a step
        keeps its class. The copies run in float32 from here on (:attr:`idle`), said once per
        metric (a ``RuntimeWarning``)."""
        name = "bf16" if self.low == "bf16" else "int8"
        why = (f"{name} changed no output's margin on the {self._copies} calibration copies "
               "although the model's products ran in it: the outputs are constant, discrete (a "
               "step, a rounding, a one-hot argmax) or saturated, where no calibrated bound "
               "holds")
        self._set_idle(True, why)
        said = self.__dict__.setdefault("said", set())
        if f"{name} unchanged" not in said:
            said.add(f"{name} unchanged")
            warnings.warn(
                f"precision='{name}-checked': {why}. A copy {name} moves across such a step "
                "would keep its class unchecked, so the copies run in float32 "
                "(checked_precision == 'float32', float32_reason). Measure such a model with "
                "precision='float32', or return the scores its decision is read from",
                RuntimeWarning, stacklevel=_trim._user_level())

    def _set_idle(self, idle: bool, why: str) -> None:
        self.idle = idle
        self.why_idle = why if idle else None

    def _band(self, size: Tensor) -> Tensor:
        assert self.bound is not None
        return self.bound * self._output_widening(size)

    def _output_widening(self, size: Tensor) -> Tensor:
        """:math:`\\max(1, s / S)` of copies whose largest absolute outputs are ``size``."""
        return (size / max(self.scale, 1e-30)).clamp(min=1.0)

    def calibrate_clean(self, forward: Callable[[], Tensor], clean: Tensor, device: torch.device,
                        kind: str, threshold: float | None) -> None:
        """Clean examples in the low precision (``forward()`` gives them) against their float32
        outputs; with int8, finds whether any layer runs in int8 at all (:attr:`idle`)."""
        if self.bound is not None or self._copies or self._static is not None:
            return  # a static int8 copy is calibrated on perturbed copies (build) instead
        calls = self._int8.calls
        try:
            with self._lowered(device):
                low = forward()
        except RuntimeError as err:
            # a model that cannot run in the low precision (DeBERTa v1 fills its attention mask
            # with float32's smallest number, which bf16 cannot hold) failed the measurement with
            # torch's raw error under the default "auto"
            name = "bf16 (autocast)" if self.low == "bf16" else "int8"
            if not self.judge:
                raise RuntimeError(
                    f"the model fails in {name}, the checked precision asked for ({err}); "
                    "measure with precision='float32'") from err
            self._set_idle(True, f"the model fails in {name} ({type(err).__name__}: "
                                 f"{str(err).splitlines()[0] if str(err) else ''})")
            return
        self._set_idle(self.low == "int8" and self._int8.calls == calls,
                       f"int8 found no linear layer with {_int8.MIN_FEATURES} or more input "
                       "and output features to run")
        self._calibrated_ranges()
        self._observe(_wide(low), _wide(clean), kind, threshold)

    def evaluate(self, forward: Callable[[Tensor | None], Tensor], n: int, device: torch.device,
                 kind: str, threshold: float | None, piece: int | None = None) -> Tensor:
        """Outputs of ``n`` copies, ``forward(rows)`` evaluating the copies ``rows`` (None: all)
        at the current precision: low-precision rows where the margin is safe, float32 rows
        elsewhere; once :attr:`idle` (the calibration found no gain), all rows in float32.
        While calibrating, the calibration copies are evaluated in both precisions (and timed)
        before the chunk's other copies, which then run checked, or in float32 alone if the
        judgement went against checking. Checked, the low precision runs ``piece`` copies at a
        time (None: all at once) and float32 the re-checked copies of all of them together, in
        forwards of at most ``piece``."""
        self._fresh = False
        if self.idle:
            return _wide(forward(None))
        if self.bound is not None:
            return self._checked(forward, None, n, device, kind, threshold, piece)
        start = min(n, CALIBRATION_COPIES - self._copies)  # calibration copies of this chunk
        rows = None if start == n else torch.arange(start, device=device)
        if self.judge and not self._copies:
            # untimed first: the low precision's kernels are made on their first call (oneDNN's
            # bf16 products on a CPU), a one-time cost that would count against it
            with self._lowered(device):
                forward(rows)
        clock = _clock(device)
        with self._lowered(device):
            low = _wide(forward(rows))
        between = _clock(device)
        self._calibrated_ranges()
        full = _wide(forward(rows))
        self._seconds[0] += between - clock
        self._seconds[1] += _clock(device) - between
        self.copies += start
        self._cal_new = self.__dict__.get("_cal_new", 0) + start
        self.fp32 += start
        self._cal.append(self._observe(low, full, kind, threshold))
        self._copies += start
        self._judge(final=self._copies >= CALIBRATION_COPIES)
        if self._static is not None and self._static.failed:
            self._set_idle(True, _STATIC_FAILED)  # float32 from here on
        if start == n:
            return full  # calibration copies are decided in float32
        rest = torch.arange(start, n, device=device)
        out = full.new_empty((n, *full.shape[1:]))
        out[:start] = full
        if self.idle:  # no gain: the chunk's other copies in float32 alone
            out[start:] = _wide(forward(rest))
        else:
            out[start:] = self._checked(forward, rest, n - start, device, kind, threshold, piece)
        return out

    def _checked(self, forward: Callable[[Tensor | None], Tensor], rows: Tensor | None, n: int,
                 device: torch.device, kind: str, threshold: float | None,
                 piece: int | None = None) -> Tensor:
        """The ``n`` copies ``rows`` (None: all) with the calibrated bound: low precision
        (``piece`` copies per forward; None: all), those inside the band again in float32, in
        as few forwards of at most ``piece`` copies as they fill. Each piece's band is widened
        for its own recorded input sizes.

        The bound is verified as it is used: a random share of the copies outside the band
        (:meth:`_spot`) joins the float32 re-checks. Where one of them changed class, or its
        margin by more than its band / :data:`SAFETY` (the calibration's premise), the bound
        is widened to :data:`SAFETY` times that change (:meth:`_widen`), the copies the wider
        band takes in are re-checked too, and new copies outside it are spot-checked, until a
        spot check passes or no copy is left outside. So a later batch whose errors the
        calibration did not see gets float32's decisions, and the wider bound from then on."""
        low = self._checked_copies(forward, rows, n, device, kind, threshold, piece)
        self._rejudge()
        if self._static is not None and self._static.failed:
            # the static int8 copy failed on a call after its calibration and fell back to the
            # float model (said once): these copies were checked as before, the later ones run
            # in float32 alone, and the result names float32, not int8-checked
            self._set_idle(True, _STATIC_FAILED)
        return low

    def _checked_copies(self, forward: Callable[[Tensor | None], Tensor], rows: Tensor | None,
                        n: int, device: torch.device, kind: str, threshold: float | None,
                        piece: int | None) -> Tensor:
        """:meth:`_checked`'s work, its forwards timed for :meth:`_rejudge`."""
        clock = _clock(device)
        if piece is None or piece >= n:
            parts: list[Tensor | None] = [rows]
        else:
            every = torch.arange(n, device=device) if rows is None else rows
            parts = list(every.split(piece))
        lows, wides = [], []
        for part in parts:
            with self._lowered(device):
                low = _wide(forward(part))
            size = low.reshape(len(low), -1).abs().amax(dim=1)
            lows.append(low)
            wides.append(self._output_widening(size) * _on(self._widening(len(low)), size))
        low, wide = torch.cat(lows), torch.cat(wides)
        self.copies += n
        self._timed[0] += _clock(device) - clock
        self._timed[1] += n
        m = margins(low, predictions(low, kind, threshold), kind, threshold)
        done = torch.zeros(n, dtype=torch.bool, device=low.device)  # evaluated in float32
        while True:
            assert self.bound is not None
            band = self.bound * wide
            # a call never calibrated widens by inf, and with a bound of 0 (a calibration that
            # ran nothing in the low precision: a model whose later batches take another
            # branch) 0 × inf is NaN, which no margin is <=: such copies took the low
            # precision's class unchecked. ``not m > band`` re-checks them, as an infinite
            # widening means
            inside = (~(m > band) | ~torch.isfinite(m)) & ~done
            spot = self._spot(~inside & ~done)
            again = (inside | spot).nonzero().flatten()
            if not len(again):
                return low
            done[again] = True
            self.fp32 += len(again)
            before = low[spot]  # the spot-checked copies' low outputs
            # forwards of equal size, a chunk at most each (a share above the predicted one
            # never overruns memory)
            clock = _clock(device)
            for part in again.tensor_split(-(-len(again) // (piece or len(again)))):
                full = _wide(forward(part if rows is None else rows[part]))
                if full.dtype != low.dtype:  # float64 outputs: a float32 copy would round them
                    low = low.to(torch.promote_types(low.dtype, full.dtype))
                low[part] = full
            self._timed[2] += _clock(device) - clock
            self._timed[3] += len(again)
            if not self._widen(before, low[spot], wide[spot], kind, threshold):
                return low

    def _rejudge(self) -> None:
        """Under ``judge``: the calibration's verdict checked against the checked copies so far.
        The calibration copies are the first :data:`CALIBRATION_COPIES` of the first batch (a
        few examples): their re-checked share can be far from the batch's (1% predicted, 15%
        re-checked: ResNet-18 on MNIST, a static int8 copy on an AVX2 CPU), and their timing
        is one sample. From :data:`CALIBRATION_COPIES` checked copies on, :meth:`_pays` judges
        from what they measured (:meth:`_checked_cost`), and where checking does not pay the
        rest run in float32 (:attr:`idle`). The decisions are float32's either way: only the
        time changes."""
        if not self.judge or self.idle or self._timed[1] < CALIBRATION_COPIES:
            return
        if self._pays():  # the reason (another _checked_cost) only where checking stops
            self._set_idle(False, "")
            return
        self._set_idle(True,
                       f"\"auto\" measured no gain over {self._timed[1]} checked copies: "
                       f"{self.low} re-checked {self._timed[3] / self._timed[1]:.0%} of them in "
                       f"float32, and a checked copy cost {self._checked_cost():.2f} of a "
                       "float32 one")

    def _spot(self, outside: Tensor) -> Tensor:
        """A mask of the copies outside the band (mask ``outside``) to verify in float32:
        :data:`SPOT_SHARE` of them, at least :data:`SPOT_MIN` (all, where fewer), drawn from
        the check's own generator (:data:`SPOT_SEED`)."""
        where = outside.nonzero().flatten()
        k = min(len(where), max(SPOT_MIN, math.ceil(SPOT_SHARE * len(where))))
        chosen = torch.zeros_like(outside)
        if k:
            pick = torch.randperm(len(where), generator=self._spots)[:k]
            chosen[where[pick.to(where.device)]] = True
        return chosen

    def _stale_int8(self) -> str:
        """What of the model changed since int8 copied it (empty: nothing, or not int8): a
        packed weight (:meth:`._int8.Int8Linears.changed`, kept for the next batch's
        :meth:`use` to see), or, for a static int8 copy, the model's parameters, buffers or
        Python attributes. One read of the weights; asked only where a spot check widens."""
        if self.low != "int8":
            return ""
        if self._static is None:
            found = self._int8.changed(drop=False)
            layers = "a linear layer" if len(found) == 1 else "linear layers"
            return f"the float32 {', '.join(found)} of {layers}" if found else ""
        model = self._static_for
        if (_int8.weights_state(model) != self._weights
                or _int8.attributes_state(model) != self._attrs):
            return "the model's parameters, buffers or attributes"
        return ""

    def _widen(self, low: Tensor, full: Tensor, wide: Tensor, kind: str,
               threshold: float | None) -> bool:
        """Verify the bound on spot-checked copies (their ``low`` and float32 ``full``
        outputs, their bands' widenings ``wide``): where one changed class, or its margin by
        more than its band / :data:`SAFETY`, widen the bound to :data:`SAFETY` times the
        change (per unit of widening); returns whether it widened. A change within the band
        (the safety factor absorbed it) widens silently: the calibration goes on. A change
        beyond it, or a changed class, means copies outside the band could have taken the low
        precision's class: that is said once per metric and low precision (a
        ``RuntimeWarning``), not again after a reset or a recalibration — a training loop's
        evaluations calibrate on each one's first batch, and one unlike the rest (data sorted
        by class) would repeat it in every evaluation; the bound and the re-checks still widen
        (``check_bound``, ``recheck_fraction``), and the decisions stay float32's."""
        assert self.bound is not None
        if not len(low):
            return False
        if bool(_undecided(full).any()):
            # float32 fails (NaN) where the low precision did not: no error of the low
            # precision's, so no bound. A float32 run refuses such a copy; only a float32
            # forward shows it, so every later copy gets one (this one is refused as it is)
            name = "bf16" if self.low == "bf16" else "int8"
            self.bound = math.inf
            self.widened += 1
            said = self.__dict__.setdefault("said", set())
            if f"{name} float32 undecided" not in said:
                said.add(f"{name} float32 undecided")
                warnings.warn(
                    f"precision='{name}-checked': a float32 spot check found the model's "
                    f"float32 output NaN or infinite on a copy whose {name} output was finite and "
                    f"away from a class boundary: the float32 forward fails where {name}'s does "
                    f"not (a square root or logarithm of a value {name} rounded to the other side "
                    "of 0, say), which no bound of rounding errors sees. Such a copy is refused, "
                    "as a float32 run refuses it, and every later copy is re-checked in float32 "
                    "(check_bound is inf); copies decided in the low precision before this "
                    "check were not evaluated in float32 and may hide more. Measure this model "
                    "with precision='float32'",
                    RuntimeWarning, stacklevel=_trim._user_level())
            return True
        delta = _changes(low, full, kind, threshold)
        flipped = predictions(low, kind, threshold) != predictions(full, kind, threshold)
        need = SAFETY * delta / wide
        if not bool(((need > self.bound) | flipped).any()):
            return False
        worst = int(need.argmax())
        old, self.bound = self.bound, max(self.bound, float(need[worst]))
        self.widened += 1
        name = "bf16" if self.low == "bf16" else "int8"
        said = self.__dict__.setdefault("said", set())  # kept by reset(); an older pickle: none
        stale = self._stale_int8()
        if stale:
            # not int8's rounding: its copy of the weights is out of date, an error of any size
            # that no widened bound bounds, so every later copy is re-checked
            self.bound = math.inf
            if "int8 stale" not in said:
                said.add("int8 stale")
                warnings.warn(
                    f"precision='int8-checked': a float32 spot check found int8 changing a "
                    f"copy's margin by {float(delta[worst]):.3g}, more than its band "
                    f"({old * float(wide[worst]):.3g}), and the cause is not int8's rounding: "
                    f"{stale} changed during the measurement without PyTorch counting a "
                    "version (written through .data or a NumPy view, by the model's forward "
                    "or a hook), so int8 ran the old weights' copy. Every later copy of this "
                    "batch is re-checked in float32 (check_bound is inf) and the next batch "
                    "calibrates afresh; copies decided before this check may have taken the "
                    "old copy's class. Measure a model that edits its own weights as it runs "
                    "with precision='float32'",
                    RuntimeWarning, stacklevel=_trim._user_level())
            return True
        if (bool(flipped.any()) or float(need[worst]) > SAFETY * old) and name not in said:
            said.add(name)
            warnings.warn(
                f"precision='{name}-checked': a float32 spot check found {name} changing a "
                f"copy's margin by {float(delta[worst]):.3g}, more than its band "
                f"({old * float(wide[worst]):.3g}: the bound, calibrated on the first "
                f"{CALIBRATION_COPIES} copies as {self.calibrated:.3g}, widened for this copy's "
                f"sizes), so copies outside the band could take {name}'s class: {name}'s errors "
                "here exceed the calibration's. The bound is widened to "
                f"{self.bound:.3g} (check_bound) and the copies inside it re-checked in float32, "
                "so the decisions stay float32's; more copies are re-checked from here on "
                "(recheck_fraction). A first batch unlike the later ones (data sorted by class) "
                "causes this: shuffled data calibrates on typical copies. Said once per "
                "metric: later widenings show in check_bound and recheck_fraction",
                RuntimeWarning, stacklevel=_trim._user_level())
        return True


def _wide(out: Tensor) -> Tensor:
    """Outputs in float32, or float64 where they are: a float32 model with a float64 head, or a
    plain callable computing in float64, decides in float64 under ``precision="float32"``, and
    its outputs rounded to float32 tied or crossed classes whose margins float32 cannot hold
    (log-likelihoods near -1e5 apart by 1e-3: every copy read as the first class), even on
    the copies re-checked "in float32"."""
    return out if out.dtype == torch.float64 else out.float()


def _changes(low: Tensor, full: Tensor, kind: str, threshold: float | None) -> Tensor:
    """Per copy, the change between its ``low`` and float32 (``full``) outputs of the margin of
    either precision's class (:math:`\\delta_i`); inf where it overflows."""
    c16 = predictions(low, kind, threshold)
    c32 = predictions(full, kind, threshold)
    delta = torch.maximum((margins(low, c16, kind, threshold)
                           - margins(full, c16, kind, threshold)).abs(),
                          (margins(low, c32, kind, threshold)
                           - margins(full, c32, kind, threshold)).abs())
    return torch.where(torch.isfinite(delta), delta, torch.inf)  # overflow: all rows


def _undecided(out: Tensor) -> Tensor:
    """Per row of ``out``, whether it decides no class (:func:`.outputs.check_finite`'s rule for
    ``compare="class"``, which refuses it): a NaN, or a largest entry that is not finite."""
    flat = out.reshape(len(out), -1)
    if not flat.shape[1]:
        return torch.zeros(len(flat), dtype=torch.bool, device=flat.device)
    return flat.isnan().any(dim=1) | ~torch.isfinite(flat.amax(dim=1))
