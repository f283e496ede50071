"""The token-vector models (``sparse_attention``, ``attention_model``) take their ``dim`` — the
length of a token vector — from the data, as the other data-determined fields (num_classes,
in_channels, vocab_size) are filled: ``--model sparse_attention --data sparse_frequent`` was
refused ("add --set model.overrides.dim=40") although the data says the length. A ``dim`` set
explicitly to another length is still refused, naming both lengths; the experiments' runs of these
models (their own trainers, which set ``dim`` themselves) write the same config.json as before."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from senslab.cli import main
from senslab.train.config import RunConfig
from senslab.train.loop import build_model, fit, load_data

PAIRS = [("sparse_attention", "sparse_frequent", 40), ("attention_model", "sparse_frequent", 40),
         ("attention_model", "maxmargin_attention", 32)]


def tiny(model: str, data: str, **overrides: int) -> RunConfig:
    cfg = RunConfig(name=f"{model}-{data}", device="cpu")
    cfg.model.name, cfg.data.name, cfg.model.overrides = model, data, dict(overrides)
    cfg.train.epochs, cfg.train.max_steps, cfg.train.batch_size = 1, 3, 16
    cfg.track.num_examples = 8
    return cfg


@pytest.mark.parametrize(("model", "data", "length"), PAIRS)
def test_a_token_vector_model_left_to_its_default_trains_on_the_datas_length(
        tmp_path: Path, model: str, data: str, length: int) -> None:
    run = tmp_path / "run"
    summary = fit(tiny(model, data), run, progress=False)
    assert summary["steps"] == summary["final"]["step"] > 0
    # filled like num_classes: not recorded, so config.json is what the command said
    assert json.loads((run / "config.json").read_text())["model"] == {"name": model,
                                                                       "overrides": {}}
    # the model is the one the explicit override builds (a run trained with
    # --set model.overrides.dim=<length>, as the refusal told, has the same weights)
    cfg = tiny(model, data)
    train, _ = load_data(cfg)
    built = build_model(cfg, train)
    assert built.config.dim == length
    explicit = build_model(tiny(model, data, dim=length), train)
    assert built.config == explicit.config
    assert all(torch.equal(a, b) for a, b in zip(built.state_dict().values(),
                                                 explicit.state_dict().values(), strict=True))


@pytest.mark.parametrize(("model", "data", "length"), PAIRS[:2])
def test_measure_of_the_default_pair_measures(capsys: pytest.CaptureFixture[str], model: str,
                                              data: str, length: int) -> None:
    code = main(["measure", "--model", model, "--data", data, "--num-examples", "4",
                 "--precision", "float32", "--threads", "1"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert len(out.splitlines()) == 2  # the table's header and its row


def test_an_explicit_dim_the_data_disagrees_with_is_refused_before_anything_is_written(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    says = ("sparse_attention is built for token vectors of length 32 (model.overrides.dim) "
            "and sparse_frequent holds token vectors of length 40")
    code = main(["measure", "--model", "sparse_attention", "--data", "sparse_frequent",
                 "--set", "model.overrides.dim=32", "--num-examples", "4"])
    out, err = capsys.readouterr()
    assert code == 2 and says in err and out == ""
    # fit (no command-line check in front) refuses it too, naming the fix, before writing:
    # it failed on the model's first input, advising to one-hot encode the (one-hot) data
    run = tmp_path / "run"
    with pytest.raises(ValueError) as refused:
        fit(tiny("sparse_attention", "sparse_frequent", dim=32), run, progress=False)
    assert str(refused.value) == (f"{says}: set model.overrides.dim=40, or leave it unset (it "
                                  "is read from the data)")
    assert not (run / "config.json").exists()
    # an explicit dim that agrees is taken as given
    assert fit(tiny("sparse_attention", "sparse_frequent", dim=40), tmp_path / "agrees",
               progress=False)["steps"] == 3


#: config.json of the first run of each experiment that trains these models (at the cpu scale),
#: as written before the models took their dim from the data: a change would make every existing
#: run directory of the experiment refuse to resume ("holds a run with a different configuration")
EXPERIMENT_RUNS = {
    "ib_fixed_v": {
        "batch_size": None, "data": {"dim": 32, "num_samples": 32, "opt_score": 1.0,
                                     "other_score_frac": 0.5, "query_signal": 0.0, "seed": 0,
                                     "seq_len": 8},
        "eta_max": None, "head": "fixed", "init_scale": 0.0, "label": "gd", "lr": 1.0,
        "name": "gd-s0", "optimizer": "sgd", "per_decade": 20, "seed": 0, "sps_c": 0.5,
        "steps": 20000},
    "ib_joint": {
        "batch_size": 8, "data": {"dim": 32, "num_samples": 32, "opt_score": 1.0,
                                  "other_score_frac": 0.5, "query_signal": 0.0, "seed": 0,
                                  "seq_len": 8},
        "eta_max": None, "head": "joint", "init_scale": 0.01, "label": "sgd", "lr": 0.1,
        "name": "sgd-s0", "optimizer": "sgd", "per_decade": 20, "seed": 0, "sps_c": 0.5,
        "steps": 3000},
    "synthetic_sparse_frequent": {
        "batch_size": 50, "case": 1, "epochs": 50, "eval_every": 5, "init_scale": 0.01,
        "lr": 0.5, "name": "case1-s0", "seed": 0, "sens_examples": 256, "setting": 0,
        "test_size": 1000, "train_size": 1000},
}


@pytest.mark.parametrize("name", sorted(EXPERIMENT_RUNS))
def test_the_experiments_runs_of_these_models_keep_their_config(tmp_path: Path,
                                                                name: str) -> None:
    """(A guard: these trainers build the models with ``dim`` from their own data, not through
    ``build_model``; this pins what their run directories hold.)"""
    from senslab.experiments import get_experiment
    from senslab.train.looprun import LoopRun

    _, runs = get_experiment(name).resolve("cpu")
    config = LoopRun(tmp_path / "run", runs[0].config).config  # what config.json holds
    assert json.loads(json.dumps(config)) == EXPERIMENT_RUNS[name]
    assert dataclasses.is_dataclass(runs[0].config)
    if runs[0].trainer == "attention":  # its model's dim is its data's (d = 32)
        from senslab.train.loops.attention import build_model as attention_model
        from senslab.train.loops.attention import load_task

        task = load_task(**dataclasses.asdict(runs[0].config.data))
        assert attention_model(runs[0].config, task).config.dim == 32
