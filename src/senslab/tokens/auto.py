"""Tokens for a model you did not build: :func:`auto_tokens` picks the tokenization of a Hugging
Face or timm model (or any CNN) from the model itself.

==========================================  ================================================
model                                       tokens
==========================================  ================================================
has ``default_tokens()`` (senslab's zoo)     that, with the options applied where they fit
                                             and refused where not (**Options**, below)
HF image model (``main_input_name`` is       ``Patches(p)``, p = ``config.patch_size`` or
``pixel_values``), timm ViT: a patch size    ``patch_embed.patch_size``, where the first
p whose first convolution cuts the image     convolution takes the image's channels with
into p×p patches that stay the tokens        kernel = stride = p and no padding, and the model
(ViT, DeiT, BEiT, DINOv2, Swin, EVA…)        attends over those patches or never strides again
a pyramid ViT whose first stage's patch      ``Patches(p)``, p = that embedding's
embedding, named otherwise (timm Twins'      ``patch_size`` (4), under the same conditions:
``patch_embeds.0``, CoaT's                   the first stage attends over its 4×4 patches,
``patch_embed1``, HF PVT), declares p        as Swin's does
timm hybrid ViT (a CNN ``backbone`` in       ``Patches(img_size // grid_size)``: a token's size
``patch_embed``: ``vit_small_r26_s32``)      in pixels (32), not ``patch_size`` (1, a patch of
                                             the backbone's feature map)
timm ViT with a convolutional patch          ``Patches(p)``, p = ``patch_embed.patch_size``:
embedding (XCiT: stride-2 convolutions       the cell of the image each token stands for
in ``patch_embed`` that together stride p,
then attention and no further stride)
an isotropic patch network (ConvMixer: a    ``Patches(p)``: the model's own patch grid
p×p stride-p stem, no later stride)
any other model with a ``Conv2d`` (CNN),     ``Patches(DEFAULT_CNN_PATCH)`` = 16: the grid of
also one whose patch size is no such cut     ViT-B/16, so a CNN and a ViT at 224×224 are
(HF MobileViT: an unfold on downsampled      measured on the same 14×14 patches
maps) or a patchify stem followed by
strided convolutions (timm/HF ConvNeXt,
FocalNet; HF ResNet)
HF text model (``get_input_embeddings()``)   ``Embedding`` on the output of the embeddings
                                             block (below)
HF text model that runs sequence-first       refused (``TypeError``): no module inside puts
(XLNet: it transposes the token ids before   out batch-first vectors; the message gives a
its word embedding)                          wrapper that embeds batch-first and its
                                             ``Embedding``
==========================================  ================================================

**Text: which module.** As in the paper, noise goes on the token vectors that enter the first
transformer block, after the embedding LayerNorm (``embedding="block"``, default):

* an embeddings block with a LayerNorm (BERT, RoBERTa, MiniLM, DistilBERT, ELECTRA…):
  that LayerNorm, e.g. ``bert.embeddings.LayerNorm``. In these models it follows the sum of the
  word, position and token-type embeddings, so a token vector already holds its position (the
  zoo's own text models put their LayerNorm before the positions are added). Where the block
  maps the LayerNorm's output on (FNet's ``projection``), the block's own output instead.
* a linear map from the embedding size to the hidden size after that LayerNorm (ALBERT's
  ``albert.encoder.embedding_hidden_mapping_in``; ELECTRA-small's and ConvBERT's
  ``embeddings_project``): that map, whose output is what enters the first block; noise on the
  LayerNorm's narrower output would reach the block mapped, in other units than σ.
* GPT-2 style, learned positions ``wpe`` and no embedding LayerNorm: the dropout after the sum
  of token and position embeddings (``transformer.drop``), i.e. exactly that sum in eval mode;
  likewise CTRL's ``transformer.dropout`` after its scaled word vectors plus ``pos_encoding``.
* an embedding LayerNorm beside the word embedding (BART's ``layernorm_embedding``, applied after
  the positions are added; BLOOM's ``word_embeddings_layernorm``): that LayerNorm, where the
  forward calls it before its layers. A final norm so named (LFM2's ``embedding_norm``,
  BigBird-Pegasus' ``layernorm_embedding``, called after the last layer) is no such LayerNorm:
  the rules below apply.
* positions added inside the forward after the word embedding (``embed_positions``: OPT, Marian,
  Pegasus): no module's output is the vector entering the first block, so ``"block"`` is
  refused, naming ``embedding="word"`` (noise before the positions), with σ divided by the
  factor where the forward scales the word vectors first (Marian's, Pegasus' ``embed_scale``),
  or ``Embedding("….project_in")`` where it maps them into the hidden size (OPT-350m).
* a word embedding whose output the model multiplies inside its forward
  (``embedding_multiplier``: Granite, Falcon-H1; RecurrentGemma's ``normalizer``, Gemma's
  √hidden_size on transformers 4.x, T5Gemma's encoder's on 5): no module's output is the vector
  entering the first block, so ``"block"`` is refused, naming ``embedding="word"`` with σ
  divided by that factor.
* a norm the forward runs on the word vectors before the first block and again after the last
  layer (NanoChat's ``norm``): it cannot take noise once, and the word embedding's noise
  reaches the block rescaled by it, so ``"block"`` is refused, naming ``embedding="word"``.
* an encoder–decoder model whose encoder and decoder share one word-embedding module (T5 on
  transformers 4.x; T5 and BART after ``resize_token_embeddings``): tokens on that module are
  refused (the decoder would get the noise too), naming how to give the encoder its own module
  with the same weights; BART's encoder ``layernorm_embedding`` is still picked.
* otherwise (Llama-style models with rotary positions): the word-embedding output, which is
  then itself what enters the first block.

``embedding="word"`` puts the noise on the word-embedding lookup instead
(``model.get_input_embeddings()``, e.g. ``bert.embeddings.word_embeddings``), before positions
and LayerNorm. A causal language model's (batch, positions, vocabulary) logits are compared at
each example's last real token (``position=``, see :class:`~senslab.tokens.Embedding`).

**Options.** An option given is applied or refused (``ValueError`` naming it, the model and
the fix), never dropped. ``patch_size=`` applies to a model measured on image patches (for a
zoo model, a size that divides its ``config.image_size``); ``embedding=`` and ``position=`` to
one measured through an ``Embedding``; ``sigma_space="pixel"``, ``std=``, ``mean=`` to images
only. A zoo text model's ``embedding="word"`` is its lookup ``embed`` (its default tokens are
the LayerNorm ``embed_ln`` after it); a zoo model whose default tokens already are its lookup
(``modadd_transformer``, ``parity_transformer``, ``boolean_transformer``) keeps them; a model
fed vectors (``Sequence()``: ``sparse_attention``, ``attention_model``) has no lookup and no
position to read. With no option given, a zoo model's tokens are its ``default_tokens()``.

**Images: σ in pixel space.** ``sigma_space="pixel"`` gives σ on [0, 1] pixels, converted
through the model's own normalisation (:class:`~senslab.tokens.Patches`): ``std=`` if given,
else a Hugging Face ``image_processor``'s ``image_std``, else a timm model's
``pretrained_cfg["std"]``. The default, ``"input"``, adds σ to the images as they are passed:
for a timm or Hugging Face model fed normalised images, σ in its normalised units, which are
not the same from model to model (timm's ImageNet std is about 0.226 per channel, its
``augreg`` ViTs' 0.5, its CLIP models' about 0.27), so one σ is another pixel noise for each;
compare models with ``sigma_space="pixel"``. A model that takes [0, 1] pixels and normalises
them itself (a wrapper with the normalisation inside) needs no conversion: its input units are
pixels already.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from typing import Any, Literal

import torch
from torch import nn

from .base import Position, Tokenization, check_position
from .embedding import Embedding
from .patches import Patches, Sequence, model_normalization, processor_normalization

__all__ = ["DEFAULT_CNN_PATCH", "auto_tokens", "default_tokens", "headless_reason"]

#: patch size for a CNN (a model without a patch size of its own): ViT-B/16's grid
DEFAULT_CNN_PATCH = 16

_HOW = ("pass tokens explicitly: Patches(p) for (B, C, H, W) images, Embedding('<module name>') "
        "for token ids (the LayerNorm after the token embedding, or the embedding itself), "
        "Sequence() for (B, T, D) vectors")


def auto_tokens(
    model: nn.Module | Any,
    *,
    embedding: Literal["block", "word"] = "block",
    patch_size: int | None = None,
    sigma_space: Literal["input", "pixel"] = "input",
    std: float | tuple[float, ...] | None = None,
    mean: float | tuple[float, ...] | None = None,
    image_processor: Any = None,
    position: Position = "last",
) -> Tokenization:
    """The tokens to measure ``model`` on (see the module docstring for the rules).

    Args:
        model: a Hugging Face ``PreTrainedModel``, a timm model, a CNN, a model with
            ``default_tokens()``, or a wrapper holding exactly one Hugging Face or timm model
            (that model's tokens, an ``Embedding`` named from the wrapper).
        embedding: text models: ``"block"`` (the embeddings block's output after its LayerNorm,
            as in the paper; a zoo model's ``default_tokens()``) or ``"word"`` (the
            word-embedding lookup). ``"word"`` is refused for a model measured on images or
            input vectors.
        patch_size: images: overrides the model's patch size (or the CNN default, 16).
            Refused for a model measured on token vectors.
        sigma_space: images: ``"input"`` (σ on the model's inputs) or ``"pixel"`` (σ on [0, 1]
            pixels through the model's normalisation).
        std, mean: images, pixel space: the per-channel normalisation (default: from
            ``image_processor`` or the timm ``pretrained_cfg``).
        image_processor: a Hugging Face image processor (its ``image_std``/``image_mean``),
            with ``sigma_space="pixel"`` (refused without it).
        position: text models: where a per-position output is read (default: the last real
            token; :class:`~senslab.tokens.Embedding`). Any other value is refused for a model
            measured on images or input vectors.

    Example:
        >>> from transformers import BertConfig, BertForSequenceClassification
        >>> model = BertForSequenceClassification(BertConfig(
        ...     hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37))
        >>> auto_tokens(model).module
        'bert.embeddings.LayerNorm'
    """
    if embedding not in ("block", "word"):
        raise ValueError(f"embedding must be 'block' (the embeddings block's output, after its "
                         f"LayerNorm) or 'word' (the word-embedding lookup), got {embedding!r}")
    check_position(position)
    if image_processor is not None and sigma_space != "pixel":
        raise ValueError(
            "auto_tokens: image_processor= gives the normalisation that converts σ from [0, 1] "
            "pixels (sigma_space='pixel'); with sigma_space='input' σ is added to the inputs as "
            "they are and it would be dropped: pass sigma_space='pixel', or drop image_processor"
        )
    pixel = dict(sigma_space=sigma_space, std=std, mean=mean)
    if sigma_space == "pixel" and std is None:
        pixel.update(_processor_norm(image_processor) or {})
    if hasattr(model, "default_tokens"):
        return _declared(model, model.default_tokens(), embedding=embedding,
                         patch_size=patch_size, position=position, pixel=pixel)
    if not isinstance(model, nn.Module):
        raise TypeError(f"auto_tokens needs an nn.Module, got {type(model).__name__}; {_HOW}")
    inner = [] if _pretrained(model) else _pretrained_children(model)
    if len(inner) == 1:  # a wrapper of one pretrained model (a LightningModule's self.model)
        name, child = inner[0]
        tokens = auto_tokens(child, embedding=embedding, position=position,
                             patch_size=patch_size, image_processor=image_processor,
                             sigma_space=sigma_space, std=std, mean=mean)
        if isinstance(tokens, Embedding) and isinstance(tokens.module, str):
            return dataclasses.replace(tokens, module=f"{name}.{tokens.module}")
        return tokens
    if _is_image(model):
        _refuse_not_images(model)
        _refuse_text_options(model, "image patches", embedding, position)
        tokens = Patches(_patch_size(model) if patch_size is None else patch_size, **pixel)
        if patch_size is None:  # a grid refusal says where the size came from (not the user)
            object.__setattr__(tokens, "_chosen", (
                f"auto_tokens chose it: the model's own patch size, or {DEFAULT_CNN_PATCH} for a "
                "CNN"))
        return tokens
    _no_pixel(None, sigma_space, std, mean)
    word = _input_embeddings(model)
    if word is None:
        raise TypeError(
            f"auto_tokens cannot tell how to cut a {type(model).__name__} into tokens: it has no "
            "default_tokens(), is no Hugging Face text model (get_input_embeddings()), no ViT "
            "(config.patch_size or timm's patch_embed.patch_size) and no CNN (no Conv2d); "
            + _HOW
        )
    if isinstance(word, nn.modules.conv._ConvNd):
        # an audio model (Whisper's encoder.conv1): its "input embedding" is a convolution over
        # frames whose output is (batch, channels, length), and the model adds its positions
        # after it; no module of the text rules puts out (batch, tokens, dim) vectors
        raise TypeError(
            f"{type(model).__name__}'s input embedding ({_name(model, word)}) is a "
            f"{type(word).__name__} over its {getattr(model, 'main_input_name', 'inputs')!r}, "
            "not a token embedding: its output is (batch, channels, length), so auto_tokens "
            "cannot pick its tokens. Pass tokens explicitly: Embedding('<module name>') on a "
            "module whose output is (batch, tokens, dim), such as the first layer's input "
            "LayerNorm"
        )
    if patch_size is not None:
        raise ValueError(_inapplicable(
            model, f"patch_size={patch_size!r}", "token vectors (its word embedding "
            f"{_name(model, word)} and the modules after it)", "patch_size cuts images into "
            "patches; drop patch_size (embedding= picks the module the noise goes on)"))
    _refuse_decoder_embedding(model, word)
    _refuse_sequence_first(model, word)
    module = _text_module(model, word, embedding)
    _refuse_shared_with_decoder(model, module)
    return Embedding(module, position=position)


#: ``main_input_name`` of Hugging Face models fed audio (a waveform or spectrogram features):
#: a ``Conv2d`` (AST's patch embedding, Parakeet's subsampling) made them look like image models
AUDIO_INPUTS = ("input_values", "input_features")


def _refuse_not_images(model: nn.Module) -> None:
    """Refuse a model that looks like an image model (a ``Conv2d``, ``pixel_values``) but is not
    fed (batch, channels, height, width) images, the only input ``Patches`` cuts: a video model
    (VideoMAE, TimeSformer, ViViT: ``config.num_frames`` or a ``Conv3d``; (batch, frames,
    channels, height, width)), an audio model (AST, Parakeet: :data:`AUDIO_INPUTS`; a
    (batch, time, frequency) spectrogram), or one fed images already cut into patches (SigLIP 2's
    ``spatial_shapes``, Pix2Struct's ``flattened_patches``; (batch, patches, channels·p·p)).
    ``Patches`` was returned and the measurement then refused the input, for a spectrogram with
    the advice to add a channel axis, which the model cannot take."""
    config = getattr(model, "config", None)
    main = getattr(model, "main_input_name", None)
    frames = getattr(config, "num_frames", None)
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        params = {}
    # config.num_frames where pixel_values are the input: Perceiver's config has one for its
    # multimodal models, while its image classifiers take (batch, channels, height, width)
    if (main == "pixel_values" and isinstance(frames, int) and not isinstance(frames, bool)) \
            or any(isinstance(m, nn.Conv3d) for m in model.modules()):
        what = "videos, (batch, frames, channels, height, width)"
    elif main in AUDIO_INPUTS:
        what = (f"audio ({main!r}, a spectrogram or waveform such as (batch, time, "
                "frequency))")
    elif "spatial_shapes" in params or main == "flattened_patches":
        what = "images already cut into patches, (batch, patches, channels·p·p)"
    else:
        return
    block = next((n for n, m in model.named_modules() if type(m).__name__.endswith("Embeddings")
                  and not type(m).__name__.endswith("PatchEmbeddings")), None)
    example = f", here Embedding({block!r})" if block else ""
    raise TypeError(
        f"auto_tokens: {type(model).__name__} is fed {what}, not (batch, channels, height, "
        "width) images, the only input Patches cuts into patches, so it has no image patches "
        "to pick. Pass tokens explicitly: Embedding('<module name>') on the module whose output "
        f"is its (batch, tokens, dim) token vectors{example} (σ is then in the units of those "
        "vectors, not of the input)"
    )


def _refuse_decoder_embedding(model: nn.Module, word: nn.Module) -> None:
    """Refuse an encoder–decoder model whose word embedding is its decoder's alone: its encoder
    takes no token ids (Speech2Text, Canary, a ``SpeechEncoderDecoderModel``: audio features),
    so ``get_input_embeddings()`` is the embedding of the ``decoder_input_ids``. Noise there
    would measure the decoder's tokens, not the model's inputs; the refusals given before said
    the encoder and decoder share it, with a fix (a copy for the encoder) that left it refused."""
    encoder, decoder = _stack(model, "encoder"), _stack(model, "decoder")
    if encoder is None or decoder is None or any(m is word for m in encoder.modules()) \
            or not any(m is word for m in decoder.modules()):
        return
    main = getattr(model, "main_input_name", "inputs")
    raise TypeError(
        f"{type(model).__name__}'s input embedding ({_name(model, word)}) is its decoder's: "
        f"its encoder ({_name(model, encoder)}) takes {main!r} and has no token embedding, so "
        "noise on that module would measure the decoder's own tokens (decoder_input_ids), not "
        "the model's inputs, and auto_tokens cannot pick its tokens. Pass tokens explicitly: "
        "Embedding('<module name>') on a module of the encoder whose output is (batch, tokens, "
        "dim), such as its first layer's input LayerNorm"
    )


#: Hugging Face ``model_type`` of text models that transpose their token ids to (tokens, batch)
#: before the word embedding, so that every module inside runs sequence-first
SEQUENCE_FIRST_TEXT = ("xlnet",)


def _refuse_sequence_first(model: nn.Module, word: nn.Module) -> None:
    """Refuse a text model whose embedding path runs sequence-first (:data:`SEQUENCE_FIRST_TEXT`:
    XLNet). Its word embedding puts out (tokens, batch, dim), and so does every module after
    it, so there is no batch-first module for :class:`~senslab.tokens.Embedding` to hook; the
    module the text rules name was refused at every measurement ("not batch-first"). The
    message gives the wrapper that embeds batch-first, and the ``Embedding`` on it."""
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) not in SEQUENCE_FIRST_TEXT:
        return
    name = _name(model, word)
    raise TypeError(
        f"{type(model).__name__} runs sequence-first: it transposes the token ids to (tokens, "
        f"batch) before its word embedding ({name}), so that module and every one after it put "
        "out (tokens, batch, dim), and no module inside the model gives the batch-first "
        "(batch, tokens, dim) vectors that Embedding tokens need. Measure a wrapper that "
        "embeds batch-first and passes the vectors in: an nn.Module holding the model as "
        "self.model, whose forward(input_ids, attention_mask=None) returns "
        "self.model(inputs_embeds=self.model.get_input_embeddings()(input_ids), "
        "attention_mask=attention_mask).logits, with tokens=Embedding("
        f"'model.{name}') (the word vectors are what enters its first layer: its positions "
        "are relative and it has no embedding LayerNorm)" + (
            ". Its classifier reads the last position (config.summary_type='last'), so pad on "
            "the left, as its tokenizer does, and pass trim_padding=False"
            if getattr(config, "summary_type", None) == "last"
            and hasattr(model, "sequence_summary") else "")
    )


def default_tokens(model: nn.Module | Any) -> Tokenization:
    """The tokens a measurement uses when none are given (``tokens=None``).

    ``model.default_tokens()`` if the model declares it (senslab's zoo); else, for a Hugging Face
    ``PreTrainedModel`` or a timm model, :func:`auto_tokens` with its defaults; else, for a
    wrapper holding exactly one such model (a ``LightningModule``'s ``self.model``, say),
    ``auto_tokens`` of that model, an :class:`Embedding` named from the wrapper (e.g.
    ``model.bert.embeddings.LayerNorm``). Any other model is refused with what to pass: a plain
    CNN is not guessed at (``auto_tokens(model)`` gives it ``Patches(16)`` when asked).
    """
    if hasattr(model, "default_tokens"):
        return model.default_tokens()
    if isinstance(model, nn.Module):
        if _pretrained(model):
            return auto_tokens(model)
        inner = _pretrained_children(model)
        if len(inner) == 1:
            name, child = inner[0]
            tokens = auto_tokens(child)
            if isinstance(tokens, Embedding) and isinstance(tokens.module, str):
                return dataclasses.replace(tokens, module=f"{name}.{tokens.module}")
            return tokens
        if len(inner) > 1:
            raise TypeError(
                f"{type(model).__name__} holds several pretrained models "
                f"({', '.join(n for n, _ in inner)}), so which one's tokens to measure is not "
                f"clear; pass tokens= (e.g. auto_tokens(model.{inner[0][0]}) with its module "
                f"name prefixed by '{inner[0][0]}.'), or declare default_tokens()"
            )
    raise TypeError(
        f"{type(model).__name__} declares no default_tokens() and is no Hugging Face or timm "
        "model (nor holds one), so its tokens are not known; pass tokens= — Patches(p) for "
        "(B, C, H, W) images, Embedding('<module name>') for token ids (the LayerNorm after the "
        "token embedding, or the embedding itself), Sequence() for (B, T, D) vectors — or "
        "auto_tokens(model) to let senslab choose (a CNN gets Patches(16))"
    )


def headless_reason(model: Any) -> str | None:
    """Why ``model``'s output is no class score although it looks like one, or None.

    A timm model without a classifier (built with ``num_classes=0``, or after
    ``reset_classifier(0)``: ``num_classes == 0`` or ``get_classifier()`` an ``nn.Identity``)
    returns its pooled features, (batch, features), which ``compare="class"`` would read as
    logits and measure flips of the argmax over feature dimensions. A Hugging Face classifier
    with ``config.num_labels == 0`` is the same (its classifier is an ``nn.Identity``). Only
    the model itself is looked at: a wrapper that puts its own head on such a backbone gives
    class scores. (A Hugging Face base model, ``ViTModel``, returns no ``logits`` and is refused
    where its output is read.)
    """
    if not isinstance(model, nn.Module):
        return None
    name = type(model).__name__
    fix = "; measure a model with a head, or compare='l2' for a distance on the features"
    if isinstance(getattr(model, "pretrained_cfg", None), dict):  # timm
        get = getattr(model, "get_classifier", None)
        try:
            head = get() if callable(get) else None
        except (AttributeError, NotImplementedError, TypeError):
            head = None
        if getattr(model, "num_classes", None) == 0 or isinstance(head, nn.Identity):
            return (f"{name} is a timm model without a classifier (num_classes=0, as built with "
                    "num_classes=0 or after reset_classifier(0)): it returns pooled features, "
                    "not class scores, so compare='class' would count flips of the argmax "
                    "over feature dimensions" + fix)
    if any(c.__name__ == "PreTrainedModel" for c in type(model).__mro__) \
            and name.endswith("Classification") \
            and getattr(getattr(model, "config", None), "num_labels", None) == 0:
        return (f"{name} has no classifier (config.num_labels=0, so its classifier is an "
                "nn.Identity): its logits are pooled features, not class scores, so "
                "compare='class' would count flips of the argmax over feature dimensions" + fix)
    return None


def _pretrained(model: nn.Module) -> bool:
    """A Hugging Face ``PreTrainedModel`` or a timm model (its ``pretrained_cfg``)."""
    if any(c.__name__ == "PreTrainedModel" for c in type(model).__mro__):
        return True
    return isinstance(getattr(model, "pretrained_cfg", None), dict)


def _pretrained_children(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The outermost Hugging Face / timm models inside ``model`` (name, module)."""
    found: list[tuple[str, nn.Module]] = []
    for name, sub in model.named_modules():
        if name and not any(name.startswith(f"{n}.") for n, _ in found) and _pretrained(sub):
            found.append((name, sub))
    return found


def _no_pixel(tokens: Tokenization | None, sigma_space: str, std: Any = None,
              mean: Any = None) -> Tokenization:
    if sigma_space != "input":
        raise ValueError(
            "sigma_space='pixel' converts σ through an image model's normalisation; this model is "
            "measured on token vectors, not images: drop sigma_space"
        )
    if std is not None or mean is not None:
        raise ValueError(
            "std=/mean= convert σ from [0, 1] pixels through an image model's normalisation; "
            "this model is measured on token vectors, not images: drop them"
        )
    return tokens  # type: ignore[return-value]


def _describe(tokens: Tokenization) -> str:
    """A short spelling of ``tokens`` for messages: ``Patches(4)``, ``Embedding('embed_ln')``."""
    if isinstance(tokens, Patches):
        return f"Patches({tokens.size})"
    if isinstance(tokens, Embedding):
        module = (repr(tokens.module) if isinstance(tokens.module, str)
                  else f"<{type(tokens.module).__name__} module>")
        return f"Embedding({module})"
    if isinstance(tokens, Sequence):
        return "Sequence()"
    return repr(tokens)


def _inapplicable(model: Any, option: str, what: str, fix: str) -> str:
    """The refusal of an option that does not apply to ``model``'s tokens: it names the option,
    the model, what the model is measured on, and the fix."""
    return (f"auto_tokens: {option} does not apply to {type(model).__name__}, which is measured "
            f"on {what}: {fix}")


def _refuse_text_options(model: Any, what: str, embedding: str, position: Position) -> None:
    """Refuse ``embedding="word"`` and ``position`` (other than their defaults) for a model
    measured on ``what`` (image patches, input vectors): they name a text model's word
    embedding and the position its per-position output is read at; such a model has neither,
    and the options were dropped without a word."""
    if embedding != "block":
        raise ValueError(_inapplicable(
            model, f"embedding={embedding!r}", what, "it has no word-embedding lookup to put "
            "the noise on; drop embedding, or pass tokens explicitly (Embedding('<module "
            "name>') hooks any module whose output is (batch, tokens, dim))"))
    if position != "last":
        raise ValueError(_inapplicable(
            model, f"position={position!r}", what, "position= reads a text model's per-position "
            "output (a causal language model's logits) at one position; these tokens have no "
            "position to read: drop position"))


def _declared(model: Any, tokens: Tokenization, *, embedding: str, patch_size: int | None,
              position: Position, pixel: dict[str, Any]) -> Tokenization:
    """A model's ``default_tokens()`` (senslab's zoo) with the options passed to
    :func:`auto_tokens` applied where they fit, refused where they do not. With every option at
    its default, ``tokens`` as declared. (Before, every option but ``patch_size`` and the pixel
    options on ``Patches`` was dropped: ``embedding="word"`` on the zoo's RoBERTa measured the
    LayerNorm after the lookup, ``position=0`` read the last token.)

    * ``Patches`` (image models): ``patch_size`` (a size that divides the model's
      ``config.image_size``) and the pixel options; ``embedding="word"`` and ``position``
      refused.
    * ``Embedding`` (text models): ``embedding="word"`` moves the noise to the model's word
      lookup (:func:`_declared_word`); ``position`` is the tokens' ``position``;
      ``patch_size`` and the pixel options refused.
    * ``Sequence`` (models fed vectors) and any other tokens: every option but the defaults
      refused.
    """
    sigma_space, std, mean = pixel["sigma_space"], pixel["std"], pixel["mean"]
    what = f"{_describe(tokens)}, its default_tokens()"
    vectors = "input vectors" if isinstance(tokens, Sequence) else "token vectors"
    if isinstance(tokens, Patches):
        _refuse_text_options(model, f"image patches ({what})", embedding, position)
        if patch_size is not None:
            _check_zoo_patch(model, patch_size)
        if patch_size is not None or sigma_space != "input" or std is not None \
                or mean is not None:
            return dataclasses.replace(
                tokens, size=tokens.size if patch_size is None else patch_size, **pixel)
        return tokens
    if patch_size is not None:
        raise ValueError(_inapplicable(
            model, f"patch_size={patch_size!r}", f"{vectors} ({what}), not images",
            "patch_size cuts images into patches; drop patch_size"))
    _no_pixel(tokens, sigma_space, std, mean)
    if isinstance(tokens, Embedding):
        if embedding == "word":
            tokens = _declared_word(model, tokens)
        if position != "last":
            tokens = dataclasses.replace(tokens, position=position)
        return tokens
    kind = vectors if isinstance(tokens, Sequence) else "tokens of its own"
    _refuse_text_options(model, f"{kind} ({what})", embedding, position)
    return tokens


def _check_zoo_patch(model: Any, size: Any) -> None:
    """Refuse a ``patch_size`` that cannot cut the images of a model built for one image size
    (``config.image_size``, senslab's zoo) into whole patches; it would only be refused at the
    measurement."""
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise ValueError(f"patch_size must be a positive integer, got {size!r}")
    image = getattr(getattr(model, "config", None), "image_size", None)
    if isinstance(image, int) and image % size:
        ok = ", ".join(str(q) for q in range(1, image + 1) if image % q == 0)
        raise ValueError(
            f"auto_tokens: patch_size={size} does not divide the {image}x{image} images "
            f"{type(model).__name__} takes (config.image_size={image}), so no whole patches "
            f"can be cut; pass patch_size= one of {ok}")


def _declared_word(model: Any, tokens: Embedding) -> Embedding:
    """``embedding="word"`` on a model with ``default_tokens()``: the tokens on its word lookup.
    Already there when the declared module is an ``nn.Embedding`` (the zoo's modular-addition,
    parity and Boolean transformers); else the module ``get_input_embeddings()`` returns, else
    the model's one ``nn.Embedding`` that is no position table (the zoo's text models: the
    lookup ``embed`` before the declared ``embed_ln``). Refused where there is no such one."""
    declared = tokens.module
    if isinstance(declared, str):
        try:
            declared = model.get_submodule(declared)
        except AttributeError:
            declared = None
    if isinstance(declared, nn.Embedding):
        return tokens
    word = _input_embeddings(model)
    if word is not None and any(m is word for m in model.modules()):
        return dataclasses.replace(tokens, module=_name(model, word))
    lookups = [n for n, m in model.named_modules() if isinstance(m, nn.Embedding)
               and "pos" not in n.rpartition(".")[2].lower()]
    if len(lookups) == 1:
        return dataclasses.replace(tokens, module=lookups[0])
    found = f" (it has {', '.join(lookups)})" if lookups else ""
    raise ValueError(_inapplicable(
        model, "embedding='word'", f"{_describe(tokens)}, its default_tokens()",
        f"auto_tokens cannot tell which module is its word lookup{found}; pass tokens "
        "explicitly, Embedding('<name of the word-embedding module>')"))


def _processor_norm(processor: Any) -> dict[str, Any] | None:
    """``std``/``mean`` from a Hugging Face image processor (None without one; std 1 where it
    does not normalise): :func:`~senslab.tokens.patches.processor_normalization`."""
    if processor is None:
        return None
    mean, std = processor_normalization(processor)
    return {"std": std, "mean": mean}


def _is_image(model: nn.Module) -> bool:
    if getattr(model, "main_input_name", None) == "pixel_values":
        return True
    if hasattr(model, "patch_embed") or model_normalization(model) is not None:
        return True  # timm
    if getattr(model, "main_input_name", None) == "input_ids":
        return False
    modules = list(model.modules())
    return (any(isinstance(m, nn.Conv2d) for m in modules)
            and not any(isinstance(m, nn.Embedding) for m in modules))


def _square(size: Any, where: str) -> int:
    if isinstance(size, (tuple, list)):
        if len(set(size)) != 1:
            raise ValueError(f"{where} is {tuple(size)}, not square; Patches cut square patches: "
                             "pass patch_size= explicitly")
        size = size[0]
    return int(size)


def _patch_size(model: nn.Module) -> int:
    """The image patch of the model's tokens (module docstring): a timm hybrid's token size in
    pixels (:func:`_hybrid_patch`); else the declared patch size (timm
    ``patch_embed.patch_size``, HF ``config.patch_size``, or that of the patch embedding holding
    the first convolution, :func:`_stage_patch_embed`) where it is an image patch
    (:func:`_declared_patch`) or the cell of a convolutional patch embedding's tokens
    (:func:`_conv_patch_embed`); else the patch of an isotropic patch network
    (:func:`_patch_stem`); else the CNN default."""
    embed = getattr(model, "patch_embed", None)
    if isinstance(getattr(embed, "backbone", None), nn.Module):
        return _hybrid_patch(embed)
    if embed is not None and getattr(embed, "patch_size", None) is not None:
        if _conv_patch_embed(model, embed, _pair(embed.patch_size)):
            return _square(embed.patch_size, "patch_embed.patch_size")
        return _declared_patch(model, embed.patch_size, "patch_embed.patch_size")
    config = getattr(model, "config", None)
    size = getattr(config, "patch_size", None)
    if size is not None:
        return _declared_patch(model, size, "config.patch_size")
    stage = _stage_patch_embed(model)
    if stage is not None:
        name, size = stage
        return _declared_patch(model, size, f"{name}.patch_size")
    return _patch_stem(model) or DEFAULT_CNN_PATCH


def _stage_patch_embed(model: nn.Module) -> tuple[str, Any] | None:
    """(name, declared patch size) of the patch embedding that holds the model's first
    convolution, where that embedding declares a ``patch_size`` but is not the model's
    ``patch_embed``: a pyramid ViT with one patch embedding per stage (timm Twins'
    ``patch_embeds.0``, CoaT's ``patch_embed1``). None without one. Its first stage attends
    over the 4×4 patches that embedding cuts, as Swin's first stage does, so
    :func:`_declared_patch` gives both the same size (before, Twins and CoaT-Lite got the CNN
    default, 16, because their embeddings are named otherwise). A model with several patch
    embeddings on the image itself (timm CrossViT: two branches, 12×12 and 16×16 patches) has
    no one patch size, and keeps the CNN default."""
    convs = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Conv2d)]
    if not convs or "." not in convs[0][0]:
        return None
    name = convs[0][0].rpartition(".")[0]
    size = getattr(model.get_submodule(name), "patch_size", None)
    channels = convs[0][1].in_channels
    on_image = {n.rpartition(".")[0] for n, m in convs if m.in_channels == channels
                and getattr(model.get_submodule(n.rpartition(".")[0]), "patch_size", None)
                is not None}
    return None if size is None or len(on_image) > 1 else (name, size)


def _hybrid_patch(embed: nn.Module) -> int:
    """A timm hybrid ViT (``HybridEmbed``: a CNN backbone before the patch embedding, e.g.
    ``vit_small_r26_s32``): its ``patch_size`` is a patch of the backbone's feature map (1×1
    there), while each token covers ``img_size / grid_size`` pixels (32×32)."""
    img, grid = getattr(embed, "img_size", None), getattr(embed, "grid_size", None)
    if img is None or grid is None:
        return DEFAULT_CNN_PATCH
    return _square(tuple(int(i) // int(g) for i, g in zip(_pair(img), _pair(grid), strict=True)),
                   "the hybrid's token in pixels (patch_embed.img_size // grid_size)")


def _conv_patch_embed(model: nn.Module, embed: nn.Module, size: tuple[int, ...]) -> bool:
    """A convolutional patch embedding (timm XCiT's ``ConvPatchEmbed``: 3×3 stride-2
    convolutions) whose strides together make the declared patch size, in a model that attends
    over its output and never strides after it: each token is a ``size`` cell of the image
    (its receptive field overlapping the next), as a hybrid's token is. Its first convolution
    cuts no patches, so without this rule an XCiT-p8 was measured on 16×16 patches of four
    tokens each."""
    inside = [m for m in embed.modules() if isinstance(m, nn.Conv2d)]
    if not inside or not _attends(model):
        return False
    first = next(m for m in model.modules() if isinstance(m, nn.Conv2d))
    if first is not inside[0]:
        return False  # a convolution before the patch embedding: not the image it embeds
    mine = {id(m) for m in inside}
    if any(tuple(m.stride) != (1, 1) for m in model.modules()
           if isinstance(m, nn.Conv2d) and id(m) not in mine):
        return False  # a pyramid that strides again (PiT): its tokens change size
    total = [1, 1]
    for m in inside:
        total = [t * int(s) for t, s in zip(total, m.stride, strict=True)]
    return tuple(total) == size


def _declared_patch(model: nn.Module, size: Any, where: str) -> int:
    """``size`` where the model's first convolution cuts the image into patches of that size
    (kernel = stride = size, no padding, the image's channels in) and the model keeps them as
    its tokens: it attends over them (ViT, Swin), or no later convolution strides. Else the CNN
    default: a CNN that only convolves and strides again after a patchify stem (HF ConvNeXt,
    FocalNet) is measured as timm's ConvNeXt is, and a ``patch_size`` that is no cut of the
    image at all (HF MobileViT's unfold on downsampled maps) is not read as one. A model
    without a convolution (a linear patch embedding) keeps its declared size."""
    found = _stem(model)
    if found is None:
        return _square(size, where)
    stem, strides = found
    channels = getattr(getattr(model, "config", None), "num_channels", None)
    cuts = _cuts(stem, _pair(size)) and (not isinstance(channels, int)
                                         or stem.in_channels == channels)
    if cuts and (_attends(model) or not strides):
        return _square(size, where)
    return DEFAULT_CNN_PATCH


def _stem(model: nn.Module) -> tuple[nn.Conv2d, bool] | None:
    """The model's first convolution, and whether any later one strides; None without one."""
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    if not convs:
        return None
    return convs[0], any(tuple(m.stride) != (1, 1) for m in convs[1:])


def _cuts(stem: nn.Conv2d, size: tuple[int, ...]) -> bool:
    """The convolution cuts its input into ``size`` patches: kernel = stride = size, no
    padding."""
    return (tuple(stem.kernel_size) == tuple(stem.stride) == size
            and stem.padding in ((0, 0), "valid"))


def _pair(size: Any) -> tuple[int, ...]:
    return tuple(int(s) for s in size) if isinstance(size, (tuple, list)) else (int(size),) * 2


def _attends(model: nn.Module) -> bool:
    """The model has an attention layer (timm ``Attention``/``WindowAttention`` and its
    ``*Attn`` classes: Twins' ``LocallyGroupedAttn``, CoaT's ``FactorAttnConvRelPosEnc``,
    CaiT's ``ClassAttn``; HF ``*SelfAttention``; ``nn.MultiheadAttention``): its patches are
    tokens it attends over."""
    return any(isinstance(m, nn.MultiheadAttention) or "Attention" in type(m).__name__
               or "Attn" in type(m).__name__ for m in model.modules())


def _patch_stem(model: nn.Module) -> int | None:
    """p where the model's first convolution cuts the image into p×p patches (square kernel =
    stride = p > 1, no padding) and no later convolution strides: an isotropic patch network
    such as ConvMixer, whose tokens are those patches. None for a CNN that downsamples in
    stages (ResNet, ConvNeXt: their stem is no token grid)."""
    found = _stem(model)
    if found is None:
        return None
    stem, strides = found
    k = tuple(stem.kernel_size)
    if strides or not (k[0] == k[1] > 1 and _cuts(stem, k)):
        return None
    return int(k[0])


def _input_embeddings(model: nn.Module) -> nn.Module | None:
    """The word embedding the forward calls: ``get_input_embeddings()``, except in a model with
    an encoder (T5, BART) whose input embedding is a tied copy of it (``shared``, which the
    forward never calls): the encoder's own. For an encoder–decoder model the tokens are then
    the encoder's inputs; the decoder's copy of them is not perturbed. (A model without
    ``get_encoder``, T5's classifier on transformers 4.x: its ``base_model``'s.)"""
    word = _called_or_none(model, "get_input_embeddings")
    get_encoder = getattr(model, "get_encoder", None)
    if word is not None and (callable(get_encoder) or _stack(model, "encoder") is not None):
        try:
            encoder = get_encoder() if callable(get_encoder) else _stack(model, "encoder")
        except (NotImplementedError, AttributeError, TypeError):
            encoder = None
        own = _called_or_none(encoder, "get_input_embeddings") if encoder is not model else None
        if own is None and isinstance(encoder, nn.Module):
            own = getattr(encoder, "embed_tokens", None)
        if isinstance(own, nn.Module) and own is not word \
                and any(m is own for m in model.modules()):
            return own
    return word


def _stack(model: nn.Module, which: str) -> nn.Module | None:
    """The encoder or decoder (``which``) of a Hugging Face encoder–decoder model
    (``config.is_encoder_decoder``): ``get_encoder()``/``get_decoder()`` of the model or of its
    ``base_model`` (a T5 classifier's ``transformer``); None for any other model (a decoder-only
    model's ``get_decoder()`` is the whole stack its tokens enter)."""
    if getattr(getattr(model, "config", None), "is_encoder_decoder", False) is not True:
        return None
    for owner in (model, getattr(model, "base_model", None)):
        found = _called_or_none(owner, f"get_{which}")
        if found is not None and found is not model and any(m is found for m in model.modules()):
            return found
    return None


def _word_name(model: nn.Module, word: nn.Module) -> str:
    """The dotted name of the word embedding ``word``: in an encoder–decoder model whose encoder
    holds the very module ``get_input_embeddings()`` returns (T5 on transformers 4.x; T5 and BART
    after ``resize_token_embeddings``, which gives encoder, decoder and ``shared`` one module),
    its name inside the encoder. ``named_modules`` names it once, by its first path
    (``model.shared``, whose parent is the whole model), and the rules then missed the
    encoder's own block: BART's ``layernorm_embedding``."""
    encoder = _stack(model, "encoder")
    if encoder is not None:
        prefix = f"{_name(model, encoder)}."
        for name, m in model.named_modules(remove_duplicate=False):
            if m is word and name.startswith(prefix):
                return name
    return _name(model, word)


def _refuse_shared_with_decoder(model: nn.Module, name: str) -> None:
    """Refuse tokens on a module that the decoder of an encoder–decoder model calls too: the
    word embedding that encoder and decoder share (T5 on transformers 4.x, where T5 picked
    ``shared``; T5 and BART after ``resize_token_embeddings``). It runs twice per forward, on
    the inputs and on the decoder's inputs, so the measurement refused it, advising the token
    embedding, which it is, and no module's output is the encoder's tokens alone. The
    message gives the fix: an embedding of the encoder's own, holding the same weights (as
    transformers 5 builds T5)."""
    decoder = _stack(model, "decoder")
    if decoder is None:
        return
    module = model.get_submodule(name)
    if not any(m is module for m in decoder.modules()):
        return
    paths = [n for n, m in model.named_modules(remove_duplicate=False) if m is module]
    parent, _, attr = name.rpartition(".")
    owner = f"model.get_submodule({parent!r})" if parent else "model"
    raise TypeError(
        f"{type(model).__name__}'s encoder and decoder share one word-embedding module "
        f"({', '.join(paths)}), as transformers 4.x builds T5 and resize_token_embeddings or "
        "set_input_embeddings leave T5 and BART: the decoder calls it on its own inputs too, "
        "so noise on it would be added to both (a module run twice per forward is refused), "
        "and no other module puts out the encoder's token vectors alone. Give the encoder its "
        "own embedding module holding the same weights, then call auto_tokens(model) again: "
        f"import copy; shared = model.get_submodule({name!r}); embed = copy.deepcopy(shared); "
        f"embed.weight = shared.weight; {owner}.{attr} = embed"
    )


def _called_or_none(owner: Any, method: str) -> nn.Module | None:
    get = getattr(owner, method, None)
    if get is None:
        return None
    try:
        word = get()
    except (NotImplementedError, AttributeError):
        return None
    return word if isinstance(word, nn.Module) else None


def _name(model: nn.Module, module: nn.Module) -> str:
    return next(n for n, m in model.named_modules() if m is module)


#: the linear maps from the embedding size to the hidden size that some BERT-style models apply
#: to the embeddings block's output before their first block (ALBERT:
#: ``encoder.embedding_hidden_mapping_in``; ELECTRA and ConvBERT with ``embedding_size`` ≠
#: ``hidden_size``: ``embeddings_project``)
EMBEDDING_PROJECTIONS = ("embedding_hidden_mapping_in", "embeddings_project")


def _embedding_projection(model: nn.Module) -> str | None:
    """The dotted name of the model's one projection from its embeddings block into its first
    block (:data:`EMBEDDING_PROJECTIONS`), None when it has none."""
    found = [n for n, m in model.named_modules()
             if isinstance(m, nn.Linear) and n.rpartition(".")[2] in EMBEDDING_PROJECTIONS]
    return found[0] if len(found) == 1 else None


def _text_module(model: nn.Module, word: nn.Module, embedding: str) -> str:
    """The dotted name of the module whose output the text tokens are (module docstring)."""
    name = _word_name(model, word)
    if embedding == "word":
        return name
    parent_name = name.rpartition(".")[0]
    parent = model.get_submodule(parent_name) if parent_name else model
    if type(parent).__name__.endswith("Embeddings"):  # BERT-style embeddings block
        projection = _embedding_projection(model)
        if projection is not None:  # ALBERT, ELECTRA-small: the LayerNorm's output is mapped
            return projection
        norms = [n for n, m in parent.named_children()
                 if isinstance(m, nn.LayerNorm) or "norm" in type(m).__name__.lower()]
        if len(norms) == 1 and not _maps_after_norm(parent, parent.get_submodule(norms[0])):
            return f"{parent_name}.{norms[0]}"
        # no (or no single) LayerNorm, or a linear map inside the block after it (FNet's
        # projection): the block's own output, which is what enters the first block
        return parent_name
    prefix = f"{parent_name}." if parent_name else ""
    drop = next((n for n in ("drop", "dropout") if isinstance(getattr(parent, n, None),
                                                               nn.Dropout)), None)
    # GPT-2 style: learned positions wpe, or CTRL's sinusoidal pos_encoding added (after its
    # word vectors are scaled by sqrt(d_model)) inside the forward; the dropout after the sum
    # is the one module whose output is what enters the first block
    if drop is not None and (hasattr(parent, "wpe") or hasattr(parent, "pos_encoding")):
        return f"{prefix}{drop}"
    # an embedding LayerNorm beside the word embedding (BART's layernorm_embedding, after the
    # positions are added; BLOOM's word_embeddings_layernorm): its output enters the block.
    # Not one the forward calls after its layers, whatever its name: LFM2's embedding_norm and
    # BigBird-Pegasus' layernorm_embedding are their final norms (picked, the noise went on
    # the last hidden states, none of it reaching the first block)
    norms = [n for n, m in parent.named_children() if m is not word and "emb" in n.lower()
             and ("norm" in n.lower() or isinstance(m, nn.LayerNorm))
             and _around_layers(parent, n) != (False, True)]
    if len(norms) == 1:
        return f"{prefix}{norms[0]}"
    _refuse_norm_run_twice(model, parent, word, prefix, name)
    scale = _inline_scale(parent, word, getattr(model, "config", None))
    if hasattr(parent, "embed_positions"):
        # positions added inline after the word embedding (OPT, Marian, Pegasus): no module's
        # output is what enters the first block. The noise reaches it as it is where only the
        # positions are added; the fix named says where more happens in between: OPT-350m maps
        # the word vectors into the hidden size (project_in), Marian and Pegasus multiply them
        # by embed_scale (√d_model)
        project = getattr(parent, "project_in", None)
        if isinstance(project, nn.Linear):
            fix = (f"Embedding('{prefix}project_in'), its map of the word vectors into the "
                   "hidden size, to which the positions are added (noise on the word embedding "
                   f"itself, embedding='word', reaches that block through {prefix}project_in, "
                   "in other units than σ)")
        elif scale is not None:
            attr, value = scale
            fix = (f"auto_tokens(model, embedding='word') with σ divided by {value:g}: the "
                   f"forward multiplies the word embedding's output by {attr}={value:g} before "
                   f"adding the positions, so noise on it reaches that block multiplied by "
                   f"{value:g}")
        else:
            fix = "auto_tokens(model, embedding='word')"
        raise TypeError(
            f"{type(model).__name__} adds its positions ({prefix}embed_positions) to the word "
            f"embedding inside {type(parent).__name__}.forward, so no module's output is the "
            "vector that enters its first block; noise on the word embedding "
            f"({name}) comes before the positions. Pass that explicitly: {fix}"
        )
    if scale is not None:
        attr, value = scale
        raise TypeError(
            f"{type(model).__name__} multiplies its word embedding's output ({name}) by "
            f"{attr}={value:g} inside {type(parent).__name__}.forward, so no module's output is "
            "the vector that enters its first block, and noise on the word embedding reaches "
            f"that block multiplied by {value:g} (σ there is {value:g}·σ). Pass "
            f"auto_tokens(model, embedding='word') with σ divided by {value:g} to put σ on the "
            "vectors entering the first block"
        )
    return name


def _around_layers(parent: nn.Module, child: str) -> tuple[bool, bool] | None:
    """Where ``type(parent).forward`` calls ``self.<child>(``: (before its loop over its layers,
    after it), the layers being a ``ModuleList`` child of ``parent`` that a ``for`` runs over;
    None where the source cannot be read or shows no such loop (the rules then go by names
    alone)."""
    lists = [n for n, m in parent.named_children() if isinstance(m, nn.ModuleList)]
    if not lists:
        return None
    try:
        source = inspect.getsource(type(parent).forward)
    except (OSError, TypeError):
        return None
    loop = re.search(r"\n[ \t]*for\b[^\n]*\bself\.(" + "|".join(map(re.escape, lists))
                     + r")\b", source)
    if loop is None:
        return None
    calls = [c.start() for c in re.finditer(rf"\bself\.{re.escape(child)}\(", source)]
    return (any(c < loop.start() for c in calls), any(c > loop.start() for c in calls))


def _refuse_norm_run_twice(model: nn.Module, parent: nn.Module, word: nn.Module, prefix: str,
                           name: str) -> None:
    """Refuse the block tokens of a model whose forward runs a norm on the word vectors before
    its first block and runs the same module again after its last layer (NanoChat's ``norm``):
    the first block's input is that norm's output, but noise on it would be added at both calls
    (a module run twice per forward is refused), and noise on the word embedding reaches the
    block rescaled by the norm (3.1 times its size on a small NanoChat), in other units than
    σ."""
    for n, m in parent.named_children():
        if m is word or not (isinstance(m, nn.LayerNorm) or "norm" in type(m).__name__.lower()):
            continue
        if _around_layers(parent, n) == (True, True):
            raise TypeError(
                f"{type(model).__name__} normalizes its word vectors with {prefix}{n} before its "
                f"first block, inside {type(parent).__name__}.forward, and runs that module "
                "again after its last layer, so no module's output is the vector that enters "
                "its first block alone (noise on it would be added at both calls), and noise on "
                f"the word embedding ({name}) reaches that block rescaled by the norm. Pass "
                "auto_tokens(model, embedding='word') to put σ on the word vectors before that "
                "norm, in their units"
            )


#: attributes holding a factor by which a model multiplies its word embedding's output inside its
#: own forward, after the embedding module (Granite, Falcon-H1, HyperCLOVA X:
#: ``embedding_multiplier``; HRM: ``embedding_scale``; RecurrentGemma: ``normalizer``,
#: √hidden_size)
INLINE_EMBEDDING_SCALES = ("embedding_multiplier", "embedding_scale", "embed_scale",
                           "normalizer")

#: Hugging Face ``model_type``s whose forward multiplies the word embedding's output by
#: √``config.hidden_size`` where the embedding does not (transformers 4.x: Gemma's and Gemma 2's
#: ``hidden_states * normalizer``, a local variable; transformers 5 moved the factor into the
#: embedding, whose ``embed_scale`` holds it; T5Gemma's encoder, whose config is a
#: ``t5_gemma_module``, still has it on transformers 5)
SQRT_HIDDEN_SCALED = ("gemma", "gemma2", "t5_gemma_module")


def _inline_scale(parent: nn.Module, word: nn.Module,
                  config: Any = None) -> tuple[str, float] | None:
    """(attribute, factor) where the module holding the word embedding scales its output in its
    forward by a factor other than 1 (:data:`INLINE_EMBEDDING_SCALES`, or √hidden_size for
    :data:`SQRT_HIDDEN_SCALED` whose embedding has no ``embed_scale``); None otherwise. Noise on
    the word embedding's output is then scaled too: Granite's ``embedding_multiplier=12`` made
    σ on ``embed_tokens`` a noise of 12σ on the vectors entering the first block, reported as
    σ; RecurrentGemma's ``normalizer`` (and Gemma's on transformers 4.x) √hidden_size·σ, 45σ
    at a width of 2048."""
    for attr in INLINE_EMBEDDING_SCALES:
        value = getattr(parent, attr, None)
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = float(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value != 1:
            return attr, float(value)
    # the config of the module that scales (T5Gemma's encoder has its own: the model's has no
    # hidden_size), else the model's
    for owner in (getattr(parent, "config", None), config):
        hidden = getattr(owner, "hidden_size", None)
        if getattr(owner, "model_type", None) in SQRT_HIDDEN_SCALED \
                and isinstance(hidden, int) and not isinstance(hidden, bool) \
                and getattr(word, "embed_scale", None) is None and hidden != 1:
            return "sqrt(config.hidden_size)", float(hidden) ** 0.5
    return None


def _maps_after_norm(block: nn.Module, norm: nn.Module) -> bool:
    """The embeddings block has a linear map that takes its LayerNorm's output (an
    ``nn.Linear`` child whose input width is the LayerNorm's: FNet's ``projection``), so the
    LayerNorm's output is not what the block puts out. (MobileBERT's ``embedding_transformation``
    maps the concatenated trigram embeddings before the LayerNorm: another input width.)"""
    shape = getattr(norm, "normalized_shape", None)
    width = shape[-1] if isinstance(shape, (tuple, list)) and shape else None
    if width is None:
        weight = getattr(norm, "weight", None)
        width = weight.shape[-1] if isinstance(weight, torch.Tensor) and weight.dim() else None
    return width is not None and any(isinstance(m, nn.Linear) and m.in_features == width
                                     for m in block.children())
