"""The checkpoint file: one safetensors file, verified when loaded, never unpickled.

A training state is a tree of dicts, lists and tuples whose leaves are tensors and plain values
(model and optimizer state dicts, RNG states, the position in the data, the elapsed time).
:func:`encode` stores every tensor of the tree under a unique name (its path in the tree,
``model/fc.weight``, ``optimizer/state/0/momentum_buffer``) and everything else — the layout of
the tree and every non-tensor value — as JSON in the file's ``__metadata__``, next to a SHA-256
over both:

    sha256 = H(len(S) ‖ S ‖ for each tensor name n in sorted order: len(h_n) ‖ h_n ‖ bytes_n)

with S the structure JSON, h_n = ``[name, dtype, shape]`` as JSON and bytes_n the tensor's raw
little-endian bytes (lengths as 8-byte integers, so no two trees hash the same bytes).
:func:`decode` rebuilds the tree exactly: int dict keys stay ints, tuples stay tuples, ``None``
and bools stay themselves, floats keep their value bit for bit (``inf`` and ``nan`` included),
which is what a bit-identical resume needs. A file whose digest does not match is an error; so
is one that carries none, unless the caller says it trusts the file.

Legacy checkpoints (``step-N.pt`` with a ``step-N.sha256`` sidecar, written by senslab before
run-directory schema 2) are read by :func:`load_legacy`: with ``torch.load(weights_only=True)``
(tensors and plain containers only: a pickle that would run code is refused), and only after
the sidecar verifies.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import math
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

FORMAT = "senslab-checkpoint"
VERSION = 1
#: the largest header :func:`newer_format` reads (safetensors' own limit is 100 MB)
MAX_HEADER = 100_000_000
SUFFIX = ".safetensors"
LEGACY_SUFFIX = ".pt"


class CheckpointError(ValueError, RuntimeError):
    """A checkpoint that cannot be used: damaged, unverifiable, or not a senslab checkpoint."""


class NewerCheckpointError(CheckpointError):
    """A checkpoint in a format newer than this senslab reads (:data:`VERSION`). It is not
    damaged: the run went on under a newer senslab, so a resume never falls back past it to an
    earlier checkpoint, nor sets it aside and starts over (:meth:`senslab.train.rundir.RunDir.
    load_latest` refuses the run instead)."""


def damaged(where: str | Path, detail: str = "") -> CheckpointError:
    extra = f"; {detail}" if detail else ""
    return CheckpointError(f"{where} does not match its checksum (truncated or corrupted{extra})")


# -- the tree ----------------------------------------------------------------------------------


def _encode(obj: Any, path: str, tensors: dict[str, Tensor]) -> Any:
    if isinstance(obj, Tensor):
        if obj.layout != torch.strided or obj.is_quantized:
            raise TypeError(f"cannot store the {obj.layout} tensor at {path or '/'} in a "
                            "checkpoint")
        if not _storable(obj.dtype):
            # safetensors' own refusal was a bare ``KeyError: torch.complex128`` from its
            # insides, at the first checkpoint of a run, naming neither the tensor nor a fix
            raise TypeError(
                f"cannot store the {obj.dtype} tensor at {path or '/'} in a checkpoint: "
                f"safetensors has no {str(obj.dtype).removeprefix('torch.')} type. Keep it in "
                "the state as a dtype safetensors stores (a complex128 one as "
                "torch.view_as_real(t), float64; a complex32 one as complex64)")
        name = path or "tensor"
        k = 1
        while name in tensors:  # path components may themselves contain "/"
            name, k = f"{path}#{k}", k + 1
        # a private contiguous copy: tied weights would otherwise share storage, which
        # safetensors refuses, and a later in-place update must not change what is written
        tensors[name] = obj.detach().to("cpu", copy=True).contiguous()
        return {"tensor": name}
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        return float(obj) if math.isfinite(obj) else {"float": repr(float(obj))}
    if isinstance(obj, dict):
        items = [[_encode(k, f"{path}/<key>", tensors), _encode(v, f"{path}/{k}", tensors)]
                 for k, v in obj.items()]
        if not isinstance(obj, OrderedDict):
            return {"dict": items}
        # a module's state_dict: an OrderedDict whose _metadata holds the modules' versions
        meta = getattr(obj, "_metadata", None)
        return {"odict": [items, None if meta is None else _encode(meta, path, tensors)]}
    if isinstance(obj, (list, tuple)):
        items = [_encode(v, f"{path}/{i}", tensors) for i, v in enumerate(obj)]
        return items if isinstance(obj, list) else {"tuple": items}
    raise TypeError(
        f"cannot store a {type(obj).__name__} at {path or '/'} in a checkpoint: only tensors, "
        "dicts, lists, tuples, str, int, float, bool and None"
    )


@functools.cache
def _storable(dtype: torch.dtype) -> bool:
    """Whether the installed safetensors stores and reads back tensors of ``dtype`` (its set
    grows with its versions: asked of it, on an empty tensor, once per dtype)."""
    from safetensors.torch import load, save

    try:
        return load(save({"t": torch.empty(0, dtype=dtype)}))["t"].dtype == dtype
    except Exception:  # safetensors refuses an unknown dtype with a KeyError of its insides
        return False


def _decode(node: Any, tensors: dict[str, Tensor]) -> Any:
    if isinstance(node, list):
        return [_decode(v, tensors) for v in node]
    if not isinstance(node, dict):
        return node
    (tag, value), = node.items()
    if tag == "tensor":
        return tensors[value]
    if tag == "float":
        return float(value)
    if tag == "tuple":
        return tuple(_decode(v, tensors) for v in value)
    if tag == "dict":
        return {_decode(k, tensors): _decode(v, tensors) for k, v in value}
    if tag == "odict":
        items, meta = value
        out: OrderedDict[Any, Any] = OrderedDict(
            (_decode(k, tensors), _decode(v, tensors)) for k, v in items)
        if meta is not None:
            out._metadata = _decode(meta, tensors)  # type: ignore[attr-defined]
        return out
    raise ValueError(f"unknown node {tag!r}")


def digest(structure: str, tensors: dict[str, Tensor]) -> str:
    """SHA-256 over the structure JSON and every tensor's name, dtype, shape and raw bytes."""
    h = hashlib.sha256()

    def part(data: bytes | memoryview) -> None:
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)

    part(structure.encode())
    for name in sorted(tensors):
        t = tensors[name]
        part(json.dumps([name, str(t.dtype), list(t.shape)]).encode())
        part(memoryview(t.contiguous().reshape(-1).view(torch.uint8).numpy()))
    return h.hexdigest()


# -- files -------------------------------------------------------------------------------------


def encode(state: dict[str, Any]) -> bytes:
    """The bytes of a checkpoint file holding ``state`` (see the module docstring)."""
    from safetensors.torch import save

    tensors: dict[str, Tensor] = {}
    structure = json.dumps(_encode(state, "", tensors), separators=(",", ":"), allow_nan=False)
    metadata = {"format": FORMAT, "version": str(VERSION), "structure": structure,
                "sha256": digest(structure, tensors)}
    return save(tensors, metadata=metadata)


def _header(data: bytes) -> dict[str, Any]:
    size = int.from_bytes(data[:8], "little")
    if len(data) < 8 or size > len(data) - 8:
        raise ValueError("the header is cut short")
    header = json.loads(data[8 : 8 + size])
    if not isinstance(header, dict):
        raise ValueError("the header is not a JSON object")
    return header


def _newer(meta: dict[str, Any]) -> bool:
    """Whether a checkpoint's metadata says it is in a format newer than :data:`VERSION`."""
    version = str(meta.get("version", "0"))
    return version.isdigit() and int(version) > VERSION


def newer_format(path: Path) -> str | None:
    """The format version of the checkpoint file ``path`` when it is newer than this senslab
    reads, from its header alone (the tensors are not read); None otherwise — also for a file
    whose header cannot be read, which :func:`decode` reports as damaged."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            size = int.from_bytes(head, "little")
            if size > MAX_HEADER:
                return None
            meta = _header(head + f.read(size)).get("__metadata__")
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or not _newer(meta):
        return None
    return str(meta.get("version"))


def decode(data: bytes, where: str | Path, allow_unverified: bool = False) -> dict[str, Any]:
    """The state stored in checkpoint bytes ``data`` (read from ``where``), after checking its
    digest; :class:`CheckpointError` if it does not match or (unless ``allow_unverified``) if
    the file carries none."""
    from safetensors.torch import load

    try:
        meta = _header(data).get("__metadata__") or {}
    except (ValueError, UnicodeDecodeError) as err:
        raise damaged(where, f"unreadable header: {err}") from None
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{where} is not a senslab checkpoint (no {FORMAT!r} metadata)")
    if not str(meta.get("version", "0")).isdigit():
        raise damaged(where, f"unknown checkpoint format {meta['version']!r}")
    if _newer(meta):
        raise NewerCheckpointError(f"{where} was written by a newer senslab (checkpoint format "
                                   f"{meta['version']}; this one reads up to {VERSION}); "
                                   "upgrade senslab to read it")
    if "sha256" not in meta and not allow_unverified:
        raise CheckpointError(f"{where} carries no checksum, so it cannot be verified; load it "
                              "with allow_unverified=True only if you trust the file")
    try:
        tensors = load(data)
    except Exception as err:  # safetensors reports a damaged body with its own error type
        raise damaged(where, str(err).splitlines()[0] if str(err) else "") from None
    structure = meta.get("structure", "")
    if "sha256" in meta and digest(structure, tensors) != meta["sha256"]:
        raise damaged(where)
    try:
        state = _decode(json.loads(structure), tensors)
    except (ValueError, KeyError, TypeError) as err:
        raise damaged(where, f"unreadable structure: {err}") from None
    if not isinstance(state, dict):
        raise damaged(where, "the stored state is not a dict")
    return state


def load_legacy(path: Path, allow_unverified: bool = False) -> dict[str, Any]:
    """A ``step-N.pt`` checkpoint of schema 1, verified against its ``.sha256`` sidecar and read
    with ``torch.load(weights_only=True)``: nothing in the file is executed."""
    data = path.read_bytes()
    sidecar = path.with_suffix(".sha256")
    if sidecar.exists():
        if sidecar.read_text().strip() != hashlib.sha256(data).hexdigest():
            raise damaged(path)
    elif not allow_unverified:
        raise CheckpointError(f"{path} has no {sidecar.name} checksum beside it, so it cannot be "
                              "verified; load it with allow_unverified=True only if you trust "
                              "the file")
    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as err:
        text = str(err)
        reason = next((line.strip() for line in text.splitlines() if "Unsupported" in line),
                      text.splitlines()[0] if text else type(err).__name__)
        raise CheckpointError(f"{path} cannot be read safely ({reason}); it holds more than "
                              "tensors and plain values, and is not loaded") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} does not hold a training state (found "
                              f"{type(state).__name__})")
    return state
