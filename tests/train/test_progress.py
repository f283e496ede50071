"""The training progress bar (tqdm): silent off a terminal, the loss and the last evaluation's
accuracies and sensitivity on one."""

from __future__ import annotations

import io

from senslab.train.progress import Progress


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _run(stream: io.StringIO, enabled: bool | None = None) -> str:
    bar = Progress(10, enabled=enabled, desc="tiny", stream=stream)
    bar.update(4, loss=0.5)
    bar.set_postfix({"step": 4, "train/acc": 0.75, "test/acc": 0.5, "sens/train": 0.125,
                     "weight_norm": 3.0})
    bar.update(6, loss=0.25)
    bar.close()
    return stream.getvalue()


def test_silent_when_not_a_terminal_or_disabled():
    assert _run(io.StringIO()) == ""
    assert _run(_Terminal(), enabled=False) == ""


def test_shows_steps_loss_and_the_last_evaluation_on_a_terminal():
    out = _run(_Terminal())
    last = out.rstrip("\n").split("\r")[-1]
    assert last.startswith("tiny") and "10/10" in last
    for shown in ("loss=0.250", "train acc=0.750", "test acc=0.500", "sens train=0.125"):
        assert shown in last, (shown, last)
    assert "weight" not in last and out.endswith("\n")
    # forced on into a pipe (fit(progress=True) in a notebook or a log)
    assert "10/10" in _run(io.StringIO(), enabled=True)


def test_a_resumed_run_starts_at_its_step():
    stream = _Terminal()
    bar = Progress(10, desc="tiny", stream=stream, initial=6)
    bar.update(4, loss=0.5)
    bar.close()
    assert stream.getvalue().split("\r")[1].split("|")[2].strip().startswith("6/10")
    assert "10/10" in stream.getvalue()


def test_a_small_sensitivity_or_a_near_perfect_accuracy_keeps_its_digits():
    """Three decimals showed a sensitivity of 0.0004 as 0.000 (read: no flips) and an
    accuracy of 0.9996 as 1.000 (read: perfect)."""
    stream = _Terminal()
    bar = Progress(10, desc="tiny", stream=stream)
    bar.update(10, loss=0.00003)
    bar.set_postfix({"train/acc": 0.9996, "test/acc": 1.0, "sens/train": 0.0004})
    bar.close()
    last = stream.getvalue().rstrip("\n").split("\r")[-1]
    for shown in ("loss=3e-05", "train acc=0.9996", "test acc=1.000", "sens train=0.0004"):
        assert shown in last, (shown, last)
