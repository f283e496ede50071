"""A run directory (format: docs/run-directory.md): config, environment, metric log, checkpoints.

Checkpoints are written atomically (temporary file, fsync, rename) with a SHA-256 sidecar, so a
run killed at any instant leaves either the previous or the new checkpoint intact; a corrupted
or truncated one is detected and the previous good one is used.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch


def atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def git_commit() -> str | None:
    """The commit of the senslab checkout in use (None outside a git checkout)."""
    try:
        root = Path(__file__).resolve().parents[3]
        return subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
            timeout=5,
        ).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def environment(device: torch.device | str) -> dict[str, Any]:
    """Versions, git commit, device and command line, for env.json."""
    commit = git_commit()
    import numpy

    import senslab

    return {
        "senslab": senslab.__version__,
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "git_commit": commit,
        "device": str(device),
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "threads": torch.get_num_threads(),
        "command": sys.argv,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


class CheckpointError(RuntimeError):
    pass


class RunDir:
    """Paths and I/O of one run directory."""

    def __init__(self, path: str | os.PathLike[str], readonly: bool = False) -> None:
        #: a read-only RunDir (ranks > 0 of a distributed run) silently skips every write
        self.readonly = readonly
        self.path = Path(path)
        self.ckpt_dir = self.path / "checkpoints"
        self.metrics_path = self.path / "metrics.jsonl"

    # -- config / env / summary ----------------------------------------------------------------
    def write_json(self, name: str, obj: Any) -> None:
        if self.readonly:
            return
        self.path.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.path / name, json.dumps(obj, indent=2, sort_keys=True, default=str))

    def read_json(self, name: str) -> Any:
        return json.loads((self.path / name).read_text())

    def exists(self) -> bool:
        return (self.path / "config.json").exists()

    # -- metrics -------------------------------------------------------------------------------
    def log(self, record: dict[str, Any]) -> None:
        if self.readonly:
            return
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps(record, default=float) + "\n")
            f.flush()

    def metrics(self) -> list[dict[str, Any]]:
        if not self.metrics_path.exists():
            return []
        out = []
        lines = self.metrics_path.read_text().splitlines()
        for i, line in enumerate(lines):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                if i == len(lines) - 1:  # a run killed mid-write leaves a partial last line
                    break
                raise ValueError(f"{self.metrics_path}:{i + 1} is not valid JSON") from None
        return out

    def truncate_metrics(self, step: int) -> None:
        """Keep only records logged at or before ``step`` (drop what a resume will redo)."""
        if self.readonly:
            return
        kept = [r for r in self.metrics() if r.get("step", 0) <= step]
        atomic_write_text(self.metrics_path, "".join(json.dumps(r) + "\n" for r in kept))

    # -- checkpoints ---------------------------------------------------------------------------
    def save_checkpoint(self, state: dict[str, Any], step: int, keep: int = 2) -> Path | None:
        if self.readonly:
            return None
        self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        torch.save(state, buf)
        data = buf.getvalue()
        path = self.ckpt_dir / f"step-{step:08d}.pt"
        atomic_write_bytes(path, data)
        atomic_write_text(path.with_suffix(".sha256"), hashlib.sha256(data).hexdigest())
        for old in self.checkpoints()[:-keep] if keep > 0 else []:
            old.unlink(missing_ok=True)
            old.with_suffix(".sha256").unlink(missing_ok=True)
        return path

    def checkpoints(self) -> list[Path]:
        return sorted(self.ckpt_dir.glob("step-*.pt")) if self.ckpt_dir.exists() else []

    @staticmethod
    def load_checkpoint(path: Path) -> dict[str, Any]:
        """Load one checkpoint, verifying its checksum; :class:`CheckpointError` if damaged."""
        data = path.read_bytes()
        digest = path.with_suffix(".sha256")
        if digest.exists() and digest.read_text().strip() != hashlib.sha256(data).hexdigest():
            raise CheckpointError(f"{path} does not match its checksum (truncated or corrupted)")
        try:
            return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)
        except Exception as err:  # torch raises several types for damaged zip archives
            raise CheckpointError(f"{path} cannot be read ({err})") from err

    def latest_checkpoint(self) -> dict[str, Any] | None:
        """The newest checkpoint that loads; damaged ones are reported and skipped."""
        for path in reversed(self.checkpoints()):
            try:
                return self.load_checkpoint(path)
            except CheckpointError as err:
                warnings.warn(f"{err}; falling back to the previous checkpoint", stacklevel=2)
        return None
