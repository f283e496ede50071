"""Command-line options shared by every command."""

from __future__ import annotations

import pytest
import torch

from senslab.cli import main


def test_threads_option_sets_torch_threads(capsys: pytest.CaptureFixture[str]) -> None:
    before = torch.get_num_threads()
    try:
        assert main(["list", "models", "vit_*", "--threads", "1"]) == 0
        assert torch.get_num_threads() == 1
        assert "vit_small" in capsys.readouterr().out
    finally:
        torch.set_num_threads(before)


def test_threads_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    before = torch.get_num_threads()
    assert main(["list", "models", "--threads", "0"]) == 2
    assert "--threads must be ≥ 1" in capsys.readouterr().err
    assert torch.get_num_threads() == before


# -- a model on data of another kind (image model, text set or back): one line, nothing written --

IMAGE_ON_TEXT = "vit_small is an image model and sst2 holds text: use an image set ("
TEXT_ON_IMAGES = "lstm is a text model and digits holds images: use a text set ("


def _one_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err  # no "measuring …" / "training …" note before it
    assert lines[0].startswith("senslab: error: ")
    return lines[0]


@pytest.mark.parametrize(("model", "data", "says", "fits"), [
    ("vit_small", "sst2", IMAGE_ON_TEXT, ("digits", "mnist", "cifar10", "roberta", "lstm")),
    ("lstm", "digits", TEXT_ON_IMAGES, ("sst2", "rotten_tomatoes", "mlp", "vit_small")),
])
def test_measure_refuses_a_model_on_data_of_another_kind(
        capsys: pytest.CaptureFixture[str], model: str, data: str, says: str,
        fits: tuple[str, ...]) -> None:
    assert main(["measure", "--model", model, "--data", data, "--num-examples", "4"]) == 2
    line = _one_error(capsys.readouterr().err)
    assert says in line
    assert all(name in line for name in fits), line


@pytest.mark.parametrize(("model", "data", "says"), [
    ("vit_small", "sst2", IMAGE_ON_TEXT), ("lstm", "digits", TEXT_ON_IMAGES)])
@pytest.mark.parametrize("existing", [False, True])
def test_train_refuses_a_model_on_data_of_another_kind_writing_nothing(
        tmp_path, capsys: pytest.CaptureFixture[str], model: str, data: str, says: str,
        existing: bool) -> None:
    out = tmp_path / "run"
    if existing:
        out.mkdir()
    assert main(["train", "--model", model, "--data", data, "--out", str(out),
                 "--set", "train.epochs=1", "--set", "train.max_steps=1"]) == 2
    assert says in _one_error(capsys.readouterr().err)
    if existing:
        assert list(out.iterdir()) == []
    else:
        assert not out.exists()


def test_measure_checkpoint_refuses_a_run_of_a_model_on_data_of_another_kind(
        tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    """The config.json a run of such a pair left behind (it failed on its first step)."""
    import json

    from senslab.train.config import RunConfig

    cfg = RunConfig(name="mismatch")
    cfg.model.name, cfg.data.name = "lstm", "digits"
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(cfg.to_dict()))
    assert main(["measure", "--checkpoint", str(run), "--num-examples", "4"]) == 2
    assert TEXT_ON_IMAGES in _one_error(capsys.readouterr().err)


def _broadcast_mismatch() -> None:
    """A torch error raised in code outside senslab (as a model's forward would raise it)."""
    torch.ones(2, 3).expand(4, 2)


def test_a_torch_error_passed_on_by_senslabs_torch_mode_is_not_taken_for_senslabs_own() -> None:
    """Every torch call in a measurement passes through senslab's torch-function modes, so the
    innermost frame of a torch error raised in a model's forward was senslab's: the command
    showed torch's text as a message senslab wrote, without the hint that it was unexpected."""
    from senslab.cli import explain
    from senslab.measure.tokenwise import _AutocastProbe

    with pytest.raises(RuntimeError) as plain:
        _broadcast_mismatch()
    with pytest.raises(RuntimeError) as probed, _AutocastProbe("cpu"):
        _broadcast_mismatch()
    assert probed.traceback[-1].name == "__torch_function__"  # the case being tested
    for err in (plain.value, probed.value):
        code, message = explain(err)
        assert code == 1 and message.startswith("unexpected RuntimeError: The expanded size")
        assert "probably a bug" in message
    # senslab's own RuntimeErrors keep their message as written
    from senslab.models import create_model

    model = create_model("vit_small").train()
    with pytest.raises(RuntimeError) as own:
        model.local_cache(torch.zeros(1, 3, 32, 32), 4)
    code, message = explain(own.value)
    assert code == 1 and message.startswith("local reuse needs eval mode")
