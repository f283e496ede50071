r"""bf16 forwards with float32's decisions (``precision="bf16-checked"``, chosen by ``"auto"``
where the hardware multiplies bf16 matrices natively and, on a CPU, measurably faster).

A perturbed copy is evaluated under bf16 autocast; its class is read from the bf16 output
unless that output is close to a class boundary, where bf16 rounding could put it on the other
side, and then the copy is evaluated again in float32 and float32's class is used.

**Rule.** Let :math:`c` be the class the bf16 output predicts and :math:`m_{16}` its margin in
the output's own units (:func:`~senslab.measure.outputs.margins`: the top logit minus the
runner-up, or the distance of one column to its threshold; :math:`m_{16} \ge 0`). Float32
predicts the same class whenever the float32 margin of :math:`c`, :math:`m_{32}`, is positive,
i.e. whenever :math:`|m_{16} - m_{32}| < m_{16}`. The copy is re-evaluated in float32 iff

.. math::

    m_{16} \le b \cdot \max(1,\; s / S),

:math:`s` the copy's largest absolute output, :math:`S` the largest seen during calibration
(rounding errors grow with the size of the values, so copies with larger outputs than any
calibrated one get a proportionally wider band).

**Calibration** (per metric, so per model). No rigorous bound on bf16's error exists for a deep
network, so :math:`b` is measured: the first :data:`CALIBRATION_COPIES` perturbed copies (and up
to :data:`CALIBRATION_CLEAN` clean examples of the first batch) are evaluated in both precisions
and :math:`b = ` :data:`SAFETY` :math:`\times \max_i \delta_i`, with
:math:`\delta_i = \max_{c \in \{c_{16}, c_{32}\}} |m_{16}(c) - m_{32}(c)|` the change of the
margin of either precision's class. The calibration copies are decided in float32 (their bf16
values only serve the calibration), so nothing is decided before :math:`b` is known; a batch
with fewer copies continues the calibration into the next ``update``. The bound is empirical —
a safety factor over the worst error seen, not a proof — and the tests check it where it
matters: the flips equal float32's, copy by copy, on the zoo and on trained Hugging Face models
where plain bf16 changes some.

**Cost.** ``num_forward`` counts every copy once (its bf16 forward); ``num_forward_fp32`` counts
the float32 re-evaluations (calibration included), and ``recheck_fraction`` is their share of the
copies. Clean examples are evaluated in float32 (their prediction is the reference every flip is
measured against). The models' clean caches of prefix and local reuse are computed in float32,
as in a float32 run, so a re-checked copy is computed as float32 would.

**Automatic choice** (``precision="auto"``, the default). Checked bf16 runs where it pays: float32
weights of an ``nn.Module``, ``compare="class"``, and a device with native bf16 matrix units — a
CUDA GPU of compute capability ≥ 8.0, or a CPU with AVX-512 BF16 or AMX whose bf16 matrix product
is measured (once per process and thread count) at least :data:`MIN_SPEEDUP` × float32's. The
flags alone are not enough: on a 2-core Xeon VM reporting AVX-512 BF16 (no AMX) a 512³ bf16 product
ran at half float32's speed. Elsewhere every forward runs in the model's own precision.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any, Literal

import torch
from torch import Tensor

from ..tokens.base import model_dtype
from .outputs import margins, predictions

Precision = Literal["auto", "float32", "bf16-checked"]
PRECISIONS: tuple[str, ...] = ("auto", "float32", "bf16-checked")

#: perturbed copies evaluated in both precisions before the bound is fixed
CALIBRATION_COPIES = 256
#: clean examples of the first batch also evaluated in bf16 for the calibration
CALIBRATION_CLEAN = 64
#: the bound is this many times the largest margin change seen in the calibration
SAFETY = 4.0
#: ``"auto"`` picks checked bf16 on a CPU only if bf16 matrix products run this much faster
MIN_SPEEDUP = 1.2


@functools.cache
def _cpu_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` multiplies bf16 matrices in hardware: a CPU with AVX-512 BF16 or AMX
    (and a torch whose kernels use AVX-512), a CUDA GPU of compute capability ≥ 8.0."""
    if device.type == "cuda":
        return (torch.cuda.is_bf16_supported()
                and torch.cuda.get_device_capability(device) >= (8, 0))
    if device.type == "cpu":
        if torch.backends.cpu.get_cpu_capability() not in ("AVX512", "AVX512_BF16", "AMX"):
            return False
        return bool({"avx512_bf16", "amx_bf16"} & _cpu_flags())
    return False


@functools.cache
def _bf16_gemm_speedup(threads: int) -> float:
    """Measured bf16 / float32 throughput of a 512³ matrix product on this CPU (best of
    interleaved runs; cached per thread count). CPUs that report AVX-512 BF16 do not all run
    bf16 faster: on one 2-core Xeon VM bf16 ran at half float32's speed."""
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(512, 512, generator=gen), torch.randn(512, 512, generator=gen)
    pairs = {torch.float32: (a, b), torch.bfloat16: (a.bfloat16(), b.bfloat16())}
    best = dict.fromkeys(pairs, float("inf"))
    for _ in range(3):
        for dtype, (x, y) in pairs.items():
            x @ y  # warm-up (kernel selection)
            start = time.perf_counter()
            for _ in range(4):
                x @ y
            best[dtype] = min(best[dtype], time.perf_counter() - start)
    return best[torch.float32] / best[torch.bfloat16]


def bf16_pays(device: torch.device) -> bool:
    """``precision="auto"``'s test: native bf16 matrix units (:func:`native_bf16`) and, on a
    CPU, a bf16 matrix product measured at least :data:`MIN_SPEEDUP` × float32's."""
    if not native_bf16(device):
        return False
    return device.type != "cpu" or _bf16_gemm_speedup(torch.get_num_threads()) >= MIN_SPEEDUP


def check_precision(precision: Any, autocast: Any, compare: str) -> None:
    """Validate ``precision`` against the other options (an error names the fix)."""
    if precision not in PRECISIONS:
        raise ValueError(
            f"precision must be 'auto', 'float32' or 'bf16-checked', got {precision!r}"
        )
    if precision != "auto" and autocast is not None:
        raise ValueError(
            f"autocast={autocast} runs every forward in low precision and keeps its decisions; "
            f"precision={precision!r} contradicts it. Pass one of them: autocast=torch.bfloat16 "
            "(bf16's own decisions) or precision='bf16-checked' (float32's decisions)"
        )
    if precision == "bf16-checked" and compare != "class":
        raise ValueError(
            f"precision='bf16-checked' keeps float32's class decisions; compare={compare!r} "
            "measures output distances, which bf16 would change — use precision='float32' or "
            "autocast=torch.bfloat16"
        )


def checked(metric: Any, device: torch.device, clean: Tensor) -> bool:
    """Whether this batch runs in checked bf16: asked for (or ``"auto"`` on native-bf16
    hardware), class decisions read from a floating output, and weights in float32 (a float64
    model keeps its own precision; ``"auto"`` also leaves plain callables alone)."""
    if metric.precision == "float32" or metric.autocast is not None:
        return False
    if metric.compare != "class" or not clean.is_floating_point():
        return False
    dtype = model_dtype(metric.model)
    if metric.precision == "auto":
        return dtype == torch.float32 and bf16_pays(device)
    return dtype in (None, torch.float32)


class _Float32Caches:
    """Stands in for the model while copies are evaluated: the clean caches of prefix and
    local reuse (``prefix_cache``/``local_cache``) are computed with autocast off, as in a
    float32 run; everything else is the model's."""

    def __init__(self, model: Any, device_type: str) -> None:
        self._model, self._device_type = model, device_type

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._model(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._model, name)
        if name not in ("prefix_cache", "local_cache"):
            return attr

        def float32(*args: Any, **kwargs: Any) -> Any:
            with torch.autocast(device_type=self._device_type, enabled=False):
                return attr(*args, **kwargs)
        return float32


class Bf16Check:
    """The calibrated bound of one metric and its bookkeeping (see the module docstring)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        #: b, the margin below which a copy is re-checked (None: still calibrating)
        self.bound: float | None = None
        self.scale = 0.0  #: S, the largest absolute output seen in the calibration
        self._deltas: list[float] = []
        self._copies = 0  # calibration copies so far
        self.copies = self.fp32 = 0  # per update: copies evaluated, float32 re-evaluations

    def take_counts(self) -> tuple[int, int]:
        """(copies, float32 re-evaluations) since the last call."""
        out = (self.copies, self.fp32)
        self.copies = self.fp32 = 0
        return out

    @staticmethod
    def wrap(model: Any, device: torch.device) -> _Float32Caches:
        return _Float32Caches(model, device.type)

    def _observe(self, low: Tensor, full: Tensor, kind: str, threshold: float | None) -> None:
        c16 = predictions(low, kind, threshold)
        c32 = predictions(full, kind, threshold)
        delta = torch.maximum((margins(low, c16, kind, threshold)
                               - margins(full, c16, kind, threshold)).abs(),
                              (margins(low, c32, kind, threshold)
                               - margins(full, c32, kind, threshold)).abs())
        delta = torch.where(torch.isfinite(delta), delta, torch.inf)  # bf16 overflow: all rows
        self._deltas.append(float(delta.max()) if len(delta) else 0.0)
        self.scale = max(self.scale, float(full.reshape(len(full), -1).abs().max()))

    def calibrate_clean(self, forward: Callable[[], Tensor], clean: Tensor, device: torch.device,
                        kind: str, threshold: float | None) -> None:
        """Clean examples in bf16 (``forward()`` gives them) against their float32 outputs."""
        if self.bound is not None or self._copies:
            return
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            low = forward()
        self._observe(low.float(), clean.float(), kind, threshold)

    def evaluate(self, forward: Callable[[Tensor | None], Tensor], n: int, device: torch.device,
                 kind: str, threshold: float | None) -> Tensor:
        """Outputs of ``n`` copies, ``forward(rows)`` evaluating the copies ``rows`` (None: all)
        at the current precision: bf16 rows where the margin is safe, float32 rows elsewhere."""
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            low = forward(None).float()
        self.copies += n
        start = 0
        if self.bound is None:  # calibrating: these copies are decided in float32
            start = min(n, CALIBRATION_COPIES - self._copies)
            rows = torch.arange(start, device=low.device)
            full = forward(rows).float()
            self.fp32 += start
            self._observe(low[:start], full, kind, threshold)
            low[:start] = full
            self._copies += start
            if self._copies < CALIBRATION_COPIES:
                return low
            self.bound = SAFETY * max(self._deltas)
        if start == n:
            return low
        rest = low[start:]
        m = margins(rest, predictions(rest, kind, threshold), kind, threshold)
        size = rest.reshape(len(rest), -1).abs().amax(dim=1)
        band = self.bound * (size / max(self.scale, 1e-30)).clamp(min=1.0)
        rows = ((m <= band) | ~torch.isfinite(m)).nonzero().flatten() + start
        if len(rows):
            self.fp32 += len(rows)
            low[rows] = forward(rows).float()
        return low
