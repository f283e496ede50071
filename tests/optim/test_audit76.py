"""``last_step_size`` / ``step_sizes()`` report the most recent step (audit of session 76): they
read the first parameter ever updated, so a step that moved only another parameter reported the
size of an earlier one (NGD: 1/2 where the last step applied 1/4), and an SPS step with no
gradient the previous step's size."""

from __future__ import annotations

import torch

from senslab.optim import NGD, SPS


def pair() -> tuple[torch.nn.Parameter, torch.nn.Parameter]:
    return (torch.nn.Parameter(torch.tensor([1.0], dtype=torch.float64)),
            torch.nn.Parameter(torch.tensor([1.0], dtype=torch.float64)))


def test_the_step_size_is_the_last_steps_also_after_a_resume():
    a, b = pair()
    opt = NGD([a, b], lr=1.0)
    a.grad, b.grad = torch.tensor([2.0], dtype=torch.float64), None
    opt.step()
    assert opt.last_step_size == 0.5
    a.grad, b.grad = None, torch.tensor([4.0], dtype=torch.float64)
    opt.step()
    assert b.item() == 0.0  # moved by 4 · 1/4
    assert opt.last_step_size == 0.25 and opt.step_sizes() == [0.25]
    c, d = pair()
    again = NGD([c, d], lr=1.0)
    again.load_state_dict(opt.state_dict())
    assert again.last_step_size == 0.25
    c.grad, d.grad = torch.tensor([8.0], dtype=torch.float64), None
    again.step()
    assert again.last_step_size == 0.125


def test_groups_the_last_step_did_not_update_report_none():
    a, b = pair()
    opt = NGD([{"params": [a]}, {"params": [b], "lr": 2.0}], lr=1.0)
    a.grad, b.grad = torch.tensor([2.0], dtype=torch.float64), torch.tensor([2.0],
                                                                          dtype=torch.float64)
    opt.step()  # one norm over both groups: √8
    assert opt.step_sizes() == [1 / 8 ** 0.5, 2 / 8 ** 0.5]
    a.grad = None
    opt.step()
    assert opt.step_sizes() == [None, 1.0]


def test_an_sps_step_that_moves_nothing_has_no_step_size():
    w = torch.nn.Parameter(torch.tensor([2.0], dtype=torch.float64))
    sps = SPS([w], c=0.5, eta_max=10.0)

    def loss() -> torch.Tensor:
        sps.zero_grad()
        value = (w ** 2).sum()
        value.backward()
        return value

    sps.step(loss)
    assert sps.last_step_size == 0.5

    def no_gradient() -> torch.Tensor:
        sps.zero_grad()
        return torch.tensor(1.0, dtype=torch.float64)

    sps.step(no_gradient)
    assert sps.last_step_size is None
