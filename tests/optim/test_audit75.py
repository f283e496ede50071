"""Audit of session 75: NGD refused its own checkpoint once torch's SWALR had run (its
``swa_lr`` key); Polyak stepped as SPS_max after an SPS checkpoint was loaded into it (the
same option names: η = 0.01 instead of L/‖g‖²); ``alignment`` read 0 for a W with a NaN and
for tiny or huge W; ``accuracy_se`` took a p outside [0, 1]."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch.optim.swa_utils import SWALR

from senslab.experiments._verdicts import accuracy_se
from senslab.optim import NGD, SPS, Polyak
from senslab.optim.maxmargin import alignment


def test_ngd_resumes_after_swalr():
    p = torch.nn.Parameter(torch.ones(2))
    opt = NGD([p], lr=0.1)
    schedule = SWALR(opt, swa_lr=0.05)
    p.grad = torch.ones(2)
    opt.step()
    schedule.step()
    saved = copy.deepcopy(opt.state_dict())
    q = torch.nn.Parameter(p.detach().clone())
    again = NGD([q], lr=0.1)
    again.load_state_dict(saved)
    assert again.param_groups[0]["swa_lr"] == 0.05


def loss_of(w: torch.nn.Parameter):
    def closure() -> torch.Tensor:
        w.grad = None
        loss = (w ** 2).sum() / 2
        loss.backward()
        return loss
    return closure


def test_polyak_refuses_an_sps_checkpoint_and_sps_options():
    w = torch.nn.Parameter(torch.tensor([2.0]))
    sps = SPS([w], c=0.5, eta_max=0.01)
    sps.step(loss_of(w))
    polyak = Polyak([torch.nn.Parameter(torch.tensor([2.0]))])
    with pytest.raises(ValueError, match=r"Polyak is the step with c = 1 and no cap.*c=0.5, "
                                         r"eta_max=0.01"):
        polyak.load_state_dict(sps.state_dict())
    with pytest.raises(ValueError, match="Polyak is the step with c = 1 and no cap"):
        polyak.add_param_group({"params": [torch.nn.Parameter(torch.ones(1))], "c": 0.5})
    v = torch.nn.Parameter(torch.tensor([2.0]))
    Polyak([v]).step(loss_of(v))  # η = L/‖g‖² = 2/4: w = 2 − 0.5·2 = 1
    assert float(v) == pytest.approx(1.0)


def test_alignment_of_non_finite_tiny_and_huge_tensors():
    eye = torch.eye(3, dtype=torch.float64)
    assert math.isnan(alignment(torch.full((3, 3), math.nan), eye))
    assert math.isnan(alignment(eye * math.inf, eye))
    assert alignment(eye * 1e-170, eye) == pytest.approx(1.0)
    assert alignment(eye * 1e160, eye * 1e160) == pytest.approx(1.0)
    assert alignment(torch.zeros(3, 3), eye) == 0.0


@pytest.mark.parametrize("p", [1.01, 1.2, -0.1])
def test_accuracy_se_refuses_a_p_that_is_no_share(p):
    with pytest.raises(ValueError, match="is no share of items"):
        accuracy_se(p, 100)
