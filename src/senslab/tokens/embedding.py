"""Tokens that live inside the model: the output of a named submodule (e.g. the LayerNorm after a
token embedding). Noise is added by a forward hook that exists only inside ``bind``."""

from __future__ import annotations

import difflib
import inspect
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn
from torch.utils._pytree import tree_flatten

from .._exclusive import OwnForwards, entered, forward_hooks
from .._stack import user_level
from ._grid import AUTOCAST_FIX, LOW_PRECISION, GridCheck, autocast_grid
from .base import (
    BoundTokens,
    Inputs,
    OutputSelector,
    Position,
    Tokenization,
    batch_size,
    call_model,
    check_position,
    cut_tokens,
    first_real,
    has_token_axis,
    last_real,
    per_example,
    read_position,
    real_rows,
    real_tokens,
    rebuilt,
    select,
    select_output,
    valid_mask,
)

#: dict-input entries read as the mask of real tokens (True or 1 on a real token)
_MASK_KEYS = ("attention_mask", "mask")
#: entries whose convention varies (True marks *padding* in PyTorch's ``key_padding_mask``, in
#: fairseq's ``padding_mask`` and in XLNet's ``input_mask``, real tokens elsewhere — TF BERT
#: ports' ``input_mask``): never guessed
_AMBIGUOUS_MASK_KEYS = ("padding_mask", "key_padding_mask", "src_key_padding_mask", "input_mask")


def input_mask(inputs: Inputs, b: int, t: int, given: bool,
               model: Any = None) -> tuple[str | None, Any]:
    """A dict input's mask of real tokens: ``(key, value)`` of its first :data:`_MASK_KEYS`
    entry, ``(None, None)`` without one. A tuple or list input is read as the positional
    arguments of ``model``'s forward, so ``(input_ids, attention_mask)`` has its mask too
    (:func:`_positional`). Without a mask of the user's (``given`` False), an input whose only
    mask-like entry has an ambiguous convention (:data:`_AMBIGUOUS_MASK_KEYS`) is refused: read
    the wrong way round, the noise would land on the padding only."""
    if isinstance(inputs, (tuple, list)) and model is not None:
        named = _positional(model, inputs)
        grids = sum(isinstance(v, Tensor) and tuple(v.shape) == (b, t) for v in inputs)
        unnamed = grids - sum(isinstance(v, Tensor) and tuple(v.shape) == (b, t)
                              for v in (named or {}).values())
        if (not given and grids > 1 and unnamed > 0
                and not any(k in (named or {}) for k in _MASK_KEYS)):
            raise ValueError(
                f"the input is a tuple of {grids} (batch, tokens) tensors, and "
                f"{type(model).__name__}'s forward takes {unnamed} of them as *args, without "
                "names, so which one is the attention mask cannot be read: the padding would be "
                "perturbed as tokens. Pass a dict ({'input_ids': ids, 'attention_mask': mask}) "
                "or mask= (True on real tokens)"
            )
        inputs = named
    if not isinstance(inputs, dict):
        return None, None
    key = next((k for k in _MASK_KEYS if k in inputs), None)
    if key is not None:
        return key, inputs[key]
    odd = next((k for k in _AMBIGUOUS_MASK_KEYS if k in inputs), None)
    if odd is not None and not given and isinstance(inputs[odd], Tensor) \
            and tuple(inputs[odd].shape) == (b, t):
        raise ValueError(
            f"the input's {odd!r} entry marks padding, or real tokens? (True or 1 means padding "
            f"in PyTorch's key_padding_mask, fairseq's padding_mask and XLNet's input_mask, a "
            f"real token in TF BERT ports' input_mask.) Say which tokens are "
            f"real with mask=: mask=~inputs[{odd!r}] where True marks padding, "
            f"mask=inputs[{odd!r}] where it marks real tokens"
        )
    return None, None


def _refuse_a_tensor_as_cache(model: Any, inputs: Inputs) -> None:
    """Refuse a tuple input whose (batch, tokens) tensor binds to the forward's cache of
    earlier positions (GPT-2's second parameter is ``past_key_values``: ``(ids, mask)`` sent
    the mask there, and transformers failed with "'Tensor' object has no attribute
    'get_seq_length'")."""
    if not isinstance(inputs, (tuple, list)):
        return
    named = _positional(model, inputs) or {}
    cache = next((k for k, v in named.items() if ("past" in k or "cache" in k)
                  and isinstance(v, Tensor) and v.dim() == 2), None)
    if cache is not None:
        inner = unwrapped(model)
        forward = inner.forward if isinstance(inner, nn.Module) else inner
        order = list(inspect.signature(forward).parameters)[:3]
        raise ValueError(
            f"the input is a tuple, read as the positional arguments of "
            f"{type(inner).__name__}'s forward ({', '.join(order)}, …), so a "
            f"(batch, tokens) tensor of it goes to {cache!r}, a cache of earlier positions (an "
            "attention mask, most likely). Pass a dict ({'input_ids': ids, 'attention_mask': "
            "mask})"
        )


def _pad_id(model: Any) -> tuple[str, int] | None:
    """(its path from the model, id) of the pad id the model declares — senslab's zoo:
    ``config.pad_id``; Hugging Face: ``config.pad_token_id``, or a composite config's
    (:func:`hf_pad_token_config`: ``config.text_config.pad_token_id``), or that of the one
    Hugging Face model a wrapper holds (:func:`config_owner`: ``model.config.pad_token_id``)
    — or None."""
    owner, prefix = config_owner(model)
    config = getattr(owner, "config", None)
    attr = next((a for a in ("pad_id", "pad_token_id")
                 if isinstance(getattr(config, a, None), int)), None)
    if attr is not None:
        return f"{prefix}config.{attr}", getattr(config, attr)
    found = hf_pad_token_config(model)
    if found is not None and found[0] is not config \
            and isinstance(getattr(found[0], "pad_token_id", None), int):
        return f"{found[1]}.pad_token_id", found[0].pad_token_id
    return None


def _refuse_unmasked_padding(model: Any, inputs: Inputs, b: int, t: int) -> None:
    """Without any mask, refuse token ids that end (or start) with the pad id the model declares
    (senslab's zoo: ``config.pad_id``; Hugging Face: ``config.pad_token_id``): such a model
    finds its padding by that id itself, so every position would be measured as a token and
    the padding, which never flips, would dilute each example's rate (a GPT-2 measured
    0.081 instead of 0.159)."""
    declared = _pad_id(model)
    if declared is None:
        return
    where, pad = declared
    ids = _token_ids(inputs)
    if not (isinstance(ids, Tensor) and tuple(ids.shape) == (b, t)) or ids.is_floating_point():
        return
    ends = torch.cat([ids[:, -1:], ids[:, :1]], dim=1) == pad
    if bool(ends.any()):
        raise ValueError(
            f"the token ids hold {type(model).__name__}'s pad id {pad} ({where}) at the "
            "ends of some rows, and no mask says which tokens are real, so the padding would "
            "be perturbed as tokens: pass the attention mask ({'input_ids': ids, "
            "'attention_mask': mask}) or mask= (True on real tokens); if those ids are real "
            "tokens, pass mask=torch.ones_like(ids, dtype=torch.bool)"
        )


def _say_mask_over_padding(valid: Tensor, padding: Tensor, key: str | None) -> None:
    """Warn where ``mask=`` marks real positions that the input's attention mask marks as
    padding. mask= says which tokens are real, so they get noise and an output read at each
    example's last real token is read after them — what a mask meant to pick among the real
    tokens (``ids != bos_id``, true on the padding too) did without a word: 0.191 against
    0.304 on a small Llama."""
    over = valid & ~padding
    if not bool(over.any()):
        return
    rows = over.any(dim=1).nonzero().flatten().tolist()
    warnings.warn(
        f"mask= marks {int(over.sum())} positions real that the input's {key!r} entry marks "
        f"as padding (examples {rows[:5]}{' …' if len(rows) > 5 else ''}): mask= says which "
        "tokens are real, so they get noise, and an output read at each example's last real "
        "token is read after them. If mask= is to pick among the real tokens (leave out a "
        f"[BOS], say), pass mask & {key}", UserWarning, stacklevel=user_level())


def _refuse_real_tokens_after_the_mask(model: Any, inputs: Inputs, valid: Tensor) -> None:
    """Without an attention mask, ``mask=`` also says where each example ends: a per-position
    output (a causal LM's logits) is read at its last true position, and the copies are cut
    after it. Refuse a ``mask=`` after whose last true position an example goes on with real
    tokens — ids other than the model's pad id, or, where the model declares none, ids that
    differ (padding repeats one id) — such as an end token left unperturbed: the output would
    be read, unnoticed, at the token before it (a rate of 0.61 where the last token's
    prediction flips at 0.07)."""
    ids = _token_ids(inputs)
    if not isinstance(ids, Tensor) or ids.shape != valid.shape or ids.is_floating_point():
        return
    ids = ids.to(valid.device)
    after = torch.arange(valid.shape[1], device=valid.device)[None, :] > last_real(valid)[:, None]
    declared = _pad_id(model)
    if declared is not None:
        where, pad = declared
        what = f"ids other than {type(model).__name__}'s pad id {pad} ({where})"
        rows = (after & (ids != pad)).any(dim=1).nonzero().flatten()
    elif len(ids[after].unique()) > 1:
        what = "different ids (padding repeats one id)"
        rows = after.any(dim=1).nonzero().flatten()
    else:
        return
    if len(rows):
        raise ValueError(
            f"mask= leaves out the last token(s) of example(s) {rows[:5].tolist()}, which hold "
            f"{what}: real tokens. With no attention mask, mask= also says where each example "
            "ends, so the per-position output would be read at the last token mask= marks, not "
            "at the example's last. Pass the attention mask too ({'input_ids': ids, "
            "'attention_mask': attention_mask}: mask= then only limits which tokens get "
            "noise), or mark those tokens real in mask="
        )


#: largest relative change of an example's clean output that float rounding explains, for the
#: two forwards of :meth:`_BoundEmbedding._refuse_padding_of_another_id` (one example each, at
#: two widths); a model that reads its logits at another position changes them by far more
AGREE_RTOL = {torch.float64: 1e-6, torch.float32: 1e-3}
LOW_PRECISION_AGREE_RTOL = 5e-2


#: what Hugging Face's decoder classifiers (``GPT2ForSequenceClassification``, Llama's, …) say
#: when given several examples and no ``config.pad_token_id``
NO_PAD_TOKEN = "no padding token is defined"

#: attributes under which a composite Hugging Face config keeps its text part (those that
#: transformers' ``PretrainedConfig.get_text_config`` looks for)
_TEXT_CONFIGS = ("text_config", "text_encoder", "decoder", "generator")


def config_owner(model: Any) -> tuple[Any, str]:
    """The model whose config says how it reads padding, and its path from ``model`` with a
    trailing dot (``""`` for the model itself): the model (inside DDP, DataParallel or
    ``torch.compile``: the wrapped one), or, where it has no ``config``, the one Hugging Face
    model it holds (a LightningModule's ``self.model``: ``"model."``), as
    :func:`~senslab.tokens.auto_tokens` finds it. The pad-id checks read only the model's own
    config before, and a GPT-2 classifier in such a wrapper was measured on its padding
    without a word (0.072 where it measures 0.143; 0.0 where it is refused unwrapped)."""
    inner = unwrapped(model)
    if not isinstance(inner, nn.Module) or getattr(inner, "config", None) is not None:
        return inner, ""
    found: list[tuple[str, nn.Module]] = []
    for name, sub in inner.named_modules():
        if name and not any(name.startswith(f"{n}.") for n, _ in found) \
                and any(c.__name__ == "PreTrainedModel" for c in type(sub).__mro__):
            found.append((name, sub))
    return (found[0][1], f"{found[0][0]}.") if len(found) == 1 else (inner, "")


def hf_pad_token_config(model: Any) -> tuple[Any, str] | None:
    """The Hugging Face config that holds the pad token id ``model``'s classifier reads, and
    its path from the model: ``(config, "config")``, or for a composite config (Gemma 3's, a
    vision-language model's) whose ``get_text_config()`` is a sub-config with the id
    (``GenericForSequenceClassification`` reads it there), ``(config.text_config,
    "config.text_config")``; for a wrapper of one Hugging Face model (:func:`config_owner`),
    that model's, its path prefixed (``"model.config"``). None where the config has no
    ``pad_token_id`` (senslab's zoo)."""
    owner, prefix = config_owner(model)
    config = getattr(owner, "config", None)
    if config is None:
        return None
    get_text_config = getattr(config, "get_text_config", None)
    text = None
    if callable(get_text_config):
        try:
            text = get_text_config()
        except (ValueError, TypeError, AttributeError):  # several text parts: ambiguous
            text = None
    if text is not None and text is not config and hasattr(text, "pad_token_id"):
        name = next((n for n in _TEXT_CONFIGS if getattr(config, n, None) is text), None)
        return text, (f"{prefix}config.get_text_config()" if name is None
                      else f"{prefix}config.{name}")
    if hasattr(config, "pad_token_id"):
        return config, f"{prefix}config"
    return None


#: ``config`` attributes (the model's, or its text config's) of Hugging Face multimodal models
#: that name a placeholder token id whose positions the forward overwrites with an image, video
#: or audio encoder's features
PLACEHOLDER_KEYS = ("image_token_index", "image_token_id", "video_token_index",
                    "video_token_id", "audio_token_index", "audio_token_id")


def placeholder_ids(model: Any) -> dict[str, int]:
    """``{config key: id}`` of ``model``'s multimodal placeholder tokens (:data:`PLACEHOLDER_KEYS`
    of its config, of the Hugging Face model it wraps: :func:`config_owner`); empty for a model
    without them."""
    owner, _ = config_owner(model)
    config = getattr(owner, "config", None)
    found: dict[str, int] = {}
    for key in PLACEHOLDER_KEYS:
        value = getattr(config, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            found[key] = value
    return found


def no_pad_id_message(model: Any) -> str:
    """The refusal of a Hugging Face decoder classifier without a pad token id, whichever
    forward it refused (the clean one of several examples, a single padded example, or the
    perturbed copies of one unpadded example): the same advice, each part of which runs."""
    found = hf_pad_token_config(model)
    where = f"{found[1] if found else 'config'}.pad_token_id"
    return (
        f"{type(unwrapped(model)).__name__} has no pad token id ({where} is None), and its "
        "classifier needs one: it reads each example's logits at the last token that is not "
        f"padding, which it finds through {where}. Without it Hugging Face refuses a batch "
        "of several examples — senslab evaluates an example's perturbed copies together, so "
        "one unpadded example is refused too — and reads a single example at its last "
        "position, padding in a padded example. Set the id the inputs are padded with, "
        f"model.{where} = tokenizer.pad_token_id (a GPT-2 tokenizer has none: "
        f"tokenizer.pad_token = tokenizer.eos_token, then model.{where} = "
        "tokenizer.eos_token_id), and pass the attention mask. Without a pad id, only "
        "unpadded examples measure: one per call (one TokenSensitivity.update each), and "
        "chunk_size=1 with precision='float32' (one copy per forward: slow; the default "
        "precision='auto' still checks copies together, and so do control_variate and "
        "allocation='linear')"
    )


def read_by_pad_id(ids: Tensor, pad: int) -> Tensor:
    """(B,) where Hugging Face's decoder classifiers read each row of (B, T) token ids: at the
    rightmost id that is not ``pad`` (0 where all are), whatever the attention mask says —
    ``GPT2ForSequenceClassification``, ``GenericForSequenceClassification`` (Llama, Mistral,
    Qwen…), OPT's, Bloom's, GPT-NeoX's… compute ``(arange(T) * (ids != pad)).argmax(-1)``."""
    positions = torch.arange(ids.shape[1], device=ids.device)
    return (positions * (ids != pad)).argmax(-1)


#: how a left-padded example's output that is not its text's own is described
LEFT_READ = "another output than the same text alone, unpadded"
#: … and one that is
READ_AS_TEXT = "the same output left-padded as its text alone"


class LeftPadding(NamedTuple):
    """What the first left-padded example's output was found to be
    (:meth:`_BoundEmbedding._judge_left_padding`)."""

    misread: bool  #: another output than the text's own (the reference's)
    row: int  #: the example checked
    alone_ran: bool  #: the reference is the text alone (False: the model took no shorter
    #: input, and the reference is the example padded on the right)
    right_reads: bool | None  #: right padding gives the text's own output (None: not run)


def _agree(a: Tensor, b: Tensor) -> bool:
    """Whether two outputs of one example agree up to float rounding (labels: exactly)."""
    if a.shape != b.shape:
        return False
    if not (a.is_floating_point() and b.is_floating_point()):
        return torch.equal(a, b)
    rtol = AGREE_RTOL.get(a.dtype, LOW_PRECISION_AGREE_RTOL)
    scale = max(float(a.float().abs().max()), float(b.float().abs().max()), 1e-30)
    return float((a.float() - b.float()).abs().max()) <= rtol * scale


def _with_token_ids(inputs: Inputs, ids: Tensor) -> Inputs:
    """``inputs`` with their token ids (:func:`_token_ids`) replaced by ``ids``."""
    if isinstance(inputs, dict):
        return {**inputs, "input_ids": ids}
    if isinstance(inputs, (tuple, list)):
        return rebuilt(inputs, (ids, *inputs[1:]))
    return ids


def _token_ids(inputs: Inputs) -> Any:
    """The token ids of ``inputs``: its ``input_ids``, the tensor itself, or a tuple's first."""
    if isinstance(inputs, dict):
        return inputs.get("input_ids")
    if isinstance(inputs, (tuple, list)):
        return inputs[0] if inputs else None
    return inputs


#: how to measure a decoder position of an encoder-decoder model
DECODER_FIX = (
    "Select the decoder position measured with output= (output=lambda o: o.logits[:, k]; "
    "k = -1 for the last), or compare the whole decoder output with position=None and "
    "compare='l1' or 'l2'"
)


def encoder_decoder(model: Any) -> bool:
    """Whether ``model`` is a Hugging Face encoder-decoder model (T5, BART…): its outputs run
    over the decoder's positions, not the inputs' tokens."""
    config = getattr(unwrapped(model), "config", None)
    return getattr(config, "is_encoder_decoder", False) is True


def _refuse_decoder_position(model: Any, position: Position) -> None:
    """Refuse ``position=k`` on an encoder-decoder model fed decoder inputs of its own: ``k``
    counts the inputs' tokens, and its outputs run over the decoder's positions (with
    ``decoder_input_ids`` of the inputs' length, ``position=-1`` read each example at the
    decoder position of its encoder's last real token without a word)."""
    if position is None or position == "last":
        return
    raise ValueError(
        f"position={position} reads a per-position output at a position of the inputs' "
        f"tokens, but {type(unwrapped(model)).__name__} is an encoder-decoder model whose "
        f"outputs run over the decoder's positions. {DECODER_FIX}"
    )


def _refuse_per_token_head(model: Any, raw: Tensor, t: int, position: Position) -> None:
    """Refuse reading a per-position output at the last real token (the default, meant for a
    causal language model's next-token logits) where the model is a Hugging Face model that
    cannot generate: a token classifier or a masked language model, whose last real token
    ([SEP]) carries no prediction of the example (a tagger measured that way gave 0.084
    without a word)."""
    if position != "last" or raw.dim() != 3 or raw.shape[1] != t:
        return
    model = unwrapped(model)  # DDP, DataParallel, torch.compile: the wrapped model
    what = type(model).__name__
    inside = hf_model_inside(model)
    if inside is not None:  # a user's wrapper returning a tagger's logits was read at [SEP]
        if "For" not in type(inside[0]).__name__:
            # a base model (GPT2Model, BertModel) under a head of the user's: causal ones are
            # read at the last real token as meant; a bidirectional encoder's is [SEP]
            if _bidirectional(inside[0]):
                raise ValueError(
                    f"{inside[1]} is a bidirectional encoder (its attention modules are not "
                    f"causal) under a head of {what}'s that returns a prediction for every "
                    f"token ({raw.shape[2]} values at each of {t} positions): its last real "
                    "token ([SEP]) sees no more of the example than any other, and is no "
                    "next-token prediction. Say which position is measured with position=k on "
                    "Embedding or auto_tokens (0 for [CLS]), return one row per example from "
                    f"{what}, or pass position=None with compare='l1' or 'l2' for the whole "
                    "per-position output"
                )
            return
        model, what = inside
    can_generate = getattr(model, "can_generate", None)
    if not callable(can_generate) or getattr(model, "config", None) is None:
        return
    try:
        causal = bool(can_generate())
    except Exception:  # noqa: BLE001 -- an old or custom class: keep the documented default
        return
    if causal and getattr(model.config, "is_encoder_decoder", False) is True:
        raise ValueError(
            f"{what} is an encoder-decoder model: its {t} per-position outputs "
            "belong to the decoder's positions, and the last real token of the inputs names an "
            "encoder position (without decoder_input_ids the decoder reads the inputs shifted "
            "right, so the last one is the teacher-forced prediction of the last input token). "
            f"{DECODER_FIX}"
        )
    if not causal:
        raise ValueError(
            f"{what} returns a prediction for every token ({raw.shape[2]} "
            f"values at each of {t} positions) and is no causal language model (it cannot "
            "generate): a token classifier or masked LM, whose last real token carries no "
            "prediction of the example. Say which position is measured with position=k on "
            "Embedding or auto_tokens (k ≥ 0: position k, e.g. 0 for [CLS]; negative: counted "
            "back from the last real token; -1 reads the last one, as for a causal LM whose "
            "class does not generate through transformers), or position=None with "
            "compare='l1' or 'l2' for the whole per-position output"
        )


def _refuse_other_positions(model: Any, name: str, position: int,
                            shape: tuple[int, ...], t: int) -> None:
    """Refuse ``position=k`` where the model's 3-D output has another number of positions than
    the hooked module's tokens: the model adds (or drops) positions between the two — prompt
    tuning's virtual tokens prepended to the word embeddings, a [CLS] of its own — so no
    output position is known to be token ``k``'s. ``k`` was ignored, and the whole output
    compared (with compare='l2' the same number as position=None, without a word)."""
    raise ValueError(
        f"position={position} reads a per-position output at one of the inputs' {t} tokens, "
        f"but {type(unwrapped(model)).__name__} returns {shape}: {shape[1]} positions per "
        f"example for the {t} tokens of {name!r}, so the model adds (or drops) positions after "
        "that module (prompt tuning's virtual tokens, a token of its own), and which output "
        "position is the inputs' token cannot be read. Select the position with output= "
        "(output=lambda o: o.logits[:, k], counted in the output's positions; k = -1 for the "
        "last), or compare the whole output with position=None and compare='l1' or 'l2'"
    )


def _bidirectional(model: Any) -> bool:
    """Whether a Hugging Face base model's attention modules all say they are not causal
    (``is_causal`` False: BERT's, RoBERTa's; GPT-2's and Llama's are True, and so is BERT's
    with ``is_decoder``). False where no module carries the flag (older transformers, a class
    of one's own): the documented default stays."""
    flags = [m.is_causal for m in model.modules() if isinstance(getattr(m, "is_causal", None),
                                                                   bool)]
    return bool(flags) and not any(flags)


def _refuse_choices(name: str, shape: tuple[int, ...], inputs: Inputs) -> None:
    """Refuse multiple-choice inputs, (batch, choices, tokens) ids that the model flattens into
    batch × choices rows before its embedding (``BertForMultipleChoice``): refused as a
    sequence-first module's output, whose fix (hook a batch-first module) does not apply."""
    b, t = shape[0], shape[1]
    ids = inputs.get("input_ids") if isinstance(inputs, dict) else None
    if ids is None:
        ids = next((v for v in (inputs.values() if isinstance(inputs, dict) else
                                inputs if isinstance(inputs, (tuple, list)) else (inputs,))
                    if isinstance(v, Tensor)), None)
    if not isinstance(ids, Tensor) or ids.dim() != 3 or ids.shape[0] * ids.shape[1] != b \
            or ids.shape[2] != t:
        return
    n, c = ids.shape[0], ids.shape[1]
    raise ValueError(
        f"the inputs are (batch, choices, tokens) = {tuple(ids.shape)}, multiple-choice inputs "
        f"that the model flattens into {b} rows before {name!r} (shape {shape}): a row is one "
        f"choice, not one of the {n} examples, and Embedding tokens perturb an example's row. "
        "Measure a wrapper that embeds the choices itself and passes them through a module of "
        "its own: forward(input_ids, attention_mask) computes e = embedding(input_ids) of shape "
        f"({n}, {c}, {t}, dim), runs self.tokens = nn.Identity() on e.reshape({n}, {c * t}, dim) "
        f"and calls the model with inputs_embeds=that.reshape({n}, {c}, {t}, dim); then "
        f"Embedding('tokens'), whose {c * t} tokens are every choice's, with mask= of shape "
        f"({n}, {c * t}) (attention_mask.reshape({n}, -1))"
    )


def _refuse_added_positions(inputs: Inputs, b: int, t: int, name: str) -> None:
    """Without any mask, refuse a hooked module with another number of positions than the
    token ids (Longformer pads to its attention window inside forward; a model may prepend a
    token): which of its positions are real, no input says, and measuring all of them counts
    the model's own padding as tokens that never flip."""
    ids = _token_ids(inputs)
    if not (isinstance(ids, Tensor) and ids.dim() == 2 and len(ids) == b) \
            or ids.is_floating_point() or ids.shape[1] == t:
        return
    raise ValueError(
        f"{name!r} puts out {t} positions per example for {ids.shape[1]} token ids: the model "
        f"pads or adds tokens inside its forward, and no mask says which of the {t} are real. "
        f"Pass mask= of shape ({b}, {t}), True on the positions to measure"
    )


def _cloned(inputs: Inputs) -> Inputs:
    """``inputs`` with every tensor copied (other values pass through): the clean forward runs
    on it, so a model that edits its inputs in place (``input_ids.clamp_``, a mask's
    ``masked_fill_``) changes neither the caller's tensors nor the rows the copies are built
    from. Token ids and masks are small: one copy per batch."""
    if isinstance(inputs, Tensor):
        return inputs.clone()
    if isinstance(inputs, dict):
        return {k: v.clone() if isinstance(v, Tensor) else v for k, v in inputs.items()}
    if isinstance(inputs, (tuple, list)):
        return rebuilt(inputs, (v.clone() if isinstance(v, Tensor) else v for v in inputs))
    return inputs


def _called_embeddings(model: Any, inputs: Inputs, output: Any) -> list[str]:
    """The ``nn.Embedding`` and ``nn.LayerNorm`` submodules a forward of ``inputs`` calls, in
    call order (for an error message; at most six)."""
    if not isinstance(model, nn.Module):
        return []
    called: list[str] = []
    names = {m: n for n, m in model.named_modules() if n}
    hooks = [m.register_forward_hook(lambda m, a, o: called.append(names[m]))
             for m in names if isinstance(m, (nn.Embedding, nn.LayerNorm))]
    try:
        with torch.no_grad():
            call_model(model, _cloned(inputs), output)
    except Exception:  # noqa: BLE001 -- only a hint for the message
        pass
    finally:
        for h in hooks:
            h.remove()
    return list(dict.fromkeys(called))[:6]


def _positional(model: Any, inputs: tuple[Any, ...] | list[Any]) -> dict[str, Any] | None:
    """``inputs`` as the named parameters of ``model``'s forward they bind to (the model is
    called as ``model(*inputs)``; inside DDP, DataParallel or ``torch.compile``, the wrapped
    model's forward), without those that go to ``*args`` (they have no names); None where the
    signature cannot be read or bound, or everything goes to ``*args``."""
    inner = unwrapped(model)
    forward = inner.forward if isinstance(inner, nn.Module) else inner
    try:
        signature = inspect.signature(forward)
        bound = signature.bind_partial(*inputs).arguments
    except (TypeError, ValueError):
        return None
    variadic = {n for n, p in signature.parameters.items() if p.kind is p.VAR_POSITIONAL}
    named = {k: v for k, v in bound.items() if k not in variadic}  # *args' entries: no names
    return named if named or not variadic & bound.keys() else None


def _named_inputs(model: Any, inputs: Inputs) -> Inputs | None:
    """``inputs`` as ``prefix_cache`` reads them: a tensor or dict as it is, a tuple or list as
    the named parameters of the forward it is passed to (``(ids, mask)`` →
    ``{'input_ids': ids, 'attention_mask': mask}``: the zoo's ``prefix_cache`` takes a
    non-dict as the token ids, and a tuple failed with "'tuple' object has no attribute
    'dim'"); None where a tuple's entries have no names (prefix reuse is then not taken)."""
    if isinstance(inputs, (tuple, list)):
        return _positional(model, inputs)
    return inputs


def unwrapped(model: Any) -> Any:
    """The model inside DistributedDataParallel / DataParallel (``.module``) and
    ``torch.compile`` (``._orig_mod``), whose forward takes ``*args, **kwargs``; else
    ``model``."""
    for _ in range(8):
        inner = getattr(model, "_orig_mod", None) if isinstance(model, nn.Module) else None
        if inner is None and isinstance(model, (nn.parallel.DistributedDataParallel,
                                                nn.DataParallel)):
            inner = model.module
        if not isinstance(inner, nn.Module):
            return model
        model = inner
    return model


def hf_model_inside(model: Any) -> tuple[Any, str] | None:
    """``(inner, "X (inside W)")`` for a user's wrapper ``W`` (no ``config`` of its own) holding
    exactly one outermost Hugging Face model ``X`` (a module with a ``config`` and
    ``can_generate``): the head whose outputs the wrapper most likely returns. None for a
    Hugging Face model itself, a wrapper of none or of several (an ensemble: not guessed)."""
    model = unwrapped(model)
    if not isinstance(model, nn.Module) or getattr(model, "config", None) is not None:
        return None
    found: list[str] = []
    inner = None
    for name, module in model.named_modules():
        if not name or any(name.startswith(f"{f}.") for f in found):
            continue
        if getattr(module, "config", None) is not None \
                and callable(getattr(module, "can_generate", None)):
            found.append(name)
            inner = module
    if len(found) != 1:
        return None
    return inner, f"{type(inner).__name__} (inside {type(model).__name__}, at {found[0]!r})"


def find_module(model: nn.Module, name: str) -> nn.Module:
    """``model.get_submodule(name)`` with an error that lists the valid names."""
    names = [n for n, _ in model.named_modules() if n]
    # every path a submodule has (a module held under two names, ``shared`` and
    # ``encoder.embed_tokens``, is listed once by named_modules): both name it
    if name not in {n for n, _ in model.named_modules(remove_duplicate=False)}:
        close = difflib.get_close_matches(name, names, n=3)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        raise ValueError(
            f"model {type(model).__name__} has no submodule {name!r}.{hint} "
            f"Valid names: {', '.join(names)}"
        )
    return model.get_submodule(name)


def module_name(model: nn.Module, module: str | nn.Module) -> str:
    """The dotted name of ``module`` in ``model`` (a name is checked, a module looked up by
    identity); an error if it is not one of ``model``'s submodules."""
    if isinstance(module, str):
        find_module(model, module)
        return module
    if not isinstance(module, nn.Module):
        raise TypeError(
            f"Embedding's module must be a dotted submodule name or an nn.Module, got "
            f"{type(module).__name__}; e.g. Embedding('bert.embeddings.LayerNorm') or "
            "Embedding(model.bert.embeddings.LayerNorm)"
        )
    for name, sub in model.named_modules():
        if sub is module and name:
            return name
    raise ValueError(
        f"the {type(module).__name__} given to Embedding is not a submodule of "
        f"{type(model).__name__} (the model itself cannot be hooked); pass one of its modules, "
        "e.g. the LayerNorm after its token embedding, or its dotted name"
    )


@dataclass(frozen=True, repr=False)
class Embedding(Tokenization):
    """Tokens are the (B, T, D) output of submodule ``module`` (batch first).

    Real tokens are given by the ``mask`` argument of the measurement, else by the
    ``attention_mask`` (or ``mask``) entry of a dict input, else all positions are real; a mask
    that is not bool must hold only 0 and 1 (an additive mask, −1e9 on padding, is refused:
    read as "nonzero is real" it would perturb the padding alone). A
    ``padding_mask``/``key_padding_mask`` entry is never guessed (True marks padding in PyTorch
    and fairseq, real tokens elsewhere): without ``mask=`` such an input is refused. A Hugging
    Face classifier that finds each example's last real token by ``config.pad_token_id``
    (GPT-2's, Llama's…; a composite config's ``get_text_config().pad_token_id``) is refused
    where the padding holds another id and it reads there: the padding the attention mask says,
    else ``mask=`` (where it reads after ``mask=``'s last true position at one id); so is such a
    classifier given tokens of its pad id to perturb after the position it reads (an all-ones
    attention mask over padding, an end token whose id is the pad id): they never flip.
    Padding is never perturbed, and by default never evaluated either: perturbed copies are cut
    after their last real token (padding-aware batching, ``trim_padding`` of
    :class:`~senslab.measure.TokenSensitivity`; every input tensor whose second axis is the token
    axis is cut). Per-position profiles are right-aligned by default (position −1 is
    the last real token), as for variable-length text. The inputs may be integer token ids: the
    noise lands on the module's floating output, never on the inputs. The module must run exactly
    once per forward pass (a LayerNorm shared by two places would get noise at both: refused).

    Prefix reuse: a model that reads its tokens left to right may declare ``prefix_module``
    (the hooked submodule's name) and implement ``prefix_cache(tokens, inputs)`` (a tuple
    input reaches it as a dict of the forward's parameters it binds to) and
    ``forward_suffix(cache, src, tok, noise)``; then, in eval mode, a copy perturbed at token
    ``t`` is evaluated from the clean state at ``t − 1`` instead of by a full forward
    (:class:`senslab.models.text.LSTMClassifier` and ``GPT2Classifier`` do; same predictions up
    to float rounding). A model that holds forward hooks or pre-hooks of the user's (on any of
    its modules, or for all modules) runs full forwards: ``forward_suffix`` would skip them.
    ``reuse_prefix=False`` always runs full forwards.

    ``module`` is a dotted name (``"bert.embeddings.LayerNorm"``) or the submodule itself
    (``model.bert.embeddings.LayerNorm``); :func:`~senslab.tokens.auto_tokens` picks it for
    Hugging Face text models.

    Per-position outputs (a causal language model's (B, T, V) logits: any 3-D output whose
    second axis is the inputs' token axis at full width; a seq2seq model's decoder logits are
    none, also on copies cut to the decoder's length) are read at one position per example
    before the outputs are compared: ``position="last"`` (default) at each example's last real
    token (the last true position of the attention mask or ``mask``, so right padding is
    skipped); an int ``k ≥ 0`` at position ``k``; a negative int counted back from the last
    real token (−1 is the last real one, −2 the one before); ``None`` keeps the whole output.
    A position that is padding in some example — after its last real token, or before its
    first (left padding, by the attention mask) — is refused.
    Other outputs are used as they are; an int ``position`` is refused on a 3-D output whose
    second axis is not the tokens' (a model that prepends prompt vectors; a seq2seq model's
    decoder positions, whose inputs are ``decoder_input_ids`` or ``labels``).
    """

    module: str | nn.Module
    align: str = "right"
    reuse_prefix: bool = True
    position: Position = "last"

    def __post_init__(self) -> None:
        check_position(self.position)
        if self.reuse_prefix not in (True, False):  # "no" and the like were read as True
            raise TypeError(f"reuse_prefix must be True or False, got {self.reuse_prefix!r}")
        if not isinstance(self.module, (str, nn.Module)):
            raise TypeError(
                f"Embedding's module must be a dotted submodule name or an nn.Module, got "
                f"{type(self.module).__name__}; e.g. Embedding('bert.embeddings.LayerNorm')"
            )

    def __repr__(self) -> str:
        module = (repr(self.module) if isinstance(self.module, str)
                  else f"<{type(self.module).__name__} module>")
        return (f"Embedding(module={module}, align={self.align!r}, "
                f"reuse_prefix={self.reuse_prefix!r}, position={self.position!r})")

    @contextmanager
    def bind(
        self, model: nn.Module | Any, inputs: Inputs, mask: Tensor | None = None,
        output: OutputSelector = None,
    ) -> Iterator[BoundTokens]:
        if not isinstance(model, nn.Module):
            raise TypeError("Embedding tokens need an nn.Module to hook into")
        name = module_name(model, self.module)
        target = model.get_submodule(name)
        bound = _BoundEmbedding(name, model, inputs, output)
        bound.position = self.position
        # forward_suffix runs the model's layers without its call: not where a hook of the
        # user's would be skipped (full forwards run them)
        bound.reuse = (self.reuse_prefix and not model.training
                       and getattr(model, "prefix_module", None) == name
                       and hasattr(model, "forward_suffix")
                       and not forward_hooks(model, foreign=True)
                       and _named_inputs(model, inputs) is not None)
        own = OwnForwards(model)  # the forwards of a thread running the model itself pass
        handle = target.register_forward_hook(own.hook(bound.hook))
        try:
            bound.run_clean(mask)
            yield bound
        finally:
            handle.remove()
            own.close()


#: true while a caller that judges left padding itself binds (:func:`left_padding_judged`)
_LEFT_PADDING_JUDGED: ContextVar[bool] = ContextVar("senslab_left_padding_judged",
                                                    default=False)


@contextmanager
def left_padding_judged() -> Iterator[None]:
    """Bind :class:`Embedding` tokens in here without the clean forward's warning on left-padded
    inputs that the model reads otherwise than right-padded ones: the caller judges them
    itself. ``TokenSensitivity`` refuses left padding under ``trim_padding=True`` (the refusal
    then says what the bound's ``left_padding_read`` finds), and calls
    ``warn_left_padding_read`` where the measurement goes on with such inputs. A warning at the
    bind was followed at once by the refusal, which said the same thing."""
    token = _LEFT_PADDING_JUDGED.set(True)
    try:
        yield
    finally:
        _LEFT_PADDING_JUDGED.reset(token)


class _BoundEmbedding(BoundTokens):
    def __init__(self, name: str, model: nn.Module, inputs: Inputs,
                 output: OutputSelector = None) -> None:
        self.name, self.model, self.inputs, self.output = name, model, inputs, output
        self._calls = 0  # hook calls in the current forward pass
        self._delta: tuple[Tensor | None, Tensor] | None = None
        self._shape: tuple[int, ...] | None = None
        self.reuse = False  # prefix reuse (see Embedding)
        self._cache: Any = None
        self._width: int | None = None  # tokens of the copies in the current forward
        self.position: Position = "last"  # where a per-position output is read (see Embedding)
        self.ends: Tensor | None = None  # (B,) each example's last real position
        #: (B,) each example's first real position, where the attention mask says it
        self.starts: Tensor | None = None
        self._per_position = False  # whether the output is per position (set by run_clean)
        #: noise landing on bf16/fp16 token vectors is checked against the noise drawn
        self._check_rounding = GridCheck(f"token vectors of {name!r}", (
            "Measure a float32 copy of the model — copy.deepcopy(model).float() — without "
            "autocast= (whose first linear layer would round the token vectors to {dtype} "
            "again; precision='bf16-checked' keeps float32's class decisions at bf16's speed), "
            "or use a larger sigma, well above {spacing}"))
        #: … and float32 token vectors under autocast=, rounded to its grid by the model's
        #: first linear layer (set by :meth:`run_clean`, whose forward runs under the
        #: measurement's autocast alone)
        self._check_cast: GridCheck | None = None
        #: :meth:`_judge_left_padding`'s finding, once judged (``_left_judged``)
        self._left_read: LeftPadding | None = None
        self._left_judged = False

    def hook(self, module: nn.Module, args: Any, out: Any) -> Any:
        if isinstance(module, (nn.Conv1d, nn.ConvTranspose1d)) and isinstance(out, Tensor):
            raise ValueError(
                f"submodule {self.name!r} is a {type(module).__name__}, whose output "
                f"{tuple(out.shape)} is (batch, channels, length): its second axis holds "
                "channels, not tokens, so a 'token' would be one channel across every position "
                "(an audio model's input convolution, Whisper's encoder.conv1, is such a "
                "module). Hook a module whose output is (batch, tokens, dim), e.g. the first "
                "layer's input LayerNorm, or measure the convolution's input with Sequence() "
                "on (batch, length, channels) inputs"
            )
        if isinstance(out, Tensor) and out.dim() == 4:
            raise ValueError(
                f"submodule {self.name!r} returned {tuple(out.shape)}: a 4-D image embedding "
                "(a CNN stem's (batch, channels, height, width), or a Swin-style (batch, height, "
                "width, dim) patch grid), not (batch, tokens, dim). Measure image tokens with "
                "Patches(p) on the image itself (auto_tokens(model) picks p), or hook a layer "
                "whose output is (batch, tokens, dim), such as a ViT's patch embedding"
            )
        if not isinstance(out, Tensor) or out.dim() != 3:
            got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
            raise ValueError(
                f"submodule {self.name!r} returned {got}; Embedding tokens need a (batch, tokens, "
                "dim) tensor output — hook the embedding or its LayerNorm, not a recurrent layer"
            )
        if not out.is_floating_point():
            raise TypeError(
                f"submodule {self.name!r} returned {out.dtype}; Gaussian noise needs a floating "
                "output — hook the embedding (or the layer after it), not an integer input stage"
            )
        self._calls += 1
        if self._calls > 1:
            return None  # reported by _count after the forward pass; no noise twice
        if self._delta is None:
            self._shape = tuple(out.shape)
            # a copy: the rest of the forward may edit the module's output in place (h += pos),
            # and these are the clean tokens (replace_with, prefix reuse's cache)
            self._clean = out.detach().clone()
            return None
        tok, noise = self._delta
        if self._width is not None and out.shape[1] > self._width \
                and out.shape[0] == noise.shape[0]:
            # batch first, more positions than the inputs: the model pads inside its forward
            raise RuntimeError(
                f"submodule {self.name!r} returned {out.shape[1]} tokens on inputs cut to "
                f"{self._width}: the model pads or adds positions inside its forward "
                "(Longformer pads to a multiple of its attention window), so inputs cut after "
                "their last real token do not keep their positions: run at full width "
                "(trim_padding=False)"
            )
        if self._width is not None and out.shape[1] != self._width:
            raise RuntimeError(
                f"submodule {self.name!r} returned {out.shape[1]} tokens on inputs cut to "
                f"{self._width}: its token axis is not the inputs' second axis (a sequence-first "
                "model, e.g. nn.LSTM or nn.Transformer with batch_first=False, transposes its "
                "inputs: hook a module whose output is (batch, tokens, dim), or measure a "
                "wrapper that transposes back)"
            )
        if out.shape[0] != noise.shape[0]:
            raise RuntimeError(
                f"submodule {self.name!r} ran on {out.shape[0]} rows, expected {noise.shape[0]}: "
                "Embedding tokens need a batch-first module called once per forward (a "
                "sequence-first model, e.g. nn.LSTM or nn.Transformer with batch_first=False, "
                "puts its positions first)"
            )
        if tok is None:
            self._rounding(out, noise)
            return out + noise.to(out.dtype)
        rows = torch.arange(out.shape[0], device=out.device)
        self._rounding(out[rows, tok], noise)
        noise = noise.to(out.dtype)
        out = out.clone()
        out[rows, tok] += noise
        return out

    def _rounding(self, clean: Tensor, noise: Tensor) -> None:
        """Check the noise where it lands on a low-precision grid: bf16/fp16 token vectors, or
        float32 ones that autocast= rounds (:class:`~senslab.tokens._grid.GridCheck`)."""
        if clean.dtype in LOW_PRECISION:
            self._check_rounding(clean, noise)
        elif self._check_cast is not None and clean.dtype == torch.float32:
            self._check_cast(clean, noise)

    def _count(self, forward: Any) -> Tensor:
        """Run ``forward()`` counting the hook's calls: noise must land exactly once. The
        refusal of a decoder classifier without a pad id is raised as a ``ValueError``, which
        the callers turn into :func:`no_pad_id_message`: transformers 4.x's GPT-2 (and its
        kin) asserted it, and the ``AssertionError`` came through raw — also for one example,
        whose perturbed copies are the batch of several it refused."""
        self._calls = 0
        began = entered()  # a measurement started inside this forward moves it
        try:
            out = forward()
        except AssertionError as err:
            if NO_PAD_TOKEN not in str(err):
                raise
            raise ValueError(str(err)) from err
        if self._calls == 0 and self._delta is not None:
            raise RuntimeError(
                f"submodule {self.name!r} was not called during a forward pass of perturbed "
                "copies (it was during the clean one), so their noise was never added and "
                "every copy would count as unchanged: a sensitivity of 0. The forward takes "
                "another path for the copies — one that depends on the batch size or the "
                "input length (padding-aware batching cuts copies after their last real "
                "token: try trim_padding=False), or reuses an earlier output of the module. "
                "Hook a module that every forward runs"
            )
        if self._calls > 1 and began is not None and entered() != began:
            raise RuntimeError(
                "a measurement was started inside this measurement's forward pass (from the "
                "model's forward, a forward hook or the output= callable, in the same thread), "
                f"and its forwards ran submodule {self.name!r} too ({self._calls} calls in one "
                "forward pass): each measurement's noise reaches the other's forwards, so "
                "neither number would be the model's. Measure one at a time: call the inner "
                "measurement before or after this one, not from inside the forward it runs"
            )
        if self._calls > 1:
            raise ValueError(
                f"submodule {self.name!r} ran {self._calls} times in one forward pass (a module "
                "shared by several places, e.g. one LayerNorm applied twice); noise on it would be "
                "added at every call. Hook a module that runs once per forward, e.g. the token "
                "embedding. (Or another thread ran it meanwhile without entering the measured "
                "model's forward — a part of it, or a container's model: measure a copy, or "
                "hold senslab.measure.exclusive(model) in that thread)"
            )
        return out

    def run_clean(self, mask: Tensor | None) -> None:
        _refuse_a_tensor_as_cache(self.model, self.inputs)
        inputs = _cloned(self.inputs)  # the model may edit its inputs in place
        raw = self._count(lambda: call_model(self.model, inputs, self.output))
        if self._shape is None:
            named = _named_inputs(self.model, self.inputs)
            called = _called_embeddings(self.model, self.inputs, self.output)
            if isinstance(named, dict) and isinstance(named.get("inputs_embeds"), Tensor):
                # no module puts out inputs_embeds: "hook a module the forward runs" named none
                # (BERT's embedding LayerNorm runs on them: it is named where it does)
                raise RuntimeError(
                    f"submodule {self.name!r} was not called during the forward pass: the "
                    "inputs hold 'inputs_embeds', which the model takes in place of its "
                    "embedding's output, so the embedding never runs and no module of the model "
                    "puts those vectors out. Pass the token ids instead ({'input_ids': ids, "
                    f"...}}: the noise then lands on the output of {self.name!r}, the embedding "
                    "that runs), or measure a wrapper that runs the vectors through a module of "
                    "its own, with Embedding('embeds'): class Embeds(nn.Module) whose __init__ "
                    "keeps the model and sets self.embeds = nn.Identity(), and whose "
                    "forward(self, inputs_embeds, **kwargs) returns "
                    "self.model(inputs_embeds=self.embeds(inputs_embeds), **kwargs)"
                    + (f". (Modules the forward does run on them: {', '.join(map(repr, called))})"
                       if called else "")
                )
            raise RuntimeError(
                f"submodule {self.name!r} was not called during the forward pass. A module that "
                "shares its weight with the one the forward calls is not on the path (T5's and "
                "BART's 'shared' embedding: the encoder calls 'encoder.embed_tokens'), nor is an "
                "embedding when the inputs are inputs_embeds: hook a module the forward runs"
                + (f", e.g. one of {', '.join(map(repr, called))}" if called else "")
            )
        b, t, d = self._shape
        if b != batch_size(self.inputs):
            _refuse_choices(self.name, self._shape, self.inputs)
            raise ValueError(
                f"submodule {self.name!r} output is not batch-first: shape {self._shape} for "
                f"{batch_size(self.inputs)} examples (a sequence-first model, e.g. nn.LSTM or "
                "nn.Transformer with batch_first=False, puts its positions first); hook a module "
                "whose output is (batch, tokens, dim)"
            )
        self.dim = d
        cast = autocast_grid(self._clean)
        if cast is not None:  # float32 token vectors, rounded by autocast='s first layer
            what = f"token vectors of {self.name!r}"
            self._check_cast = GridCheck(what, AUTOCAST_FIX % what, cast)
        key, padding = input_mask(self.inputs, b, t, mask is not None, self.model)
        if isinstance(padding, Tensor) and tuple(padding.shape) == (b, t):
            try:
                # an additive mask (0 real, −1e9 padding) read as bool would be the padding
                padding = real_tokens(padding, f"the input's {key!r} entry")
            except ValueError:
                if mask is None:
                    raise
                padding = None  # mask= says which tokens are real; this entry is not read
            if padding is not None:
                self.padding = padding.to(device=raw.device)
                self.padding_key = key
        if mask is None and key is not None:
            if isinstance(padding, Tensor) and tuple(padding.shape) != (b, t):
                shape = tuple(padding.shape)
                why = (f"the model pads or adds tokens inside its forward ({shape[1]} in the "
                       f"inputs, {t} at {self.name!r})"
                       if len(shape) == 2 and shape[0] == b else
                       "it is no (batch, tokens) mask of real tokens")
                raise ValueError(
                    f"the input's {key!r} entry has shape {shape}, but {self.name!r} puts out "
                    f"{t} tokens for each of {b} examples: {why}. Say which of those {t} "
                    f"positions are real tokens with mask= of shape ({b}, {t})"
                )
            mask = padding
        if mask is None:
            _refuse_unmasked_padding(self.model, self.inputs, b, t)
            _refuse_added_positions(self.inputs, b, t, self.name)
        self.valid = valid_mask(mask, b, t, raw.device)
        if self.padding is not None:
            _say_mask_over_padding(self.valid, self.padding, self.padding_key)
        self.trimmable = has_token_axis(self.inputs, t)
        # a decoder fed its own inputs has positions of its own; one that reads the inputs
        # shifted right (BART without decoder_input_ids) has theirs; ``labels`` are decoder
        # inputs too (Hugging Face's encoder-decoders feed the decoder labels shifted right):
        # with labels of the inputs' length, position=-1 was read at a decoder position
        # without a word
        seq2seq = encoder_decoder(self.model) and isinstance(self.inputs, dict) and any(
            str(k).startswith("decoder_input") or k == "labels" for k in self.inputs)
        real = self.valid if self.padding is None else self.padding | self.valid
        self.ends = last_real(real)
        if self.output is None:  # an output= the user chose is read as they chose
            _refuse_per_token_head(self.model, raw, t, self.position)
        # a per-position output has the inputs' token count at full width: one whose second
        # axis has another length (a seq2seq model's decoder positions) is never read at a
        # position, also where a cut width happens to equal that length (:meth:`_read`)
        if raw.dim() == 3 and seq2seq:
            _refuse_decoder_position(self.model, self.position)
        self._per_position = raw.dim() == 3 and raw.shape[1] == t and not seq2seq
        if raw.dim() == 3 and not seq2seq and raw.shape[1] != t \
                and isinstance(self.position, int):
            _refuse_other_positions(self.model, self.name, self.position, tuple(raw.shape), t)
        if self.padding is None and self.position is not None and self._per_position:
            _refuse_real_tokens_after_the_mask(self.model, self.inputs, self.valid)
        # with an attention mask, a position before each example's first real token is left
        # padding (mask= alone may leave out a [CLS] at 0 that is a real token: not judged)
        starts = None if self.padding is None else first_real(real)
        self.starts = starts
        if self.position is None and self.padding is not None and self._per_position:
            # the whole output, on the real rows: the padding's outputs are no example's
            self.clean_output = real_rows(raw, self.ends, t, t, starts)
        else:
            self.clean_output = read_position(raw, self.ends, self.position, t, starts)
        self._refuse_padding_of_another_id()
        self._refuse_unread_tokens()
        self._refuse_overwritten_tokens()
        if not _LEFT_PADDING_JUDGED.get():  # else the caller says it, or refuses the inputs
            self.warn_left_padding_read()

    def _refuse_padding_of_another_id(self) -> None:
        """Refuse right padding whose ids are not the pad id the model declares, where the
        model finds each example's last real token by that id (:func:`read_by_pad_id`: Hugging
        Face's decoder classifiers, whatever the attention mask says). Its clean output is then
        read at the padding, and so is a copy at full width (a copy cut after its last real
        token would be read at that token): the padding-aware batching's check saw the cut
        change the clean outputs and fell back to full width with a warning that advised
        trim_padding=False, and with it measured the padding's outputs without a word (a
        GPT-2 classifier with pad id 0 fed padding of id 1 measured 0 on 10 examples that
        measure 0.25 unpadded, one of them 0.75).

        Each example's last real token is the attention mask's, else the last one ``mask=``
        marks: with token ids and ``mask=`` alone the same padding measured 0 on the same
        examples, also by default (the check falls back quietly where ``mask=`` alone says
        which tokens are real: it may leave out an end token). Where the model reads examples
        after ``mask=``'s last true position at ids that differ, those are real tokens
        ``mask=`` leaves out (padding repeats one id), and the model's reading is measured as
        before; at one id, they are padding or a common end token: refused, with the fix of
        each. The pad id is the one the classifier reads, of the
        text part of a composite config too (:func:`hf_pad_token_config`).

        Only where it changes the position read: some example's rightmost id that is not the
        pad id lies after its last real token — never for padding of the pad id, nor for left
        padding. And only where the model is seen to read that way: the first such example,
        its padding set to the pad id, gives another output than the clean one, and the one of
        the example cut after its last real token (the fix works); an encoder that reads [CLS]
        gives the same output (two single-example forwards, only for inputs whose ids after
        the last real token are not all the pad id)."""
        found = hf_pad_token_config(self.model)
        if found is None:  # senslab's zoo (config.pad_id) reads the attention mask
            return
        config, path = found
        pad = getattr(config, "pad_token_id", None)
        vocab = getattr(config, "vocab_size", None)
        # no mask at all: every position is real, and nothing lies after the last
        real = self.padding if self.padding is not None else self.valid
        ids = _token_ids(self.inputs)
        if not isinstance(pad, int) or isinstance(pad, bool) \
                or not isinstance(ids, Tensor) or ids.shape != real.shape \
                or ids.is_floating_point():
            return
        if pad < 0 or (isinstance(vocab, int) and pad >= vocab):
            return  # no token it could be fed (on a GPU the lookup would poison the context)
        if self._per_position and self.position is not None:
            return  # senslab reads the output itself, at the last real token
        ends = last_real(real)
        read = read_by_pad_id(ids.to(ends.device), pad)
        rows = ((read > ends) & (ends >= 0)).nonzero().flatten()
        if not len(rows):
            return
        at_read = ids.gather(1, read.to(ids.device)[:, None])[:, 0]  # the id each row is read at
        if self.padding is None and len(at_read[rows.to(ids.device)].unique()) > 1:
            return  # mask= alone, read at different ids: real tokens (padding repeats one id)
        t = ids.shape[1]
        row = rows[:1]
        end = int(ends[row])
        after = torch.arange(t, device=ids.device) > end
        fixed = _with_token_ids(select(self.inputs, row),
                                ids.index_select(0, row.to(ids.device)).masked_fill(after, pad))
        dev = self._clean.device
        try:
            on_pad = self._read(self._evaluate(fixed, None, torch.zeros(1, t, self.dim,
                                                                        device=dev), t), row, t)
            alone = self.forward_perturbed(row, None, torch.zeros(1, end + 1, self.dim,
                                                                  device=dev), width=end + 1)
        except (RuntimeError, ValueError, TypeError, IndexError):
            return  # the model takes no such inputs: not judged (the trimming's check still is)
        if _agree(on_pad, self.clean_output[row]) or not _agree(on_pad, alone):
            return
        tail = torch.arange(t, device=ids.device)[None, :] > ends.to(ids.device)[:, None]
        padded = ids[tail & (ids != pad)].unique()[:3].tolist()
        if self.padding is None:  # the id read at (the tokens mask= leaves out may be more)
            padded = [int(at_read[int(row)])]
        ids_said = f"id{'s' if len(padded) > 1 else ''} {', '.join(map(str, padded))}"
        name = type(unwrapped(self.model)).__name__
        listed = rows[:5].tolist()
        which = f"{listed}{' …' if len(rows) > 5 else ''}"
        at = f"example {listed[0]} at position {int(read[row])}"
        where = f"{path}.pad_token_id"
        fix = (f"model.{where} to the id the inputs are padded with, the tokenizer's "
               f"(model.{where} = tokenizer.pad_token_id; here {padded[0]}), or pad the "
               f"inputs with {pad}")
        if self.padding is not None:
            raise ValueError(
                f"{name} reads each example's output at its last token whose id is not its "
                f"pad id {pad} ({where}), whatever the attention mask says, but the padding of "
                f"the inputs (where {self.padding_key!r} is 0) holds {ids_said}: the model "
                f"reads example(s) {which} at their padding ({at}, after its last real token "
                f"at {end}), and senslab would measure the padding's output, with "
                f"trim_padding=False too. Set {fix}"
            )
        raise ValueError(
            f"{name} reads each example's output at its last token whose id is not its pad id "
            f"{pad} ({where}), but mask= ends some examples before such a token, of "
            f"{ids_said}: the model reads example(s) {which} there ({at}, after the last token "
            f"mask= marks real, at {end}), and senslab would measure that position's output, with "
            f"trim_padding=False too. If those tokens are padding, set {fix}. If they are real "
            "tokens mask= leaves unperturbed (an end token), pass the attention mask too "
            "({'input_ids': ids, 'attention_mask': attention_mask}): it then says where each "
            "example ends, and mask= only which tokens get noise"
        )

    def _refuse_unread_tokens(self) -> None:
        """Refuse tokens that get noise after the position a Hugging Face decoder classifier
        reads: it reads each example at its rightmost id that is not its pad id
        (:func:`read_by_pad_id`), so tokens of the pad id that the attention mask (or ``mask=``)
        marks real after that position — padding under an all-ones attention mask, or an end
        token whose id is the pad id (pad = eos) — cannot change its output, and would be
        measured as tokens that never flip (a GPT-2 classifier measured 0.086 where its
        right-padded examples measure 0.165).

        Only where such tokens get noise, and only where the model is seen to read there: the
        first such example, cut after the position read, gives its clean output (an encoder
        that attends to those tokens gives another), and cut before it another one (an output
        read earlier, a causal LM's ``logits[:, 0]``, gives the same): two single-example
        forwards, only for inputs with such tokens."""
        found = hf_pad_token_config(self.model)
        if found is None or self.valid is None:
            return
        config, path = found
        pad = getattr(config, "pad_token_id", None)
        ids = _token_ids(self.inputs)
        if not isinstance(pad, int) or isinstance(pad, bool) or not isinstance(ids, Tensor) \
                or ids.shape != self.valid.shape or ids.is_floating_point():
            return
        if self._per_position and self.position is not None:
            return  # senslab reads the output itself, at the last real token
        ids = ids.to(self.valid.device)
        read = read_by_pad_id(ids, pad)
        t = ids.shape[1]
        after = torch.arange(t, device=ids.device)[None, :] > read[:, None]
        at_read = ids.gather(1, read[:, None])[:, 0]
        rows = ((after & self.valid).any(dim=1) & (at_read != pad)).nonzero().flatten()
        judged = rows[read[rows] > 0]  # one token before the position read, to cut it off
        if not len(judged):
            return
        row = judged[:1]
        width = int(read[row]) + 1

        def cut(w: int) -> Tensor:
            zero = torch.zeros(1, w, self.dim, device=self._clean.device)
            return self.forward_perturbed(row, None, zero, width=w)

        try:
            kept, short = cut(width), cut(width - 1)
        except (RuntimeError, ValueError, TypeError, IndexError):
            return  # the model takes no such inputs: not judged
        if not _agree(kept, self.clean_output[row]) or _agree(short, self.clean_output[row]):
            # the tokens after the position change the output (they are read), or the token
            # at it does not (the output is read before it: a causal LM's logits[:, 0])
            return
        name = type(unwrapped(self.model)).__name__
        where = f"{path}.pad_token_id"
        listed = rows[:5].tolist()
        which = f"{listed}{' …' if len(rows) > 5 else ''}"
        unread = int((after & self.valid)[row].sum())
        by_entry = self.padding is not None and torch.equal(self.padding, self.valid)
        said = f"the input's {self.padding_key!r} entry" if by_entry else "mask="
        raise ValueError(
            f"{name} reads each example's output at its last token whose id is not its pad id "
            f"{pad} ({where}), but {said} marks tokens of id {pad} after that position as real "
            f"tokens to perturb: example(s) {which} are read before them (example {int(row)} "
            f"at position {width - 1}, and {unread} token(s) after it get noise), so those "
            "tokens can never change the output and would be measured as tokens that never "
            "flip, diluting the rate. If they are padding, mark them as padding (attention_mask "
            "0 there, as tokenizer(..., padding=True) returns it; or mask= False there). If "
            f"they are real tokens whose id is the pad id (an end token, pad = eos), the model "
            f"never reads them: leave them out of the inputs, or pad with another id and set "
            f"model.{where} to it"
        )

    def _refuse_overwritten_tokens(self) -> None:
        """Refuse noise on the placeholder tokens of a Hugging Face multimodal model (LLaVA,
        Qwen2-VL, Gemma 3, Qwen2-Audio: :data:`PLACEHOLDER_KEYS` of its config) where the
        forward overwrites them after the hooked module: it writes the image, video or audio
        encoder's features over those positions of the word embedding's output, so their
        noise is discarded and they would be measured as tokens that never flip (a LLaVA's 16
        image positions of 22 read 0, diluting the mean). Seen, not assumed: one forward of the
        first such example with noise on those positions alone; a module hooked after the
        merge keeps the noise and passes."""
        ids = _token_ids(self.inputs)
        if self.valid is None or not isinstance(ids, Tensor) \
                or ids.shape != self.valid.shape or ids.is_floating_point():
            return
        found = placeholder_ids(self.model)  # read only for token ids: it may walk the modules
        if not found:
            return
        ids = ids.to(self.valid.device)
        hit = torch.zeros_like(self.valid)
        for pid in found.values():
            hit |= ids == pid
        hit &= self.valid
        rows = hit.any(dim=1).nonzero().flatten()
        if not len(rows):
            return
        row = rows[:1]
        clean = self._clean[row]
        # noise of the tokens' own size on the placeholders alone: a real change of any model
        # that reads them
        scale = float(clean.float().abs().amax()) or 1.0
        noise = torch.zeros_like(clean)
        noise[0, hit[row[0]]] = scale
        try:
            moved = self.forward_perturbed(row, None, noise)
            still = self.forward_perturbed(row, None, torch.zeros_like(clean))
        except (RuntimeError, ValueError, TypeError, IndexError):
            return  # the model takes no such inputs: not judged
        if not torch.equal(moved, still):
            return
        named: dict[int, str] = {}
        for key, pid in found.items():  # LLaVA's image_token_index and image_token_id alias
            named.setdefault(pid, key)
        which = ", ".join(f"{key}={pid}" for pid, key in named.items())
        per = hit.sum(dim=1)[rows]
        raise ValueError(
            f"{type(unwrapped(self.model)).__name__}'s forward writes its media encoder's "
            f"features over the positions of its placeholder token(s) ({which}) after "
            f"{self.name!r}: noise there is discarded (seen: example {int(row)}'s output did "
            f"not move with noise on its {int(per[0])} placeholder position(s) alone), so they "
            "would be measured as tokens that never flip, diluting the rate. Measure the text "
            "tokens alone with mask= (e.g. mask=(input_ids != id) & attention_mask.bool() for "
            "each placeholder id), or hook a module that runs after the merge (the language "
            "model's first decoder layer, say) to perturb the media positions too"
        )

    def warn_left_padding_read(self) -> None:
        """Warn where left-padded inputs give the model another output than the same text
        alone, unpadded (:meth:`_judge_left_padding`): the model reads its padding (an encoder
        classifier pools its first token, [CLS], which is padding there) or its absolute
        positions shift with the padding. ``trim_padding=False`` measures such inputs as they
        are, and said nothing: a DistilBERT classifier fed left-padded batches was measured at
        a padding position, its [CLS] slot, with no word. A model with relative positions that
        finds its last real token itself (Llama's, Qwen2's classifiers), or one that reads left
        padding as its own (XLNet, which reads its last position), gives the text's own output:
        no warning. The advice names right padding only where it was found to give the text's
        own output (XLNet's last position is padding there).

        Called by the clean forward, or — inside :func:`left_padding_judged` — by the caller,
        only where the measurement goes on with the left-padded inputs (``TokenSensitivity``
        refuses them under ``trim_padding=True``, so the warning is not followed by a
        refusal that says the same)."""
        found = self._judge_left_padding()
        if found is None or not found.misread:
            return
        if found.right_reads is False:
            fix = ("Padded on the right it gives another output than the text alone too: batch "
                   "texts of one length (no padding), or measure them one at a time")
        else:
            fix = ("Pad on the right (Hugging Face: tokenizer.padding_side = 'right'), or, for a "
                   "model with absolute positions, pass position_ids (attention_mask.cumsum(-1) "
                   "- 1, clamped at 0)")
        # one text for every batch and example: said once where warnings say a text once
        warnings.warn(
            "the inputs are left-padded (the attention mask's padding comes first), and "
            f"{type(unwrapped(self.model)).__name__} gives a left-padded example {LEFT_READ}: "
            "it reads its padding (an encoder classifier pools its first token, which is "
            "padding there) or its absolute positions shift with the padding. The measurement "
            "is that of the left-padded inputs as they are, not of the texts as the model "
            f"reads them unpadded. {fix}",
            RuntimeWarning, stacklevel=user_level(),
        )

    def left_padding_read(self) -> str | None:
        """What :meth:`_judge_left_padding` finds, in words for a refusal of left padding (the
        first left-padded example gives the model the same output as its text alone, unpadded,
        or another), or None where it is not judged."""
        found = self._judge_left_padding()
        if found is None:
            return None
        row = found.row
        name = type(unwrapped(self.model)).__name__
        if found.misread:
            fix = ("pad on the right" if found.right_reads is not False else
                   "right padding gives another output too, so batch texts of one length")
            return (f"{name} gives example {row} {LEFT_READ}, so trim_padding=False would "
                    f"measure these inputs as the model misreads them: {fix}")
        if not found.alone_ran:  # compared with right padding only
            return (f"{name} gives example {row} the same output padded on either side (the "
                    "first left-padded example, the one checked; the model took no input cut "
                    "to its real tokens), so trim_padding=False measures these inputs as the "
                    "texts padded on the right")
        return (f"{name} gives example {row} {READ_AS_TEXT} "
                "(the first left-padded example, the one checked), so trim_padding=False "
                "measures these inputs as the texts unpadded")

    def _judge_left_padding(self) -> LeftPadding | None:
        """Whether the first left-padded example gives another output than its text alone,
        unpadded (:class:`LeftPadding`), or None: no left padding in the attention mask, an
        output read per position, or a model that takes no such inputs. Judged once per bind,
        in one forward of the example cut to its real tokens (every input tensor with a token
        axis cut alike, position ids too) and, where the left-padded output differs from it,
        one more with the real tokens moved to the front; later calls read the finding."""
        if not self._left_judged:
            self._left_read = self._left_padding_forward()
            self._left_judged = True
        return self._left_read

    def _left_padding_forward(self) -> LeftPadding | None:
        if self.padding is None:
            return None
        real = self.padding
        t = real.shape[1]
        starts = first_real(real)
        left = ((starts > 0) & (starts < t)).nonzero().flatten()
        if not len(left):
            return None
        row = left[:1]
        shift = int(starts[row])
        n = t - shift

        one = select(self.inputs, row)
        if not isinstance(one, (dict, tuple, list)):
            return None

        def along_tokens(edit: Any) -> Inputs:
            """``one`` with ``edit`` applied to every tensor with a token axis."""
            def each(v: Any) -> Any:
                is_tokens = isinstance(v, Tensor) and v.dim() >= 2 and v.shape[1] == t
                return edit(v) if is_tokens else v
            if isinstance(one, dict):
                return {k: each(v) if per_example(k) else v for k, v in one.items()}
            return rebuilt(one, (each(v) for v in one))

        moved = along_tokens(lambda v: torch.roll(v, -shift, dims=1))
        alone = along_tokens(lambda v: v[:, shift:])
        found = hf_pad_token_config(self.model)
        pad = getattr(found[0], "pad_token_id", None) if found is not None else None
        ids = _token_ids(moved)
        if isinstance(pad, int) and not isinstance(pad, bool) and isinstance(ids, Tensor) \
                and ids.shape == (1, t) and not ids.is_floating_point():
            # the padding moved to the right holds the pad id the model finds it by (a decoder
            # classifier reads its last token of another id): what padding on the right gives
            tail = torch.arange(t, device=ids.device)[None, :] >= t - shift
            moved = _with_token_ids(moved, ids.masked_fill(tail, pad))
        whole = self._per_position and self.position is None  # a per-position output kept whole
        at = None  # a per-position output read at a position: that position in the text's own
        if self._per_position and self.position is not None:  # (a causal LM's last token)
            end, k = int(self.ends[row]), self.position
            at = (end if k == "last" else k if k >= 0 else end + 1 + k) - shift
            if not 0 <= at < n:
                return None  # no position of the text (refused by the clean forward's reading)

        def real_part(out: Tensor, first: int) -> Tensor:
            """The ``n`` rows of the text's own tokens of a per-position output kept whole
            (the padding's rows are no example's, :func:`real_rows`), or, where the output is
            read at a position, the text's row there (the clean output ``first`` is read
            already); any other as it is: compared whole, the left-padded and the unpadded
            outputs differed in shape, and every model was said to misread left padding, right
            padding too. A causal LM's logits, read at the last real token, were not judged,
            and GPT-2 fed left padding without position_ids was measured at shifted positions
            without a word."""
            if out.dim() != 3:
                return out
            if at is not None:
                return out[:, at]
            return out[:, first:first + n] if whole else out

        left_out = real_part(self.clean_output[row], shift)
        try:  # the text alone: what the model gives it unpadded
            own = real_part(self._evaluate(alone, None, torch.zeros(1, n, self.dim,
                                                                    device=self._clean.device),
                                           n), 0)
        except (RuntimeError, ValueError, TypeError, IndexError):
            own = None  # a model that takes no shorter inputs: judged against right padding
        if own is not None and _agree(own, left_out.to(own.device)):
            return LeftPadding(False, int(row), True, None)
        try:
            right = self._evaluate(moved, None, torch.zeros(1, t, self.dim,
                                                            device=self._clean.device), t)
        except (RuntimeError, ValueError, TypeError, IndexError):
            if own is None:
                return None  # the model takes no such inputs: not judged
            return LeftPadding(True, int(row), True, None)
        right = real_part(right, 0)
        if own is None:  # judged against right padding alone (the finding says so)
            return LeftPadding(not _agree(right, left_out.to(right.device)), int(row), False,
                               None)
        return LeftPadding(True, int(row), True, _agree(own, right))

    def tokens(self, src: Tensor, tok: Tensor) -> Tensor:
        return self._clean[src, tok]

    def prepare(self) -> None:
        """Build prefix reuse's clean cache before any copy is evaluated: the automatic chunk
        size then meters what one copy costs, not this cache, which every chunk shares (on a
        batch of 64 sentences it made the probe size chunks of 7 copies)."""
        if self.reuse and self._cache is None:
            self._cache = self.model.prefix_cache(self._clean,
                                                  _named_inputs(self.model, self.inputs))

    def copy_bytes(self) -> int:
        """Bytes of the cache one copy reads (its example's rows, which prefix reuse gathers per
        copy): added to the probe's per-copy cost, which sees module outputs only."""
        if not self.reuse or self._cache is None:
            return 0
        leaves = [t for t in tree_flatten(self._cache)[0] if isinstance(t, Tensor)]
        # the cache holds every example of the batch: one example's share
        return sum(t.numel() * t.element_size() for t in leaves) // max(self._clean.shape[0], 1)

    def forward_perturbed(self, src: Tensor, tok: Tensor | None, noise: Tensor,
                          width: int | None = None) -> Tensor:
        if self.reuse and tok is not None:  # already reads each copy up to its last real token
            self._rounding(self._clean[src, tok], noise)  # the model adds it to its own cache
            self.prepare()
            out = select_output(self.model.forward_suffix(self._cache, src, tok, noise),
                                self.output)
            return self._read(out, src, self.valid.shape[1])
        t = self.valid.shape[1]
        width = t if width is None else width
        if tok is None:
            valid = self.valid.index_select(0, src)[:, :width]
            noise = noise * valid.unsqueeze(-1).to(noise.dtype)
        inputs = cut_tokens(select(self.inputs, src), t, width)
        return self._read(self._evaluate(inputs, tok, noise, width), src, width)

    def _evaluate(self, inputs: Inputs, tok: Tensor | None, noise: Tensor,
                  width: int) -> Tensor:
        """The model's output on ``inputs`` (``width`` tokens) with ``noise`` added at ``tok``
        (every position where None) by the hook, not yet read at a position."""
        self._delta = (tok, noise)
        self._width = width
        try:
            out = self._count(lambda: call_model(self.model, inputs, self.output))
        except ValueError as err:
            if NO_PAD_TOKEN not in str(err):
                raise
            # Hugging Face's decoder classifiers (GPT-2…) pool at the last non-pad token and
            # refuse batches without a pad id: the copies of one example are such a batch
            raise ValueError(no_pad_id_message(self.model)) from err
        finally:
            self._delta = None
            self._width = None
        return out

    def _read(self, out: Tensor, src: Tensor, width: int) -> Tensor:
        """A per-position output of copies of examples ``src`` read at ``position``; an output
        that was no per-position one at full width (:meth:`run_clean`) as it is."""
        assert self.ends is not None  # set by run_clean
        if not self._per_position:
            return out
        ends = self.ends.index_select(0, src.to(self.ends.device))
        if self.position is None and self.padding is not None:
            starts = (None if self.starts is None
                      else self.starts.index_select(0, src.to(self.starts.device)))
            return real_rows(out, ends, width, self.valid.shape[1], starts)
        return read_position(out, ends, self.position, width)
