"""The training progress bar: a tqdm bar of optimizer steps on a TTY, silent otherwise, showing
the last loss and the accuracies and sensitivity of the last evaluation."""

from __future__ import annotations

import sys
from typing import Any, TextIO

from tqdm import tqdm

#: the keys of an evaluation record that the bar shows (besides the last training loss)
_SHOWN = ("train/acc", "test/acc", "sens/train")


class Progress:
    """``enabled`` None: on when ``stream`` (default stderr) is a terminal, so logs and CI
    output stay free of redraws. ``initial``: the steps done before (a resumed run), left out of
    the rate."""

    def __init__(self, total: int, enabled: bool | None = None, desc: str = "",
                 stream: TextIO | None = None, initial: int = 0) -> None:
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.loss: float | None = None
        self.post: dict[str, Any] = {}
        self.bar = tqdm(total=max(total, 1), initial=initial, desc=desc, unit="step",
                        file=self.stream, disable=not self.enabled, dynamic_ncols=True)

    def update(self, k: int = 1, loss: float | None = None) -> None:
        if loss is not None:
            self.loss = loss
            self._postfix(refresh=False)  # drawn by the update below, at tqdm's own pace
        self.bar.update(k)

    def set_postfix(self, record: dict[str, Any]) -> None:
        self.post = {k: record[k] for k in _SHOWN if record.get(k) is not None}
        self._postfix(refresh=True)

    def _postfix(self, refresh: bool) -> None:
        if not self.enabled:
            return
        shown = {} if self.loss is None else {"loss": _short(self.loss)}
        shown |= {k.replace("/", " "): _short(v) for k, v in self.post.items()}
        self.bar.set_postfix(shown, refresh=refresh)

    def close(self) -> None:
        self.bar.close()


def _short(value: Any) -> str:
    """Three decimals, but never a claim the value does not make: a small sensitivity (0.0004)
    keeps two significant digits instead of reading ``0.000`` (no flips), and a value just
    under 1 (an accuracy of 0.9996) keeps the digits that show it is not ``1.000``."""
    if not isinstance(value, int | float):
        return str(value)
    text = f"{value:.3f}"
    if value != 0 and float(text) == 0:
        return f"{value:.2g}"
    digits = 3
    while abs(float(text)) == 1 and abs(value) != 1 and digits < 17:
        digits += 1
        text = f"{value:.{digits}f}".rstrip("0")
    return text
