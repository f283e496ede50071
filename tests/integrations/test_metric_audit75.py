"""Audit of session 75, the torchmetrics metric: states of bf16's own decisions
(``autocast``) or of a model measured in training mode (``eval_mode=False``) are another
quantity than float32's decisions in eval mode — merge_state and load_state_dict refuse them,
naming the option; a state dict saved before senslab recorded those two options loads, checked
on the others."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from metric_models import patch_batches, patch_net

pytest.importorskip("torchmetrics")

from senslab.integrations.torchmetrics import TokenSensitivityMetric  # noqa: E402
from senslab.tokens import Patches  # noqa: E402

OPTS = {"sigma": 0.5, "precision": "float32"}


@pytest.mark.filterwarnings("ignore:the standard error rests on")
@pytest.mark.parametrize("option, theirs", [
    ("autocast", {"autocast": torch.bfloat16, "precision": "auto"}),
    ("eval_mode", {"eval_mode": False}),
])
def test_states_of_other_decisions_are_refused(option, theirs):
    model, x = patch_net(), patch_batches(2)
    other = TokenSensitivityMetric(Patches(2), **{**OPTS, **theirs})
    other.persistent(True)
    other.update(model, x[1])
    for incoming in (other, other.state_dict()):
        mine = TokenSensitivityMetric(Patches(2), **OPTS)
        mine.update(model, x[0])
        with pytest.raises(ValueError, match=f"cannot merge: {option} "):
            mine.merge_state(incoming)
        assert mine.result().num_examples == 16  # nothing merged
    fresh = TokenSensitivityMetric(Patches(2), **OPTS)
    fresh.persistent(True)
    with pytest.raises(ValueError, match=f"cannot load the state dict: {option} "):
        fresh.load_state_dict(other.state_dict())


@pytest.mark.filterwarnings("ignore:the standard error rests on")
@pytest.mark.filterwarnings("ignore:The ``compute`` method")  # torchmetrics: loaded, not updated
def test_a_state_dict_from_before_the_two_options_were_recorded_loads():
    model, x = patch_net(), patch_batches(2)
    saved = TokenSensitivityMetric(Patches(2), **OPTS)
    saved.persistent(True)
    saved.update(model, x[1])
    sd = saved.state_dict()
    config = json.loads(bytes(sd["config"].tolist()).decode())
    assert config["autocast"] is None and config["eval_mode"] is True
    older = {k: v for k, v in config.items() if k not in ("autocast", "eval_mode")}
    sd["config"] = torch.tensor(list(json.dumps(older, sort_keys=True).encode()),
                                dtype=torch.uint8)
    fresh = TokenSensitivityMetric(Patches(2), **OPTS)
    fresh.persistent(True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        fresh.load_state_dict(sd)
    assert fresh.result().estimate == saved.result().estimate
    # still checked on the options it did record
    older["sigma"] = 0.1
    sd["config"] = torch.tensor(list(json.dumps(older, sort_keys=True).encode()),
                                dtype=torch.uint8)
    other = TokenSensitivityMetric(Patches(2), **OPTS)
    other.persistent(True)
    with pytest.raises(ValueError, match="cannot load the state dict: sigma 0.5 vs 0.1"):
        other.load_state_dict(sd)
