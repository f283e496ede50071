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


# -- an empty option (an unset shell variable) is refused, not taken for the option left out --


@pytest.mark.parametrize(("command", "option", "value"), [
    ("measure", "--data-root", ""), ("measure", "--data-root", "  "), ("train", "--data-root", ""),
    ("measure", "--checkpoint", ""), ("measure", "--model", ""), ("measure", "--data", ""),
    ("measure", "--hf", ""), ("train", "--out", ""), ("train", "--name", ""),
])
def test_an_empty_option_is_refused_naming_it(
        tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        command: str, option: str, value: str) -> None:
    """``--data-root ""`` read the data from the default folder, ``--checkpoint ""`` measured an
    untrained model, ``--out ""`` trained into runs/NAME: an empty value was taken for the option
    left out, without a word."""
    monkeypatch.chdir(tmp_path)
    extra = (["--num-examples", "4"] if command == "measure" else
             ["--set", "train.epochs=1", "--set", "train.max_steps=1"])
    if command == "train" and option != "--out":
        extra += ["--out", str(tmp_path / "run")]
    assert main([command, option, value, *extra, "--threads", "1"]) == 2
    out, err = capsys.readouterr()
    line = _one_error(err)
    assert f"{option} is empty" in line and f"drop {option}" in line, line
    if option == "--data-root":
        assert "SENSLAB_DATA" in line and "the folder that holds the data set's files" in line
    assert out == "" and list(tmp_path.iterdir()) == []  # nothing measured, nothing written


# -- a model on a generated set it cannot take, or built for another size ----------------------


def _own(names: list[str], registry) -> list[str]:
    """The names registered by senslab itself (not by a test's toy factory)."""
    return [n for n in names if registry.get(n).__module__.startswith("senslab.")]


def _generated_sets() -> list[str]:
    """The registered sets that train.loop's image/text check left unchecked."""
    from senslab.data import list_datasets
    from senslab.data._registry import DATASETS
    from senslab.train.loop import data_kind

    return [n for n in _own(list_datasets(), DATASETS) if data_kind(n) is None]


def _all_models() -> list[str]:
    from senslab.models import list_models
    from senslab.models._registry import MODELS

    return _own(list_models(), MODELS)


def test_every_model_on_every_generated_set_is_measured_or_refused_up_front(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``measure --model mlp --data boolean`` failed inside the measurement (Patches' shape
    error, after the note and the table's header), and so did every pair of a model and a
    generated set that do not fit. Each pair either measures, or is refused before any work in
    one line naming the model, the set and what fits — and a refusal's ``add --set`` fix then
    measures."""
    sets = _generated_sets()
    assert {"boolean", "sparse_parity", "modular_addition", "sparse_frequent",
            "maxmargin_attention"} <= set(sets)
    measured, failures = [], []
    for model in _all_models():
        for data in sets:
            argv = ["measure", "--model", model, "--data", data, "--num-examples", "4",
                    "--precision", "float32", "--threads", "1"]
            code = main(argv)
            out, err = capsys.readouterr()
            if code == 0 and len(out.splitlines()) == 2:
                measured.append((model, data))
                continue
            lines = err.strip().splitlines()
            line = lines[-1] if lines else ""
            if code != 2 or len(lines) != 1 or out or model not in line or data not in line:
                failures.append((model, data, code, line, out))
                continue
            if "add --set " in line:  # built for another size: the fix given must work
                fix = line.split("add --set ", 1)[1].split()[0]
                code = main([*argv, "--set", fix])
                out, err = capsys.readouterr()
                if code != 0:
                    failures.append((model, data, "after --set " + fix, err, out))
                measured.append((model, data))
            elif " a model that takes " not in line:
                failures.append((model, data, "names no model that fits", line, out))
    assert not failures, "\n".join(map(str, failures))
    for pair in (("boolean_transformer", "boolean"), ("parity_transformer", "sparse_parity"),
                 ("modadd_transformer", "modular_addition"), ("lstm", "modular_addition"),
                 ("sparse_attention", "sparse_frequent"), ("attention_model",
                                                           "maxmargin_attention")):
        assert pair in measured, pair


@pytest.mark.parametrize(("model", "data", "says", "fits"), [
    ("mlp", "boolean", "mlp takes images and boolean holds ±1 bit strings: use mlp on ",
     ("digits", "mnist", "cifar10", "boolean_transformer", "parity_transformer")),
    ("lstm", "sparse_frequent", "lstm takes text or token ids `a b =` and sparse_frequent "
     "holds sequences of float token vectors: use lstm on ",
     ("modular_addition", "sst2", "sparse_attention", "attention_model")),
    ("boolean_transformer", "digits", "boolean_transformer takes ±1 bit strings and digits "
     "holds images: use boolean_transformer on ", ("boolean, sparse_parity", "mlp", "vit_small")),
    ("sparse_attention", "sst2", "sparse_attention takes sequences of float token vectors and "
     "sst2 holds text", ("maxmargin_attention, sparse_frequent", "lstm", "roberta")),
    ("modadd_transformer", "sparse_parity", "modadd_transformer takes token ids `a b =` and "
     "sparse_parity holds ±1 bit strings: use modadd_transformer on modular_addition",
     ("boolean_transformer", "parity_transformer")),
])
def test_measure_refuses_a_model_on_inputs_of_another_kind_naming_what_fits(
        capsys: pytest.CaptureFixture[str], model: str, data: str, says: str,
        fits: tuple[str, ...]) -> None:
    """A small research model on an image or text set, or an image or text model on a
    generated set: refused before the data is looked for (sst2's files are not here)."""
    assert main(["measure", "--model", model, "--data", data, "--num-examples", "4"]) == 2
    out, err = capsys.readouterr()
    line = _one_error(err)
    assert says in line and out == ""
    assert all(name in line for name in fits), line


@pytest.mark.parametrize(("model", "data", "options", "says"), [
    ("sparse_attention", "sparse_frequent", ("model.overrides.dim=32",),
     "sparse_attention is built for token vectors of "
     "length 32 (model.overrides.dim) and sparse_frequent holds token vectors of length 40: add "
     "--set model.overrides.dim=40"),
    ("attention_model", "sparse_frequent", ("data.options.case=1", "data.options.setting=2",
                                            "model.overrides.dim=16"),
     "length 16 (model.overrides.dim) and sparse_frequent holds token vectors of length 60: add "
     "--set model.overrides.dim=60"),
    ("parity_transformer", "sparse_parity", ("data.options.n_bits=30",), "parity_transformer is "
     "built for at most 20 bits (model.overrides.n_bits) and sparse_parity holds 30 bits: add "
     "--set model.overrides.n_bits=30"),
    ("modadd_transformer", "modular_addition", ("data.options.p=50",), "modadd_transformer is "
     "built for (a + b) mod 113 (model.overrides.p) and modular_addition holds (a + b) mod 50: "
     "add --set model.overrides.p=50"),
])
def test_a_small_model_built_for_another_size_is_refused_naming_the_fix(
        capsys: pytest.CaptureFixture[str], model: str, data: str, options: tuple[str, ...],
        says: str) -> None:
    """The pairs that fit by kind but not by size failed inside the measurement, the token-vector
    models with the advice to one-hot encode the ids (the data was one-hot already). A
    token-vector model left to its default takes ``dim`` from the data; one set explicitly to
    another length is refused."""
    sets = [a for o in options for a in ("--set", o)]
    common = ["measure", "--model", model, "--data", data, *sets, "--num-examples", "4",
              "--precision", "float32", "--threads", "1"]
    assert main(common) == 2
    out, err = capsys.readouterr()
    assert says in _one_error(err) and out == ""
    assert main([*common, "--set", says.rsplit("--set ", 1)[1]]) == 0, capsys.readouterr().err
    assert len(capsys.readouterr().out.splitlines()) == 2


def test_fewer_bits_than_a_bit_model_takes_are_measured(capsys: pytest.CaptureFixture[str]):
    """n_bits is the longest string a bit model takes: shorter strings fit."""
    assert main(["measure", "--model", "parity_transformer", "--data", "sparse_parity", "--set",
                 "data.options.n_bits=12", "--num-examples", "4", "--precision", "float32",
                 "--threads", "1"]) == 0, capsys.readouterr().err


@pytest.mark.parametrize("existing", [False, True])
def test_train_refuses_a_model_on_a_generated_set_it_cannot_take_writing_nothing(
        tmp_path, capsys: pytest.CaptureFixture[str], existing: bool) -> None:
    out = tmp_path / "run"
    if existing:
        out.mkdir()
    assert main(["train", "--model", "mlp", "--data", "boolean", "--out", str(out),
                 "--set", "train.epochs=1", "--set", "train.max_steps=1", "--threads", "1"]) == 2
    assert "mlp takes images and boolean holds ±1 bit strings" in _one_error(
        capsys.readouterr().err)
    if existing:
        assert list(out.iterdir()) == []
    else:
        assert not out.exists()
