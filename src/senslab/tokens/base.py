"""How an input is cut into tokens and how one token (or all of them) is perturbed.

A :class:`Tokenization` is bound to a model and a batch inside a context manager. The bound object
runs the clean forward pass once, exposes the token layout (``num_tokens``, ``dim`` and a boolean
``valid`` mask of shape ``(B, T)``), and then evaluates the model on *perturbed copies*: copy ``n``
is example ``src[n]`` with ``noise[n]`` added to its token ``tok[n]``. All copies of a chunk are
built with tensor ops on the model's device and evaluated in one forward pass.
"""

from __future__ import annotations

import abc
import inspect
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Literal

import torch
from torch import Tensor, nn

Inputs = Tensor | tuple | list | dict


#: dict entries that hold the examples themselves (Hugging Face's names): the batch is theirs
MAIN_KEYS = ("input_ids", "inputs_embeds", "pixel_values", "input_values", "input_features")


def batch_size(inputs: Inputs) -> int:
    """Number of examples in ``inputs``: the first dimension of a dict's examples
    (:data:`MAIN_KEYS`: ``input_ids``…), else of its first tensor that has one (a 0-dim tensor,
    a dict's ``temperature=torch.tensor(2.0)`` say, is no batch and was read as one, an
    IndexError). A dict's ``position_ids`` of shape (1, T), broadcast over the batch and placed
    before ``input_ids``, was read as a batch of one, and the measurement refused the rest as
    sequence-first outputs."""
    if isinstance(inputs, dict):
        main = next((inputs[k] for k in MAIN_KEYS
                     if isinstance(inputs.get(k), Tensor) and inputs[k].dim() > 0), None)
        if main is not None:
            return main.shape[0]
    for t in _tensors(inputs):
        if t.dim() > 0:
            return t.shape[0]
    if any(True for _ in _tensors(inputs)):
        raise ValueError(f"inputs hold no tensor with a batch axis, only 0-dim ones "
                         f"({_kinds(inputs)}): pass the examples as (batch, ...) tensors")
    raise TypeError(f"inputs hold no tensor ({_kinds(inputs)}): pass a Tensor, a tuple of "
                    "Tensors or a dict of Tensors. Tokenizer output needs return_tensors='pt'; "
                    "a model whose forward takes one dict (features) is measured through a "
                    "wrapper whose forward(**features) calls it, given the dict itself")


def _kinds(inputs: Any) -> str:
    """What ``inputs`` holds, in words: its type and, for a container, its entries' types."""
    if isinstance(inputs, Mapping):
        inner = ", ".join(f"{k!r}: {type(v).__name__}" for k, v in list(inputs.items())[:4])
        return f"a {type(inputs).__name__} of {{{inner}{', …' if len(inputs) > 4 else ''}}}"
    if isinstance(inputs, (tuple, list)):
        inner = ", ".join(type(v).__name__ for v in inputs[:4])
        return f"a {type(inputs).__name__} of ({inner}{', …' if len(inputs) > 4 else ''})"
    return f"a {type(inputs).__name__}"


def _tensors(inputs: Inputs) -> Iterator[Tensor]:
    if isinstance(inputs, Tensor):
        yield inputs
    elif isinstance(inputs, dict):
        yield from (v for v in inputs.values() if isinstance(v, Tensor))
    elif isinstance(inputs, (tuple, list)):
        yield from (v for v in inputs if isinstance(v, Tensor))


def rebuilt(inputs: tuple | list, values: Iterator[Any] | list[Any]) -> tuple | list:
    """A tuple or list of ``inputs``' own type holding ``values``: a named tuple (a
    ``NamedTuple`` batch from a collate function) takes its fields as arguments, where
    ``type(inputs)(values)`` failed with "missing required positional arguments"."""
    if isinstance(inputs, tuple) and hasattr(inputs, "_fields"):
        return type(inputs)(*values)
    return type(inputs)(values)


#: dict entries of Hugging Face models that are the model's, not the examples': a head mask of
#: shape (heads,) or (layers, heads), whose first (or second) axis could have the batch's (or
#: the tokens') length by chance — picked by rows (12 layers, a batch of 12) or cut, each layer
#: got another one's mask without a word
NOT_PER_EXAMPLE = frozenset({"head_mask", "decoder_head_mask", "cross_attn_head_mask"})


def per_example(key: Any) -> bool:
    """Whether a dict entry ``key`` may hold per-example values (not :data:`NOT_PER_EXAMPLE`)."""
    return key not in NOT_PER_EXAMPLE


def select(inputs: Inputs, index: Tensor) -> Inputs:
    """Rows ``index`` of every batch-shaped tensor in ``inputs`` (other values pass through, and
    so do a dict's :data:`NOT_PER_EXAMPLE` entries whatever their shape)."""
    b = batch_size(inputs)

    def pick(v: Any) -> Any:
        if isinstance(v, Tensor) and v.dim() > 0 and v.shape[0] == b:
            return v.index_select(0, index.to(v.device))
        return v

    if isinstance(inputs, Tensor):
        return pick(inputs)
    if isinstance(inputs, dict):
        return {k: pick(v) if per_example(k) else v for k, v in inputs.items()}
    return rebuilt(inputs, (pick(v) for v in inputs))


#: dict entries of an encoder-decoder model's decoder side (``decoder_input_ids``,
#: ``decoder_attention_mask``…): their positions are the decoder's, never the inputs' tokens
DECODER_PREFIX = "decoder_"


def cut_tokens(inputs: Inputs, t: int, width: int) -> Inputs:
    """``inputs`` cut to their first ``width`` tokens: every tensor with at least two axes whose
    second axis has the token count ``t`` (``input_ids``, ``attention_mask``,
    ``token_type_ids``, ``position_ids``, a (B, T, D) ``inputs_embeds``…) keeps
    ``[:, :width]``; other values pass unchanged, and so do a dict's ``decoder_…`` entries,
    whose second axis counts decoder positions even where it has the inputs' length (cut, a
    teacher-forced decoder lost its later positions without a word)."""
    if width >= t:
        return inputs

    def cut(v: Any) -> Any:
        if isinstance(v, Tensor) and v.dim() >= 2 and v.shape[1] == t:
            return v[:, :width]
        return v

    if isinstance(inputs, Tensor):
        return cut(inputs)
    if isinstance(inputs, dict):
        return {k: v if str(k).startswith(DECODER_PREFIX) or not per_example(k) else cut(v)
                for k, v in inputs.items()}
    return rebuilt(inputs, (cut(v) for v in inputs))


def has_token_axis(inputs: Inputs, t: int) -> bool:
    """Whether some input tensor has ``t`` entries on its second axis (what :func:`cut_tokens`
    cuts)."""
    if isinstance(inputs, dict):
        inputs = {k: v for k, v in inputs.items()
                  if not str(k).startswith(DECODER_PREFIX) and per_example(k)}
    return any(v.dim() >= 2 and v.shape[1] == t for v in _tensors(inputs))


#: which part of a model's raw output holds the logits: an index into a tuple/list, a key (or
#: attribute) of a mapping/object, or a function of the raw output; None: see :func:`select_output`
OutputSelector = int | str | Callable[[Any], Tensor] | None


def check_selector(output: Any) -> None:
    """An error unless ``output`` is a valid ``output=`` selector."""
    if output is None or isinstance(output, str) or callable(output):
        return
    if isinstance(output, int) and not isinstance(output, bool):
        return
    raise TypeError(
        f"output= selects the logits in the model's raw output and must be an int index, a str "
        f"key or a function of the raw output, got {output!r} ({type(output).__name__}); "
        "e.g. output=1 for a (features, logits) tuple, output='logits' for a dict"
    )


def _describe(raw: Any) -> str:
    def one(v: Any) -> str:
        return f"Tensor{tuple(v.shape)}" if isinstance(v, Tensor) else type(v).__name__

    if isinstance(raw, Mapping):
        return "{" + ", ".join(f"{k!r}: {one(v)}" for k, v in raw.items()) + "}"
    if isinstance(raw, (tuple, list)):
        return "(" + ", ".join(f"[{i}] {one(v)}" for i, v in enumerate(raw)) + ")"
    return one(raw)


def select_output(raw: Any, output: OutputSelector = None) -> Tensor:
    """The logits tensor in a model's raw output.

    ``output`` None: a Tensor as it is; an object with ``.logits`` (Hugging Face
    ``ModelOutput``) or a mapping with a ``"logits"`` key: that entry; a tuple/list with a single
    element: that element. A longer tuple/list, or a mapping without ``"logits"``, is refused —
    a ``(features, logits)`` pair must not be read as its first element — with a message that
    lists the elements and the ``output=`` to pass. ``output`` int: ``raw[output]`` of a
    tuple/list; str: ``raw[output]`` of a mapping, else ``getattr(raw, output)``; callable:
    ``output(raw)``.
    """
    if output is None:
        if isinstance(raw, Tensor):
            return raw
        logits = getattr(raw, "logits", None)
        if isinstance(logits, Tensor):
            return logits
        if isinstance(raw, Mapping) and isinstance(raw.get("logits"), Tensor):
            return raw["logits"]
        if isinstance(raw, (tuple, list)) and len(raw) == 1 and isinstance(raw[0], Tensor):
            return raw[0]
        if isinstance(raw, (tuple, list)) and raw \
                and all(isinstance(v, Tensor) and v.dim() >= 3 for v in raw):
            # feature maps (timm features_only): no element holds (batch, classes) logits
            raise TypeError(
                f"model returned {type(raw).__name__} {_describe(raw)}: feature maps, no "
                "(batch, classes) logits, so there is no class to change. Measure a model with "
                "a classifier head, or how far a feature map moves: compare='l2' with "
                "output=<index> (e.g. output=-1, the last map)"
            )
        if isinstance(raw, (tuple, list)) and raw:
            hint = "output=<index>, e.g. output=1 for (features, logits)"
        elif isinstance(raw, Mapping) and "last_hidden_state" in raw:
            # a base model (no head): its hidden states hold no class to flip
            raise TypeError(
                f"model returned {type(raw).__name__} {_describe(raw)}: hidden states, no "
                "logits — the model has no head, so there is no class to change. Measure a "
                "model with a classification head (e.g. AutoModelForSequenceClassification), or "
                "how far a representation moves: compare='l2' with output='pooler_output' or "
                "output=<a function pooling last_hidden_state>"
            )
        elif isinstance(raw, Mapping) and raw:
            hint = _mapping_hint(raw)
        else:
            hint = "output=<a function of the raw output that returns the logits tensor>"
        raise TypeError(
            f"model returned {type(raw).__name__} {_describe(raw)}, not a logits tensor; say "
            f"which part holds the logits with {hint}"
        )
    if isinstance(output, int) and not isinstance(raw, (tuple, list)):
        raise TypeError(
            f"output={output} indexes a tuple/list output, but the model returned "
            f"{type(raw).__name__} {_describe(raw)}; drop output= for a plain tensor"
        )
    try:
        if callable(output) and not isinstance(output, str):
            got = output(raw)
        elif isinstance(output, str) and not isinstance(raw, Mapping):
            got = getattr(raw, output)
        else:
            got = raw[output]  # type: ignore[index]
    except (IndexError, KeyError, TypeError, AttributeError) as err:
        raise TypeError(
            f"output={output!r} does not select anything in the model's output "
            f"{type(raw).__name__} {_describe(raw)}: {err}"
        ) from err
    if not isinstance(got, Tensor):
        raise TypeError(
            f"output={output!r} selected a {type(got).__name__}, not a tensor, from the model's "
            f"output {type(raw).__name__} {_describe(raw)}"
        )
    return got


def _mapping_hint(raw: Mapping) -> str:
    """What to pass for a mapping output without ``"logits"``: a key only where its entry could
    be logits (a floating (batch, classes) tensor) — the first key (``input_ids`` of a
    sentence-transformers output) measured 0 flips of ids that never change; embeddings are
    measured by how far they move."""
    floats = {k: v for k, v in raw.items() if isinstance(v, Tensor) and v.is_floating_point()}
    two_d = [k for k, v in floats.items() if v.dim() == 2]
    embedding = [k for k in two_d if any(w in str(k).lower() for w in ("embed", "pool",
                                                                       "hidden", "feature"))]
    if embedding:
        return (f"output=<key> if one of its entries is a (batch, classes) logits tensor; "
                f"{embedding[0]!r} looks like an embedding, whose argmax is no class: measure "
                f"how far it moves with compare='l2', output={embedding[0]!r}")
    if two_d:
        return (f"output=<key> of its (batch, classes) logits entry, e.g. output={two_d[0]!r} "
                "if that is the logits; an embedding is measured by how far it moves "
                f"(compare='l2', output={two_d[0]!r})")
    return ("output=<key> or <a function of the output> giving (batch, classes) logits; none "
            "of its entries is a floating (batch, classes) tensor, so for a representation "
            "measure how far it moves with compare='l2' and output=<a function pooling it>")


#: where a per-position output (batch, positions, classes) is read (see :func:`read_position`)
Position = Literal["last"] | int | None


def check_position(position: Any) -> None:
    """An error unless ``position`` is ``"last"``, an int or None."""
    if position is None or position == "last":
        return
    if isinstance(position, int) and not isinstance(position, bool):
        return
    raise ValueError(
        f"position must be 'last' (each example's last real token), an int (k ≥ 0: position k; "
        f"negative: counted back from the last real token, −1 = last) or None (the whole "
        f"per-position output), got {position!r}"
    )


def last_real(real: Tensor) -> Tensor:
    """(B,) index of each row's last true entry of a (B, T) bool mask (−1 for an empty row)."""
    idx = torch.arange(real.shape[1], device=real.device)
    return torch.where(real, idx, torch.full_like(idx, -1)).max(dim=1).values


def first_real(real: Tensor) -> Tensor:
    """(B,) index of each row's first true entry of a (B, T) bool mask (T for an empty row)."""
    t = real.shape[1]
    idx = torch.arange(t, device=real.device)
    return torch.where(real, idx, torch.full_like(idx, t)).min(dim=1).values


def real_rows(out: Tensor, ends: Tensor, width: int, full: int,
              starts: Tensor | None = None) -> Tensor:
    """A per-position output kept whole (``position=None``) on its real rows only.

    ``out`` of shape (N, L, V) with ``L == width`` (the token count of the forward that made
    it, ``full`` uncut) becomes (N, full, V): each row ``n``'s positions after ``ends[n]``, its
    last real token, are zero, as are those a cut copy lacks, and with ``starts`` (each row's
    first real token) those before ``starts[n]``, left padding. A distance between such outputs
    then counts the real positions only: the padding's own outputs, which move with the real
    tokens' noise where a padding query attends to them (a causal LM's, an encoder's), would
    otherwise enter it, by an amount that depends on how much padding the batch has (left
    padding entered it, and the same texts measured otherwise left-padded than right-padded).
    Any other output is returned as it is."""
    if out.dim() != 3 or out.shape[1] != width:
        return out
    pos = torch.arange(width, device=out.device)
    keep = pos[None, :] <= ends.to(out.device)[:, None]
    if starts is not None:
        keep &= pos[None, :] >= starts.to(out.device)[:, None]
    out = out * keep[:, :, None].to(out.dtype)
    if width < full:
        out = torch.cat([out, out.new_zeros(out.shape[0], full - width, *out.shape[2:])], 1)
    return out


def read_position(out: Tensor, ends: Tensor, position: Position, width: int,
                  starts: Tensor | None = None) -> Tensor:
    """A per-position output read at one position per row.

    ``out`` of shape (N, L, V) with ``L == width`` (the token count of the forward that made it)
    is a per-position output — a causal language model's logits — and becomes (N, V): row ``n``
    read at ``ends[n]`` (its last real token) for ``position="last"``, at ``k`` for an int
    ``k ≥ 0``, at ``ends[n] + 1 + k`` for a negative ``k`` (−1 = the last real token). Any
    other output, and every output with ``position=None``, is returned as it is. A position
    that is padding (after the last real token) or before the start is refused; with
    ``starts`` (each row's first real token), so is one before it: left padding, whose output
    never changes with the real tokens' noise in a model that masks it.
    """
    if position is None or out.dim() != 3 or out.shape[1] != width:
        return out
    ends = ends.to(out.device)
    if position == "last":
        at = ends
    else:
        k = int(position)
        at = torch.full_like(ends, k) if k >= 0 else ends + 1 + k
        first = torch.zeros_like(ends) if starts is None else starts.to(out.device)
        bad = ((at > ends) | (at < first)) & (ends >= 0)
        if bool(bad.any()):
            rows = bad.nonzero().flatten()[:5].tolist()
            last = ends[bad][:5].tolist()
            left = ((at < first) & (first > 0) & (ends >= 0))
            if starts is not None and bool(left.any()):
                rows = left.nonzero().flatten()[:5].tolist()
                raise ValueError(
                    f"position={k} is left padding in examples {rows} (their first real token "
                    f"is at {first[left][:5].tolist()}): the output there is the padding's, "
                    "which the noise on the real tokens does not reach, so those examples "
                    "would measure about 0. Pad on the right (Hugging Face: "
                    "tokenizer.padding_side = 'right'), or choose a position every example "
                    "has: position='last' or a small negative one (−1 = the last real token)"
                )
            raise ValueError(
                f"position={k} is outside the real tokens of examples {rows} (their last real "
                f"token is at {last}); choose a position every example has, e.g. "
                "position='last' or a small negative one (−1 = the last real token)"
            )
    at = at.clamp(min=0)
    return out[torch.arange(out.shape[0], device=out.device), at]


def forward(model: nn.Module | Any, inputs: Inputs) -> Any:
    """``model`` on ``inputs`` (tensor → positional, tuple → *args, dict → **kwargs): its raw
    output."""
    if isinstance(inputs, Tensor):
        return model(inputs)
    if isinstance(inputs, dict):
        return model(**inputs)
    return model(*inputs)


def call_model(model: nn.Module | Any, inputs: Inputs, output: OutputSelector = None) -> Tensor:
    """Call ``model`` on ``inputs`` (:func:`forward`) and return the logits tensor of its output
    (:func:`select_output`)."""
    return select_output(forward(model, inputs), output)


def model_device(model: nn.Module | Any) -> torch.device | None:
    """Device of the model's first parameter or buffer (``None`` for a parameter-free callable)."""
    if isinstance(model, nn.Module):
        for t in model.parameters():
            return t.device
        for t in model.buffers():
            return t.device
    return None


def _refuse_meta(model: nn.Module | Any, inputs: Inputs) -> None:
    """Refuse a model with parameters on the ``meta`` device, or inputs there: meta tensors
    have shapes but no values, so no output can be computed. Without this the user was told to
    move the images to ``meta`` (a model whose first parameter is there) or got a PyTorch error
    from deep inside the forward (one layer on meta). A model with Hugging Face accelerate's
    hooks (``_hf_hook``) whose weights are offloaded (on meta, moved in at each forward:
    ``cpu_offload``, ``device_map`` entries ``"cpu"``/``"disk"`` beside a GPU) is refused too,
    with the fix: it was let through, and the user was told to move the inputs to ``meta``, or
    the measurement failed inside with "Cannot copy out of meta tensor" (it reads the weights
    between forwards). A buffer on meta (an unused placeholder) is allowed."""
    if isinstance(model, nn.Module):
        meta = [n for n, t in model.named_parameters() if t.is_meta]
        shown = ", ".join(map(repr, meta[:3])) + (f" and {len(meta) - 3} more"
                                                  if len(meta) > 3 else "")
        if meta and any(hasattr(m, "_hf_hook") for m in model.modules()):
            raise ValueError(
                f"the model's parameters {shown} are offloaded by accelerate: they stay on the "
                "'meta' device and are moved in at each forward (cpu_offload, disk_offload, or "
                "from_pretrained(device_map=...) that put some layers on 'cpu' or 'disk'). "
                "senslab reads the weights between forwards, so it cannot measure such a "
                "model; load it whole onto one device — from_pretrained(..., "
                "device_map={'': 'cuda:0'}) or device_map='cpu', or a max_memory that fits "
                "every layer — and measure that")
        if meta:
            raise ValueError(
                f"the model's parameters {shown} are on the 'meta' device: they have shapes "
                "but no values (a model built under torch.device('meta') or init_empty_weights, "
                "or weights never loaded), so it cannot compute an output. Give it real weights "
                "first — model.to_empty(device='cpu') and then model.load_state_dict(weights), "
                "or load it from a checkpoint — and measure that")
    if any(t.is_meta for t in _tensors(inputs)):
        raise ValueError(
            "the inputs are on the 'meta' device: they have shapes but no values, so no "
            "sensitivity can be measured on them; pass the real images (or tokens) on the "
            "model's device")


def check_device(model: nn.Module | Any, inputs: Inputs) -> torch.device:
    """The device to compute on; an error if the inputs live elsewhere than the model, or the
    model or the inputs are on the ``meta`` device (:func:`_refuse_meta`)."""
    _refuse_meta(model, inputs)
    dev = model_device(model)
    for t in _tensors(inputs):
        if dev is None:
            dev = t.device
        elif t.device != dev:
            raise ValueError(
                f"inputs are on {t.device} but the model is on {dev}; move them first, "
                f"e.g. inputs.to('{dev}')"
            )
    return dev if dev is not None else torch.device("cpu")


def model_dtype(model: nn.Module | Any) -> torch.dtype | None:
    """dtype of the model's first floating parameter or buffer (``None`` if it has none)."""
    if isinstance(model, nn.Module):
        for t in list(model.parameters()) + list(model.buffers()):
            if t.is_floating_point():
                return t.dtype
    return None


def check_floating(x: Tensor, what: str, convert: str) -> None:
    """Refuse non-floating inputs where noise is added to the input itself: cast to the input's
    dtype, Gaussian noise would wrap around (uint8) or be truncated (int64) — a wrong number."""
    if not x.is_floating_point():
        raise TypeError(
            f"{what} are {x.dtype}, but the noise is added to them: cast back to {x.dtype} it "
            f"would be rounded (and wrap around for uint8), giving wrong sensitivities. Convert "
            f"them first: {convert}"
        )


class DtypeClash(TypeError):
    """The inputs' dtype is not the model's weights', and the model failed on them."""


#: the size checks of timm's patch embeddings (``timm.layers.PatchEmbed``, TNT's own):
#: "Input height (32) doesn't match model (224).", "Input image size (32*32) doesn't match
#: model (224*224).", "Input width (56) should be divisible by patch size (16)."
_TIMM_SIZE = re.compile(r"Input (height|width|image size) \((\d+)(?:\*(\d+))?\) "
                        r"(doesn't match model|should be divisible by patch size) \((\d+)")


def _timm_size_error(model: Any, x: Tensor, err: BaseException) -> ValueError | None:
    """The error to raise instead of ``err`` where ``err`` is a timm patch embedding's refusal
    of the images' size (:data:`_TIMM_SIZE`, raised from timm's code): it names the size the
    model was built for and the fixes. None for any other error, which is raised as it is."""
    found = _TIMM_SIZE.search(str(err))
    if found is None:
        return None
    tb, embed = err.__traceback__, None
    while tb is not None:  # the innermost timm module in the traceback: the patch embedding
        frame = tb.tb_frame
        own = frame.f_locals.get("self")
        if str(frame.f_globals.get("__name__", "")).startswith("timm.") \
                and isinstance(own, nn.Module):
            embed = own
        tb = tb.tb_next
    if embed is None:  # not raised from timm's code
        return None
    axis, first, second, check, number = found.groups()
    four = x.dim() == 4 if isinstance(x, Tensor) else False
    if axis == "image size":
        got = (int(first), int(second))
    elif axis == "height":
        got = (int(first), int(x.shape[-1]) if four and x.shape[-2] == int(first) else int(first))
    else:
        got = (int(x.shape[-2]) if four and x.shape[-1] == int(first) else int(first), int(first))
    timm_model = next((m for m in (model.modules() if isinstance(model, nn.Module) else ())
                       if isinstance(getattr(m, "pretrained_cfg", None), dict)), None)
    cfg = timm_model.pretrained_cfg if timm_model is not None else {}
    arch = cfg.get("architecture") or "<model name>"
    params = (inspect.signature(type(timm_model).__init__).parameters
              if timm_model is not None else {})
    shape = f"of shape {tuple(x.shape)} " if isinstance(x, Tensor) else ""
    said = str(err).splitlines()[0] if str(err) else type(err).__name__
    if check.startswith("should"):
        patch = int(number)
        fits = tuple(max(patch, g // patch * patch) for g in got)
        return ValueError(
            f"the images {shape}are {got[0]}×{got[1]} pixels, which the model's patch "
            f"embedding ({type(embed).__name__}) cannot cut into {patch}×{patch} patches: "
            f"timm refused them ({said}). Resize or crop the images to a multiple of {patch} "
            f"(e.g. {fits[0]}×{fits[1]}: torch.nn.functional.interpolate(images, "
            f"size={fits}, mode='bilinear'))" + (
                f", or build the model with dynamic_img_pad=True (timm.create_model('{arch}', "
                "dynamic_img_pad=True, ...)), which pads them" if "dynamic_img_pad" in params
                else ""))
    built = getattr(embed, "img_size", None)
    if isinstance(built, (tuple, list)) and len(built) == 2:
        size, where = (int(built[0]), int(built[1])), f"{type(embed).__name__}.img_size"
    elif isinstance(cfg.get("input_size"), (tuple, list)) and len(cfg["input_size"]) == 3:
        size, where = tuple(int(s) for s in cfg["input_size"][1:]), "pretrained_cfg input_size"
    else:
        n = int(number)
        size, where = (n, n), "timm's message"
    fixes = [f"resize the images to {size[0]}×{size[1]} (torch.nn.functional.interpolate("
             f"images, size={size}, mode='bilinear'))",
             f"build the model for them: timm.create_model('{arch}', img_size={got}, ...)"]
    if hasattr(timm_model, "set_input_size"):
        fixes.append(f"model.set_input_size(img_size={got}) on this model (it resamples the "
                     "position embedding)")
    if "dynamic_img_size" in params:
        fixes.append(f"timm.create_model('{arch}', dynamic_img_size=True, ...), which takes "
                     "any size its patches divide")
    return ValueError(
        f"the images {shape}are {got[0]}×{got[1]} pixels, but the model was built for "
        f"{size[0]}×{size[1]} ({where}), and timm's patch embedding refused them ({said}). "
        "Either " + "; or ".join(fixes))


def clean_forward(model: nn.Module | Any, x: Tensor, output: Any) -> Tensor:
    """``call_model`` on the clean inputs; a dtype clash between inputs and weights (float64
    images into a float32 model) becomes an error that says how to convert. A model that
    converts its inputs itself is measured as it is (the noise is added in the inputs' dtype).
    A timm ViT or Swin given images of another size than it was built for (timm's bare
    ``AssertionError`` from its patch embedding) gets an error that names that size and the
    fixes (:func:`_timm_size_error`); any other error is raised as it is."""
    try:
        return call_model(model, x, output)
    except (AssertionError, RuntimeError) as err:
        size = _timm_size_error(model, x, err)
        if size is not None:
            raise size from err
        if not isinstance(err, RuntimeError):
            raise
        own = model_dtype(model)
        if own is None or own == x.dtype:
            raise
        raise DtypeClash(
            f"the inputs are {x.dtype} but the model's weights are {own}, and the model failed "
            f"on them ({str(err).splitlines()[0]}); convert the inputs with inputs.to({own}) "
            f"(or the model with model.to({x.dtype}))"
        ) from err


class BoundTokens(abc.ABC):
    """A tokenization bound to one model and one batch (see module docstring)."""

    clean_output: Tensor  #: model output on the unperturbed batch, shape (B, ...)
    valid: Tensor  #: (B, T) bool, the tokens that may be perturbed (padding excluded)
    dim: int  #: size of one token vector
    #: the token axis is the inputs' second axis, so ``forward_perturbed`` accepts ``width=``
    #: and evaluates the copies on inputs cut to their first ``width`` tokens (padding-aware
    #: batching, :mod:`senslab.measure._trim`)
    trimmable: bool = False
    #: (B, T) bool, the positions the model itself treats as real (a dict input's attention
    #: mask), when known; ``padding_key`` names the entry it came from
    padding: Tensor | None = None
    padding_key: str | None = None

    @property
    def num_tokens(self) -> int:
        return self.valid.shape[1]

    def judge_rounding(self) -> None:
        """Judge the low-precision rounding of the noise of every copy not judged yet (the
        bound's ``_check_rounding``/``_check_cast`` grid checks pool calls until enough entries
        are perturbed): the measurement calls this before it adds its result, so a small one is
        refused as a large one is."""
        for name in ("_check_rounding", "_check_cast"):
            check = getattr(self, name, None)
            if check is not None:
                check.finish()

    @abc.abstractmethod
    def tokens(self, src: Tensor, tok: Tensor) -> Tensor:
        """Clean vectors (N, D) of token ``tok[n]`` of example ``src[n]``."""

    @abc.abstractmethod
    def forward_perturbed(self, src: Tensor, tok: Tensor | None, noise: Tensor) -> Tensor:
        """Model output on copies of examples ``src`` (N,) with ``noise`` added.

        ``tok`` (N,) given: ``noise`` is (N, D), added to token ``tok[n]`` of copy ``n``.
        ``tok`` is None: ``noise`` is (N, T, D), added to every valid token (whole-input noise).
        A ``trimmable`` bound also takes ``width=w``: the copies are cut to their first ``w``
        tokens (whole-input noise is then (N, w, D)).
        """


class Tokenization(abc.ABC):
    """How to cut a model's input into tokens. Subclasses: :class:`Patches`, :class:`Embedding`,
    :class:`Sequence`."""

    #: default alignment of per-position profiles: "left" (token index) or "right" (from the end)
    align: str = "left"

    @abc.abstractmethod
    @contextmanager
    def bind(
        self, model: nn.Module | Any, inputs: Inputs, mask: Tensor | None = None,
        output: OutputSelector = None,
    ) -> Iterator[BoundTokens]:
        """Run the clean forward pass and yield a :class:`BoundTokens`; ``output`` selects the
        logits in the model's raw output (:func:`select_output`)."""


def real_tokens(mask: Tensor, what: str = "mask=") -> Tensor:
    """A mask of real tokens as bool: a bool mask as it is; a numeric one (float or int) only
    where every entry is 0 or 1. Other values are refused: an additive attention mask (0 on real
    tokens, −1e9 or −inf on padding) read as "nonzero is real" marks the padding as the tokens,
    so the noise would land on the padding alone and the real tokens would measure 0."""
    if mask.dtype == torch.bool:
        return mask
    odd = (mask != 0) & (mask != 1)
    if bool(odd.any()):
        values = mask[odd].unique()[:3].tolist()
        raise ValueError(
            f"{what} holds values other than 0 and 1 ({', '.join(map(str, values))}), so which "
            "tokens are real cannot be read: an additive attention mask (0 on real tokens, a "
            "large negative number on padding), read as 'nonzero is real', would put the noise "
            "on the padding alone and measure about 0. Pass a bool mask that is True on real "
            "tokens: mask == 0 for an additive mask, mask > 0.5 for a soft one"
        )
    return mask.to(torch.bool)


def valid_mask(mask: Tensor | None, b: int, t: int, device: torch.device) -> Tensor:
    """Check a user-given (B, T) mask of real tokens (bool, or numeric 0/1:
    :func:`real_tokens`), or build an all-true one."""
    if mask is None:
        return torch.ones(b, t, dtype=torch.bool, device=device)
    if mask.shape != (b, t):
        # a grid of patches (batch, rows, columns) holds the tokens in row-major order: the
        # same mask, flattened (Patches' order, docs/definitions.md#per-position-profile)
        grid = (mask.dim() == 3 and mask.shape[0] == b and mask.shape[1] * mask.shape[2] == t)
        raise ValueError(
            f"mask has shape {tuple(mask.shape)} but the batch has {b} examples of {t} tokens; "
            f"pass a (batch, tokens) = ({b}, {t}) mask that is true on real tokens"
            + (f" (a grid of {mask.shape[1]}×{mask.shape[2]} patches: mask.flatten(1), the "
               "patches row by row)" if grid else "")
        )
    return real_tokens(mask).to(device=device)
