r"""int8 matrix products for ``precision="int8-checked"``: every eligible ``F.linear`` of a
forward runs as an int8 product with float32 accumulation scales (:class:`Int8Linears`); a
convolutional model that FX traces runs instead as a static int8 graph (:class:`StaticInt8`).

CPUs with AVX-512 VNNI (and AVX2 ones, through fbgemm's AVX2 kernels) multiply int8 matrices
several times faster than float32; PyTorch's dynamic-quantised linear op uses that: the
weight is quantised once per output channel (symmetric, scale = largest absolute weight of
the row / 127), the input per call over the whole tensor (to 7 bits on a CPU without VNNI:
:func:`reduce_range`), the product accumulates in int32 and
is scaled back to float32 with the bias added. Its error (about 1% of a product's size) is far
larger than bf16's, so it is only used where :mod:`._precision` checks every decision it could
change against float32. The input's scale comes from its range over the whole call, so a
copy's int8 output depends on the other copies of its chunk; its decision does not (it
is float32's), so the numbers do not depend on the chunking. Nor may the check's bound: the
error grows with the quantisation step, the input's range over the whole call stretched to
include 0 (PyTorch's dynamic quantisation always represents 0 exactly), and the weight's
rounding with the input's size, so :mod:`._precision` records these sizes for every call
(:func:`extents`, :attr:`Int8Linears.ranges`) and widens the bound for a chunk whose sizes
exceed the calibration's. The range alone would miss inputs shifted by a constant: the
quantisation step grows with the shift, the range does not.

Which calls are eligible: ``F.linear`` (so every ``nn.Linear``) with float32 CPU input of at
least two dimensions, a float32 2-D weight with at least :data:`MIN_FEATURES` input and output
features (a classifier's head keeps float32: it is cheap, and its rounding lands on the
margins undivided), and no gradient to carry. Everything else runs as it would. A model that
multiplies by its weights some other way (``x @ w.T``, ``torch.addmm``) keeps float32 there.
"""

from __future__ import annotations

import copy
import functools
import math
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from .._exclusive import forward_hooks

#: layers narrower than this (in or out) keep float32
MIN_FEATURES = 64
#: packed weights kept per metric (least recently used dropped first)
MAX_PACKED = 1024


@functools.cache
def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags (``/proc/cpuinfo``; empty where it cannot be read)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


@functools.cache
def reduce_range() -> bool:
    """Whether the dynamic int8 product quantises its input to 7 bits: on a CPU without VNNI
    (AVX2 alone), fbgemm's kernel adds products of 8-bit pairs in 16 bits, which saturate, and
    one saturated sum was seen to err by 11% of a product's largest entry against 1.7% with 7
    bits (512 × 384 Gaussian inputs); with VNNI the 8 bits are exact in 32 bits and halve the
    mean error. Where the flags cannot be read, 7 bits (safe on both)."""
    return not ({"avx512_vnni", "avx_vnni", "amx_int8"} & cpu_flags())


def available() -> bool:
    """Whether this torch has the x86 dynamic-quantised linear kernels (fbgemm)."""
    try:
        engines = torch.backends.quantized.supported_engines
        return ("fbgemm" in engines or "x86" in engines) and hasattr(
            torch.ops.quantized, "linear_dynamic")
    except (AttributeError, RuntimeError):
        return False


def pack(weight: Tensor, bias: Tensor | None) -> Any:
    """The weight quantised per output channel and prepacked with its float32 bias."""
    w = weight.detach().contiguous()
    scale = (w.abs().amax(dim=1).double() / 127.0).clamp(min=1e-12)
    zero = torch.zeros(w.shape[0], dtype=torch.long)
    with warnings.catch_warnings():  # torch marks its quantised tensors deprecated
        warnings.simplefilter("ignore")
        q = torch.quantize_per_channel(w, scale, zero, 0, torch.qint8)
        return torch.ops.quantized.linear_prepack(
            q, None if bias is None else bias.detach().contiguous())


def _key(t: Tensor | None) -> tuple[Any, ...] | None:
    if t is None:
        return None
    return (t.data_ptr(), t._version, tuple(t.shape), t.stride())


def cached(cache: OrderedDict[Any, Any], weight: Tensor, bias: Tensor | None,
           make: Callable[[], Any]) -> Any:
    """``make()`` for this weight and bias, kept in ``cache`` (least recently used out past
    :data:`MAX_PACKED`) by storage address, version, shape and strides; the entry holds
    detached views of the tensors, which keep their storage alive, so an address is never
    reused by another tensor while the entry lives (holding the parameter itself would not:
    ``p.data = new`` frees the old storage while ``p`` lives, and a later tensor of the same
    shape could be allocated there with the same version), and an in-place update bumps the
    version and makes it again. A write through ``.data`` or a NumPy view bumps no version:
    the owner verifies the content (:meth:`Int8Linears.changed`)."""
    if weight.is_inference() or (bias is not None and bias.is_inference()):
        # made inside the forward under inference mode (timm's EVA and BEiT concatenate
        # their query/key/value bias there): no version counter to key a cache on, and a
        # new tensor every call anyway
        return make()
    key = (_key(weight), _key(bias))
    hit = cache.get(key)
    if hit is None:
        hit = cache[key] = (make(), weight.detach(), None if bias is None else bias.detach())
        while len(cache) > MAX_PACKED:
            cache.popitem(last=False)
    cache.move_to_end(key)
    return hit[0]


#: block length of :func:`position_print`'s fixed pseudo-random weights
PRINT_BLOCK = 4096
_PRINT_SEED = 0x1D8


@functools.lru_cache(maxsize=256)
def _probe(n: int, device: torch.device, seed: int) -> Tensor:
    """``n`` fixed pseudo-random float32 weights on ``device`` (never written to), drawn in
    float32 whatever the default dtype: under ``torch.set_default_dtype(torch.float64)`` they
    were float64, and every fingerprint of a float32 weight failed ("dot : expected both vectors
    to have same dtype") — cached, so also later, under the float32 default, in that process."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=g, dtype=torch.float32).to(device)


def position_print(t: Tensor) -> Tensor:
    """A float64 scalar that depends on where each value of ``t`` lies, not only on which
    values it holds: the dot product of its values (flattened in element order) with fixed
    pseudo-random weights, one read of ``t``. A sum and a norm stay exactly the same when a
    weight's rows or columns are permuted (through ``.data``, which bumps no version), and a
    cache keyed on them kept the old weights' int8 copy; this changes with any such permutation
    (a swap of two values changes it by their difference times the difference of their
    weights). The weights are one block of :data:`PRINT_BLOCK` (the same for every tensor)
    times a per-block weight, so a large embedding needs no probe of its size."""
    d = t.detach()
    if d.is_complex():
        d = torch.view_as_real(d)
    flat = d.reshape(-1)
    if flat.dtype != torch.float32:
        flat = flat.float()
    r = _probe(PRINT_BLOCK, flat.device, _PRINT_SEED)
    k = flat.numel() // PRINT_BLOCK
    tail = flat[k * PRINT_BLOCK:]
    out = torch.dot(tail, r[:len(tail)]).double()
    if k:
        blocks = flat[:k * PRINT_BLOCK].view(k, PRINT_BLOCK).mv(r).double()
        out = out + torch.dot(blocks, _probe(k, flat.device, _PRINT_SEED + 1).double())
    return out


@contextmanager
def suspended(mode: Any) -> Iterator[None]:
    """``mode`` (a function mode with an ``_enabled`` flag) passing calls through unchanged for
    the calls inside: the float32 clean caches of prefix and local reuse."""
    was, mode._enabled = mode._enabled, False
    try:
        yield
    finally:
        mode._enabled = was


class Int8Linears(TorchFunctionMode):
    """While active, eligible ``F.linear`` calls run in int8 (see the module docstring).

    Packed weights are cached by storage address, version, shape and strides, and the cache
    holds the weight and bias themselves, so an address is never reused by another tensor
    while its entry lives; an in-place update of a weight bumps its version and repacks it.
    ``off()`` suspends the mode (the float32 clean caches of prefix and local reuse)."""

    def __init__(self) -> None:
        super().__init__()
        self.packs: OrderedDict[Any, Any] = OrderedDict()
        self._used: set[Any] = set()  # keys of the packs looked up since changed() dropped
        self._enabled = True
        self.calls = 0  #: linear calls run in int8 (for tests and reports)
        #: when a list: each int8 call appends its input's :func:`extents` (three values), in
        #: call order
        self.ranges: list[float] | None = None

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.__dict__.setdefault("_used", set())
        if any(not isinstance(made, tuple) for made, _, _ in self.packs.values()):
            self.packs.clear()  # an older pickle's entries, without their fingerprints

    def off(self) -> AbstractContextManager[None]:
        return suspended(self)

    def _packed(self, weight: Tensor, bias: Tensor | None) -> Any:
        if not (weight.is_inference() or (bias is not None and bias.is_inference())):
            self._used.add((_key(weight), _key(bias)))
        return cached(self.packs, weight, bias,
                      lambda: (pack(weight, bias), _contents(weight, bias)))[0]

    def changed(self, drop: bool = True) -> list[str]:
        """The packed weights whose float32 tensors changed since they were packed without
        PyTorch counting a version — a write through ``.data`` or a NumPy view (a permutation
        keeps any sum or norm: :func:`position_print`) — as ``"weight (64, 128)"``, dropped
        (``drop``) so that the next call packs them again. A lookup would otherwise return the
        old weights' int8 copy: a plain callable's model, or a tensor that is not a parameter or
        buffer, has no other check (:func:`weights_state`). One read of every packed weight.

        With ``drop`` (once per batch) the entries no call used since the last such call go
        too: an entry keeps its tensors' storage alive, and a weight replaced through
        ``p.data = new`` at every batch would otherwise pile up old storages and their int8
        copies until :data:`MAX_PACKED`."""
        entries = list(self.packs.items())
        found = []
        if entries:
            now = torch.stack([_contents(w, b) for _, (_, w, b) in entries])
            then = torch.stack([made[1] for _, (made, _, _) in entries])
            for (key, (_, w, b)), same in zip(entries, (now == then).all(dim=1).tolist(),
                                              strict=True):
                if not same:
                    found.append(f"{'weight' if b is None else 'weight and bias'} "
                                 f"{tuple(w.shape)}")
                    if drop:
                        del self.packs[key]
        if drop:
            for key in [k for k in self.packs if k not in self._used]:
                del self.packs[key]
            self._used.clear()
        return found

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        if func is F.linear and self._enabled:
            x = args[0] if args else kwargs.get("input")
            weight = args[1] if len(args) > 1 else kwargs.get("weight")
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            if _eligible(x, weight, bias):
                self.calls += 1
                if self.ranges is not None:
                    self.ranges.extend(extents(x.detach()))
                return torch.ops.quantized.linear_dynamic(x, self._packed(weight, bias),
                                                          reduce_range())
        return func(*args, **kwargs)


def _contents(weight: Tensor, bias: Tensor | None) -> Tensor:
    """:func:`position_print` of ``weight`` and of ``bias`` (0 without one)."""
    return torch.stack([position_print(weight),
                        position_print(bias) if bias is not None
                        else torch.zeros((), dtype=torch.float64, device=weight.device)])


def extents(x: Tensor) -> list[float]:
    """The sizes the error of an int8 product with input ``x`` grows with (one host sync):
    the quantisation range, from ``min(x.min(), 0)`` to ``max(x.max(), 0)`` (PyTorch's dynamic
    quantisation stretches the input's range to include 0, and its step is this range over
    the levels), and the largest absolute value and root mean square of ``x`` (the weight's
    rounding error is multiplied by the input: one value's, and the sum of many). Inputs
    shifted by a constant widen all three, though not ``x.max() - x.min()``. An empty ``x``
    (an expert of a mixture that no row was routed to) has no error: three zeros, so the
    calls keep their places in the call order."""
    if not x.numel():
        return [0.0, 0.0, 0.0]
    lo, hi = torch.aminmax(x)
    zero = lo.new_zeros(())
    rms = torch.linalg.vector_norm(x) / math.sqrt(x.numel())
    return torch.stack([torch.maximum(hi, zero) - torch.minimum(lo, zero),
                        torch.maximum(hi, -lo), rms]).float().tolist()


def _eligible(x: Any, weight: Any, bias: Any) -> bool:
    if not (isinstance(x, Tensor) and isinstance(weight, Tensor)):
        return False
    if x.dtype != torch.float32 or weight.dtype != torch.float32 or x.dim() < 2:
        return False
    if x.device.type != "cpu" or weight.device.type != "cpu" or weight.dim() != 2:
        return False
    if min(weight.shape) < MIN_FEATURES or x.shape[-1] != weight.shape[1]:
        return False
    if bias is not None and (not isinstance(bias, Tensor) or bias.dtype != torch.float32
                             or bias.shape != (weight.shape[0],)):
        return False
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        return False
    return True


class StaticInt8:
    """A convolutional model's int8 copy for ``precision="int8-checked"``: PyTorch's FX graph
    mode static quantisation for x86 (convolutions fused with their BatchNorm and ReLU, weights
    per output channel, activations per tensor; the first and last layer float32). It keeps
    activations in int8 between layers, where a per-layer quantised product would quantise and
    dequantise every layer's input.

    Its activation ranges come from observers run in float32 on the inputs :meth:`build` is
    given (the metric's perturbed copies of its first examples: noisy inputs set them) before it
    is converted.
    While :attr:`active` the metric's stand-in model runs it on whole copies (local reuse needs
    the float model's clean maps, so it is off for the int8 pass). If converting or running
    the quantised graph fails, every call returns the float model's outputs (:attr:`failed`;
    the metric then runs float32; a graph that fails after it was built is said once, with a
    warning)."""

    def __init__(self, model: nn.Module) -> None:
        self.float_model = model
        self.model: nn.Module | None = None
        self.active = False
        self.failed = False

    @staticmethod
    def applies(model: Any) -> bool:
        """Whether ``model`` is a module with a 2-D convolution that FX can trace (no control
        flow on tensor values), and no forward hooks (:func:`forward_hooks`: the traced copy
        would run without them, another function than the model's), and this torch has the
        x86 static kernels. And every module in eval mode: the copy is made and traced in eval
        mode (:meth:`build`), so a model measured in its own train mode (``eval_mode=False``)
        would run another function there (a branch on ``self.training``): every copy was
        re-checked in float32, and rare differences were left to the spot checks."""
        if not (isinstance(model, nn.Module) and available()
                and hasattr(torch.ops.quantized, "conv2d_prepack")
                and any(isinstance(m, nn.Conv2d) for m in model.modules())
                and not any(m.training for m in model.modules())
                and not forward_hooks(model)):
            return False
        try:
            torch.fx.symbolic_trace(model)
        except Exception:  # noqa: BLE001 -- tracing raises many kinds; the model stays float
            return False
        return True

    @torch.no_grad()
    def build(self, x: Tensor) -> None:
        """Quantise: observers run in float32 on inputs ``x`` set the activations' ranges, then
        the graph is converted; a failure leaves the model float (:attr:`failed`)."""
        if self.model is not None or self.failed:
            return
        from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

        try:  # convert_fx draws from torch's global generator: the caller's stream is kept
            with warnings.catch_warnings(), torch.random.fork_rng(devices=[]):
                warnings.simplefilter("ignore")  # torch marks torch.ao.quantization deprecated
                prepared = prepare_fx(copy.deepcopy(self.float_model).eval(),
                                      _qconfigs(self.float_model), example_inputs=(x[:1],))
                for part in x.split(64):
                    prepared(part)
                model = convert_fx(prepared)
                model(_channels_last(x[:1]))  # the quantised graph runs
            self.model = model
        except Exception:  # noqa: BLE001 -- an op without an int8 kernel, or another failure
            self.failed = True

    @torch.no_grad()
    def __call__(self, x: Tensor) -> Tensor:
        if self.model is not None:  # else failed (:meth:`build` runs before the first call)
            try:
                return self.model(_channels_last(x))
            except Exception as e:  # noqa: BLE001 -- an int8 kernel refusing this input
                # the float model from here on, said once (the quantised graph's raw error
                # had ended the measurement, although the docstring promised float's outputs)
                self.model, self.failed = None, True
                warnings.warn(
                    f"precision='int8-checked': the static int8 copy of the model failed on "
                    f"inputs of shape {tuple(x.shape)} ({type(e).__name__}: {e}); the copies "
                    "run in float32 from here on (float32's numbers, at float32's speed). "
                    "Pass precision='float32' to skip the int8 copy", RuntimeWarning,
                    stacklevel=2)
        return self.float_model(x)


def weights_state(model: Any) -> list[tuple[Any, ...]] | None:
    """Storage address, version counter and a content fingerprint (the float64 sum and norm,
    and :func:`position_print`) of every parameter and buffer of ``model`` (None for a plain
    callable): an in-place update bumps the version, a replaced tensor changes the address,
    and a write through ``.data`` or a NumPy view (``p.data.add_(-lr * p.grad)``, a permutation
    of a weight's rows), which bumps no version, changes the content, so a training step, a
    loaded state or a permuted weight changes it. The sum and norm alone missed a permutation
    (and an index buffer's reordering): the old weights' int8 copy and bound were kept. Three
    reads of the weights, one host sync."""
    if not isinstance(model, nn.Module):
        return None
    tensors = [t for t in (*model.parameters(), *model.buffers()) if t.numel()]
    if not tensors:
        return []
    sums = []
    for t in tensors:
        d = t.detach()
        if d.is_complex() or d.dtype == torch.bool:
            d = torch.view_as_real(d) if d.is_complex() else d.to(torch.uint8)
        norm = (torch.linalg.vector_norm(d, dtype=torch.float64) if d.is_floating_point()
                else d.double().abs().sum())
        sums.append(torch.stack([d.sum(dtype=torch.float64), norm, position_print(d)]))
    prints = torch.stack([v.to(sums[0].device) for v in sums]).tolist()
    return [(t.data_ptr(), _version(t), *f) for t, f in zip(tensors, prints, strict=True)]


def _version(t: Tensor) -> int | None:
    """``t``'s version counter; None for an inference tensor (a model built or loaded under
    ``torch.inference_mode()``), which keeps none: reading it raised, and every checked
    precision, ``"auto"`` included, failed with torch's raw error. Its content is still
    compared (:func:`weights_state`)."""
    if t.is_inference():
        return None
    return t._version


def attributes_state(model: Any) -> list[tuple[str, str, str]] | None:
    """(module, attribute, repr) of every module's class and every plain Python value (bool,
    int, float, str, None) that a module of ``model`` holds as an attribute, ``training``
    included, and the forward hooks (:func:`forward_hooks`) last (None for a plain callable).
    A static int8 copy is a traced graph that bakes such values in as constants (a logit
    shift, a temperature, a flag a forward branches on, which module runs) and runs without
    hooks: a value changed, a module swapped or a hook registered between batches would leave
    the copy computing another function than the model, so it is part of what makes a new
    copy (and a hooked model gets none)."""
    if not isinstance(model, nn.Module):
        return None
    # the class of each module too: a parameterless module swapped for another of the same
    # plain attributes (``nn.Tanh`` for ``nn.Sigmoid``) left the copy running the old one
    return [(name, key, repr(value)) for name, module in model.named_modules()
            for key, value in [("class", _class(module)), *sorted(vars(module).items())]
            if isinstance(value, (bool, int, float, str, type(None)))] + [
        ("", "forward hooks", repr(forward_hooks(model)))]


def _class(module: nn.Module) -> str:
    return f"{type(module).__module__}.{type(module).__qualname__}"


def _channels_last(x: Tensor) -> Tensor:
    """Images in the layout x86's int8 convolutions compute in (channels last): a residual sum
    of a float layer's output and an int8 one's otherwise mixes layouts, which its int8 add
    runs several times slower."""
    return x.contiguous(memory_format=torch.channels_last) if x.dim() == 4 else x


def _qconfigs(model: nn.Module) -> Any:
    """x86's default static quantisation settings, but the model's first and last layer
    (convolution or linear, in the order its forward calls them: :func:`_ends`) kept float: the
    first takes the noisy input at full precision, the last puts out the margins the check
    reads."""
    from torch.ao.quantization import get_default_qconfig_mapping

    mapping = get_default_qconfig_mapping("x86")
    for name in _ends(model):
        mapping.set_module_name(name, None)
    return mapping


def _ends(model: nn.Module) -> set[str]:
    """Names of the first and last convolution or linear layer that ``model``'s forward calls
    (its FX graph's order), else, where the graph calls none as a module, in module order.
    Module order alone follows ``__init__``: a head declared before the last convolution had
    the head quantised (its outputs clamped to the calibrated range, the margins the check
    reads among them: 7.3 read as 4.4) and that convolution kept float."""
    kinds = (nn.Conv2d, nn.Linear)
    modules = dict(model.named_modules())
    try:
        graph = torch.fx.symbolic_trace(model).graph
        names = [str(n.target) for n in graph.nodes
                 if n.op == "call_module" and isinstance(modules.get(str(n.target)), kinds)]
    except Exception:  # noqa: BLE001 -- tracing raises many kinds: module order then
        names = []
    if not names:
        names = [n for n, m in modules.items() if isinstance(m, kinds)]
    return {names[0], names[-1]} if names else set()
