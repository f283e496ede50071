"""A checkpoint as a newer senslab writes one, for the tests that a run holding it is refused
(never skipped for an earlier checkpoint, set aside, or overwritten)."""

from __future__ import annotations

import json
from pathlib import Path


def rewrite_as_newer(path: Path) -> None:
    """Rewrite the checkpoint ``path`` as a newer senslab writes one: the same tensors and
    checksum, its metadata's format version above this senslab's."""
    from safetensors.torch import load, save

    data = path.read_bytes()
    meta = json.loads(data[8:8 + int.from_bytes(data[:8], "little")])["__metadata__"]
    path.write_bytes(save(load(data), metadata={**meta, "version": "2"}))
