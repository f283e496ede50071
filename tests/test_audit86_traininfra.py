"""Audit 86 (traininfra): W&B's disabled mode, and a checkpoint lacking a generator's state."""

from __future__ import annotations

import json

import pytest
import torch

from senslab.train.looprun import generator_states, set_generator_states
from senslab.train.report_to import WANDB_STATE, Reporters
from senslab.train.rundir import RunDir


@pytest.fixture
def wandb_env(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    for var, value in {"WANDB_SILENT": "true", "WANDB_CONFIG_DIR": tmp_path / "wandb-config",
                       "WANDB_CACHE_DIR": tmp_path / "wandb-cache",
                       "WANDB_DATA_DIR": tmp_path / "wandb-data"}.items():
        monkeypatch.setenv(var, str(value))
    # W&B reads its settings (WANDB_MODE among them) once per process: an earlier test's
    # offline setup was kept, and this test's WANDB_MODE=disabled went unread
    wandb.teardown()
    yield monkeypatch
    wandb.teardown()


def test_a_sitting_with_wandb_disabled_does_not_mark_its_steps_as_sent(tmp_path, wandb_env):
    rd = RunDir(tmp_path / "run")
    rd.path.mkdir()
    rd.write_json("config.json", {"a": 1})
    wandb_env.setenv("WANDB_MODE", "disabled")
    with Reporters() as reporters:
        reporters.open(["wandb"], rd, {"a": 1}, "run")
        for step in range(3):
            record = {"step": step, "loss": 1.0 / (step + 1)}
            rd.log(record)
            reporters.log(record)
    # W&B kept nothing: no step of it may read as held (wandb.json said step 2 before)
    state = rd.path / WANDB_STATE
    assert not state.exists() or json.loads(state.read_text()).get("step", -1) == -1

    # re-run with W&B on: the finished run's records are sent (none were before)
    rd.write_json("summary.json", {"final": {"loss": 1 / 3}})
    wandb_env.setenv("WANDB_MODE", "offline")
    import wandb
    wandb.teardown()  # as a new process would: W&B reads WANDB_MODE once per setup
    with Reporters() as reporters:
        reporters.open(["wandb"], rd, {"a": 1}, "run")
        assert reporters.active[0].run is not None  # a W&B run was started to send them
    assert json.loads(state.read_text())["step"] == 2


def test_a_checkpoint_without_a_generators_state_is_refused_naming_it():
    data, measure = torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)
    saved = generator_states(data=data)  # a loop that drew from one generator
    with pytest.raises(ValueError, match=r"no state for the random generator\(s\) measure "
                                         r"\(it holds data\)"):
        set_generator_states(saved, data=data, measure=measure)
    data.manual_seed(5)
    set_generator_states(saved, data=data)  # the generators it holds: restored
    assert torch.equal(data.get_state(), saved["data"])
