"""A small progress bar for long work: redraws one line on a TTY, silent otherwise."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

_SHOWN = ("train/acc", "test/acc", "sens/train")


class Progress:
    def __init__(self, total: int, enabled: bool | None = None, desc: str = "",
                 stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.total, self.desc, self.n = max(total, 1), desc, 0
        self.start = time.perf_counter()
        self.loss: float | None = None
        self.post: dict[str, Any] = {}

    def update(self, k: int = 1, loss: float | None = None) -> None:
        self.n += k
        if loss is not None:
            self.loss = loss
        self._draw()

    def set_postfix(self, record: dict[str, Any]) -> None:
        self.post = {k: record[k] for k in _SHOWN if k in record}
        self._draw()

    def _draw(self) -> None:
        if not self.enabled:
            return
        frac = min(self.n / self.total, 1.0)
        bar = "█" * int(frac * 20) + "·" * (20 - int(frac * 20))
        elapsed = time.perf_counter() - self.start
        parts = [f"{self.desc} {bar} {self.n}/{self.total} steps {elapsed:5.0f}s"]
        if self.loss is not None:
            parts.append(f"loss {self.loss:.3f}")
        parts += [f"{k.replace('/', ' ')} {v:.3f}" for k, v in self.post.items()]
        self.stream.write("\r" + " | ".join(parts)[:150].ljust(150))
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()
