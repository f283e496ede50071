"""Option checks and small helpers of the token-wise estimator."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from contextlib import contextmanager
from numbers import Integral, Real
from typing import Any

import torch
from torch import Tensor, nn

from .._exclusive import first_few
from .._seeds import CPU_SEED_END
from ..tokens.base import Inputs, Tokenization, model_dtype


def _resolve_sigma(
    sigma: float | None, variance: float | None, replace_with: Tensor | None
) -> float | None:
    if replace_with is not None:
        if not isinstance(replace_with, Tensor):
            raise TypeError(
                f"replace_with must be a (vocabulary, dim) tensor of token vectors, got "
                f"{type(replace_with).__name__}; e.g. replace_with=torch.eye(vocab_size)"
            )
        if sigma is not None or variance is not None:
            raise ValueError("give either replace_with or a noise level (sigma/variance), not both")
        if replace_with.dim() != 2:
            raise ValueError("replace_with must be a (vocabulary, dim) tensor of token vectors")
        if len(replace_with) == 0:
            # the first update failed inside torch ("random_ expects 'from' to be less than
            # 'to'"), naming neither the option nor the empty vocabulary
            raise ValueError(
                f"replace_with is an empty vocabulary ({tuple(replace_with.shape)}): there is "
                "no token vector to replace a token with; pass at least one row (a vocabulary "
                "filtered down to nothing, say)")
        if ((replace_with.is_floating_point() or replace_with.is_complex())
                and not replace_with.is_meta):
            bad = (~torch.isfinite(replace_with.detach())).any(dim=1)
            if bool(bad.any()):  # once, at construction
                rows = first_few(str(i) for i in bad.nonzero().flatten().tolist())
                # every copy given such a row had a NaN output, refused as "check the model's
                # weights and the inputs", neither of which was the cause
                raise ValueError(
                    f"replace_with has NaN or infinite entries in {int(bad.sum())} of its "
                    f"{len(replace_with)} rows (rows {rows}): a token replaced by one gives "
                    "the model a NaN or infinite input. Drop those rows (replace_with["
                    "torch.isfinite(replace_with).all(dim=1)]) or fix the vocabulary")
        return None
    if (sigma is None) == (variance is None):
        raise ValueError(
            "give exactly one noise level: sigma= (standard deviation) or variance= (σ²); "
            "the paper quotes variances, e.g. variance=15 for text"
        )
    for name, value in (("sigma", sigma), ("variance", variance)):
        if value is not None:
            _check_number(name, value, "0.1")
    if variance is not None:
        if not variance > 0 or not math.isfinite(variance):
            raise ValueError(f"variance must be a positive finite number, got {variance}")
        return math.sqrt(variance)
    assert sigma is not None
    if not sigma > 0 or not math.isfinite(sigma):
        raise ValueError(f"sigma (noise standard deviation) must be positive, got {sigma}")
    return float(sigma)


def _shapes(inputs: Inputs) -> tuple[Any, ...]:
    """Shapes of the input tensors without the batch axis (a key for the probed copy size)."""
    if isinstance(inputs, Tensor):
        return (tuple(inputs.shape[1:]),)
    values = inputs.values() if isinstance(inputs, dict) else inputs
    return tuple(tuple(v.shape[1:]) for v in values if isinstance(v, Tensor))


def _check_number(name: str, value: Any, example: str) -> float:
    """A real number (not a bool, not a string), else a TypeError with an example."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(
            f"{name} must be a number, got {value!r} ({type(value).__name__}); "
            f"e.g. {name}={example}"
        )
    return float(value)


def _check_positive(name: str, value: Any, example: str = "1") -> int:
    """A positive int; bools (an int subclass: ``repeats=True``) and floats are refused."""
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
        raise ValueError(
            f"{name} must be a positive integer, got {value!r} ({type(value).__name__}); "
            f"e.g. {name}={example}"
        )
    return int(value)


def _check_flag(name: str, value: Any) -> bool:
    message = f"{name} must be True or False, got {value!r} ({type(value).__name__})"
    try:
        if isinstance(value, (str, float)) or value is None or value not in (True, False):
            raise TypeError(message)
    except (ValueError, RuntimeError) as err:  # an array or tensor of several values: "The
        raise TypeError(message) from err  # truth value ... is ambiguous", naming no option
    return bool(value)


#: int seeds run from 0 to this, exclusive: ``torch.Generator.manual_seed`` takes 64 bits
SEED_END = 1 << 64



def _check_generator(generator: Any, name: str = "generator") -> None:
    """None, an int seed in [0, 2**64) or a ``torch.Generator``; anything else (a str, a float,
    a bool) is a TypeError that shows both valid forms. A negative seed is a ValueError: torch
    wrapped it round 2**64 without a word (a ``-1`` meant as "a random seed" gave the same
    numbers every run), and a seed of 2**64 or more failed only at the first ``update``, after
    the clean forward, with "Overflow when unpacking long long". Where the seed becomes a CPU
    generator, :func:`_seeded` also refuses seeds from 2**32 on."""
    if generator is None or isinstance(generator, torch.Generator):
        return
    if isinstance(generator, Integral) and not isinstance(generator, bool):
        if not 0 <= int(generator) < SEED_END:
            raise ValueError(
                f"{name} seed must be an int from 0 to 2**64 - 1, got {int(generator)}: torch "
                "takes 64 bits, and a negative seed would stand for another one (no random "
                f"seed: the same numbers every run); e.g. {name}=0, or for a fresh seed each "
                f"run {name}=secrets.randbits(32) (and keep it to reproduce the run; 32 bits, "
                "as torch's CPU generator uses no more of a seed)"
            )
        return
    raise TypeError(
        f"{name} must be a torch.Generator or an int seed, got {generator!r} "
        f"({type(generator).__name__}); e.g. {name}=0 or {name}=torch.Generator().manual_seed(0)"
    )


def _seeded(generator: Any, device: torch.device | str = "cpu",
            name: str = "generator") -> torch.Generator:
    """The generator a measurement draws from: ``generator`` itself when it is a
    ``torch.Generator`` (used as given, its state advancing), else
    ``torch.Generator(device).manual_seed(seed)`` for the int seed (0 for None) — the numbers a
    seed has always given. The seed is checked as :func:`_check_generator` checks it, and on a
    CPU a seed of 2**32 or more is a ValueError: torch's CPU generator keeps only a seed's low
    32 bits, so seed 2**32 + 1 drew exactly the numbers of seed 1, and two 64-bit seeds meant as
    independent repeats (hashes, say) gave one estimate twice, read as two that agree."""
    _check_generator(generator, name)
    if isinstance(generator, torch.Generator):
        return generator
    seed = 0 if generator is None else int(generator)
    device = torch.device(device)
    if device.type == "cpu" and seed >= CPU_SEED_END:
        raise ValueError(
            f"{name}={seed} is 2**32 or more, and torch's CPU generator keeps only a seed's low "
            f"32 bits: it would draw exactly the numbers of {name}={seed % CPU_SEED_END}, so "
            "another seed with the same low 32 bits (two 64-bit hashes meant as independent "
            "repeats, say) would give the same estimate twice. Pass a seed below 2**32 = "
            f"4294967296: {name}={seed % CPU_SEED_END} (that is, seed % 2**32) gives the numbers "
            "this seed gave so far; for new seeds take 32 bits (secrets.randbits(32), or a "
            "hash's & 0xFFFFFFFF, checking that the seeds still differ)"
        )
    return torch.Generator(device=device).manual_seed(seed)


def _takes_hooks(model: nn.Module) -> bool:
    try:
        model.register_forward_pre_hook(lambda *args: None).remove()
    except RuntimeError:  # "register_forward_pre_hook is not supported on ScriptModules"
        return False
    return True


def _check_call_options(model: Any, tokens: Any, autocast: Any, shard: Any) -> None:
    """Types of the arguments that say what is measured and where."""
    if not callable(model):
        raise TypeError(f"model must be an nn.Module or a callable, got {type(model).__name__}")
    if isinstance(model, torch.jit.ScriptModule) and not _takes_hooks(model):
        # senslab hooks into the model (its memory meter, Embedding tokens), which a scripted
        # module does not allow (a traced one does)
        raise TypeError(
            f"model is a TorchScript module ({type(model).__name__}, from torch.jit.script or "
            "torch.jit.load), which takes no forward hooks. Measure the eager model, or pass "
            "the scripted one as a function: lambda t: scripted(t) (after scripted.eval(); "
            "with Patches or Sequence tokens)"
        )
    if not isinstance(tokens, Tokenization):
        hint = (f" — did you mean Patches({tokens})?"
                if isinstance(tokens, int) and not isinstance(tokens, bool) else "")
        raise TypeError(
            f"tokens must be a Tokenization — Patches(p), Embedding('<module>') or Sequence() — "
            f"got {tokens!r} ({type(tokens).__name__}){hint}"
        )
    if autocast is not None and not (
        isinstance(autocast, torch.dtype) and autocast.is_floating_point
    ):
        raise TypeError(
            f"autocast must be a floating dtype such as torch.bfloat16 or torch.float16 (or "
            f"None), got {autocast!r}"
        )
    if autocast is not None and autocast not in (torch.bfloat16, torch.float16):
        # torch.autocast only lowers precision: with another dtype it warns, switches itself
        # off and every forward keeps the model's own precision
        raise ValueError(
            f"autocast={autocast} is no lower precision torch.autocast runs (it only switches "
            "to torch.bfloat16 or torch.float16); for the model's own precision pass nothing, "
            "for float64 convert the model (model.double()) and its inputs"
        )
    if autocast is not None and model_dtype(model) == torch.float64:
        # torch's autocast never casts float64 tensors: every forward would stay float64
        raise ValueError(
            f"autocast={autocast} on a float64 model: torch's autocast leaves float64 "
            "tensors as they are, so every forward would run in float64 and the result would "
            f"show nothing of {autocast}'s decisions. Convert the model and its inputs to "
            "float32 first (model.float(), inputs.float()), or drop autocast= to measure in "
            "float64"
        )
    if shard is not None and not (
        isinstance(shard, (tuple, list)) and len(shard) == 2
        and all(isinstance(v, Integral) and not isinstance(v, bool) for v in shard)
        and 0 <= shard[0] < shard[1]
    ):
        raise ValueError(
            f"shard must be (rank, world_size), 0 <= rank < world_size; got {shard!r}; "
            "e.g. shard=(0, 2)"
        )


@contextmanager
def _eval(model: nn.Module) -> Iterator[None]:
    modes = {m: m.training for m in model.modules()}
    try:
        model.eval()
    except NotImplementedError as err:  # torch.export's ep.module(): "Calling eval() is not
        for m, training in modes.items():  # supported yet"
            m.training = training
        raise ValueError(
            f"{type(model).__name__} cannot be switched to eval mode ({err}): a program from "
            "torch.export keeps the mode it was exported in. Export the model in eval mode "
            "(model.eval() before torch.export.export) and pass eval_mode=False"
        ) from err
    # a module whose train() keeps it training whatever eval() asks (MC dropout, say) is its
    # author's choice, not a switch
    kept = {m for m in modes if m.training}
    try:
        yield
        # the mode is the model's, shared: another thread's model.train() (a training loop
        # beside the measuring thread) put dropout back into the copies' forwards, and the
        # measurement read 0.55 for 0.20 without a word
        switched = [name or type(model).__name__ for name, m in model.named_modules()
                    if m.training and m not in kept]
        if switched:
            shown = first_few(switched)
            raise RuntimeError(
                f"the model was switched to train mode while it was measured in eval mode "
                f"({shown}): another thread's model.train(), or the forward's own, ran its "
                "copies with dropout and batch statistics, so this batch is not counted. Hold "
                "senslab.measure.exclusive(model) around the training step, model.train() "
                "included, or measure a copy of the model (copy.deepcopy)")
    finally:
        for m, training in modes.items():
            m.train(training)
        # train() sets a module's children too: a submodule registered under two parents
        # (a frozen backbone in eval mode, shared by two heads of a training model) was put
        # back in its own mode, then switched by its second parent's train(True) — measuring
        # left a frozen BatchNorm training. Every flag as it was, whatever the order:
        for m, training in modes.items():
            m.training = training


@contextmanager
def _kept_buffers(*tops: nn.Module) -> Iterator[None]:
    """Every buffer of the modules ``tops`` (and their submodules) as it was, after the block:
    a forward in training mode updates BatchNorm's running statistics (even under
    ``torch.inference_mode``), some update a buffer in eval mode too, and measuring must not
    change the model. Buffers are kept by module and name, so one the forward replaced by
    another tensor (``self.buf = self.buf + 1``) is put back. Only a buffer that changed is
    written back: a write bumps its version, and a buffer the caller's pending backward saved
    (a loss computed before measuring) must keep it. Inference tensors are written too.

    A plain tensor attribute (not a buffer) that the block set to an inference tensor — a
    rotary or sinusoidal table a module builds lazily for a longer input than it has seen — is
    put back as it was (removed where there was none): kept, it failed the next training step's
    backward ("Inference tensors cannot be saved for backward"); the module builds it again."""
    saved, seen, attributes = [], set(), []
    for top in tops:
        for owner in top.modules():
            attributes.append((owner, dict(vars(owner))))
            for name, b in owner._buffers.items():
                if b is not None and (id(owner), name) not in seen:
                    seen.add((id(owner), name))
                    # a meta placeholder holds no values: only its slot is kept
                    saved.append((owner, name, b, None if b.is_meta else b.detach().clone()))
    try:
        yield
    finally:
        with torch.inference_mode():  # writes an inference tensor as well as a normal one
            for owner, name, b, v in saved:
                if owner._buffers.get(name) is not b:
                    owner._buffers[name] = b
                if v is not None and not _same(b, v):
                    b.copy_(v)
        for owner, before in attributes:
            _put_back_inference_attributes(owner, before)


def _put_back_inference_attributes(owner: nn.Module, before: dict[str, Any]) -> None:
    """Put back each attribute of ``owner`` (in its ``__dict__``) that is now an inference tensor
    other than the one it held in ``before`` (see :func:`_kept_buffers`)."""
    now = vars(owner)
    for name, value in list(now.items()):
        if (isinstance(value, Tensor) and value.is_inference()
                and before.get(name, _ABSENT) is not value):
            if name in before:
                now[name] = before[name]
            else:
                del now[name]


_ABSENT = object()


def _same(a: Tensor, b: Tensor) -> bool:
    """Equal values, NaN equal to NaN (a buffer holding NaN is unchanged when it still does)."""
    if torch.equal(a, b):
        return True
    if a.shape != b.shape or not a.is_floating_point():
        return False
    return bool(((a == b) | (a.isnan() & b.isnan())).all())


def _identity(one: Any, other: Any) -> list[tuple[str, Any, Any]]:
    """(option, this value, other value) of everything that defines the quantity two
    :class:`TokenSensitivity` metrics measure (what ``merge`` requires to be equal). A module
    in the tokenization (``Embedding(model.norm)``) is written as its dotted name in the
    metric's model, as ``Embedding("norm")`` writes it: the same layer either way, and two
    layers of one shape are told apart (their reprs are equal)."""
    def named(m: Any, value: Any) -> Any:
        if isinstance(value, nn.Module) and isinstance(m.model, nn.Module):
            for name, sub in m.model.named_modules():
                if sub is value and name:
                    return name
        return value  # not a module, or none of the model's (or no model yet): as given

    def tokens(m: Any) -> str:
        t = m.tokens
        if not dataclasses.is_dataclass(t):
            return repr(t)
        keep = [f.name for f in dataclasses.fields(t)  # reuse flags: same numbers
                if f.name != "align" and not f.name.startswith("reuse")]
        return (f"{type(t).__name__}("
                f"{', '.join(f'{k}={named(m, getattr(t, k))!r}' for k in keep)})")

    def vocab(m: Any) -> Any:
        r = m.replace_with
        return None if r is None else f"a {tuple(r.shape)} tensor"

    def selector(m: Any) -> Any:
        return m.output if m.output is None or isinstance(m.output, (int, str)) else "callable"

    pairs = [
        ("sigma", one.sigma, other.sigma),
        ("compare", one.compare, other.compare),
        ("mode", one.mode, other.mode),
        ("tokens", tokens(one), tokens(other)),
        ("replace_with", vocab(one), vocab(other)),
        ("output_kind", one.kind, other.kind),
        ("threshold", one.threshold, other.threshold),
        ("output", selector(one), selector(other)),
        ("align", one.align, other.align),
        # bf16's own decisions (autocast) and a model measured in training mode (dropout on)
        # are other quantities than float32's decisions in eval mode; checked precisions decide
        # as float32 does, so ``precision`` may differ
        ("autocast", _dtype_name(one.autocast), _dtype_name(other.autocast)),
        ("eval_mode", one.eval_mode, other.eval_mode),
    ]
    a, b = one.replace_with, other.replace_with
    if a is not None and b is not None and a.shape == b.shape and not torch.equal(
        a.detach().cpu(), b.detach().cpu().to(a.dtype)
    ):
        pairs.append(("replace_with", "one vocabulary", "another of the same shape"))
    if one.compare != "class":
        pairs = [p for p in pairs if p[0] not in ("output_kind", "threshold")]
    return pairs


def _dtype_name(dtype: torch.dtype | None) -> str | None:
    """``torch.bfloat16`` as ``"torch.bfloat16"`` (a JSON value); None as None."""
    return None if dtype is None else str(dtype)


@contextmanager
def float32_default() -> Iterator[None]:
    """A float16 or bfloat16 default dtype set to float32 while the block runs (put back
    after). Lightning's ``precision="bf16-true"`` and ``"16-true"`` set the default dtype to
    the module's around every step; a measurement there drew its noise and its random token
    choices in that dtype — other numbers than the same measurement anywhere else, from
    coarser draws (and ``allocation="linear"`` failed). Any other default (float32, float64) is
    left as it is, for the model's own forward; the noise is drawn in float32 whatever the
    default (:data:`._noise.DRAW_DTYPE`). :meth:`.tokenwise.TokenSensitivity.update` and
    :meth:`.compare.CompareSensitivity.update` run under it."""
    previous = torch.get_default_dtype()
    if previous not in (torch.float16, torch.bfloat16):
        yield
        return
    torch.set_default_dtype(torch.float32)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)
