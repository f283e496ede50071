"""Audit 81, the zoo's vision models and their configs: a seed decides a model's weights when
models are built in several threads at once, and a config whose numbers are not finite is
refused by name instead of building NaN weights or failing inside ``round()``."""

from __future__ import annotations

import threading

import pytest
import torch

from senslab.models import create_model


def _flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_models_built_in_threads_at_once_get_their_seeds_weights() -> None:
    # ResNet-18 at width 0.5 with seeds 0-3 in four threads started together: every one of them
    # drew weights of no seed (all four, three rounds in three), since each build reseeded the
    # one global generator that the others were drawing from
    seeds = range(4)
    alone = {s: _flat(create_model("resnet18", width=0.5, seed=s)) for s in seeds}
    torch.manual_seed(123)
    state = torch.random.get_rng_state()
    for _ in range(2):
        built: dict[int, torch.Tensor] = {}
        start = threading.Barrier(len(seeds))

        def build(seed: int, built: dict[int, torch.Tensor] = built,
                  start: threading.Barrier = start) -> None:
            start.wait()
            built[seed] = _flat(create_model("resnet18", width=0.5, seed=seed))

        threads = [threading.Thread(target=build, args=(s,)) for s in seeds]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(built) == list(seeds)
        assert all(torch.equal(built[s], alone[s]) for s in seeds)
    # and the caller's generator is where it was: no build put back another one's state
    assert torch.equal(torch.random.get_rng_state(), state)


@pytest.mark.parametrize("name", ["sparse_attention", "attention_model"])
@pytest.mark.parametrize("scale", [float("nan"), float("inf")])
def test_an_init_scale_that_is_not_finite_is_refused(name: str, scale: float) -> None:
    # NaN passed "init_scale < 0" and, like infinity, built a model whose every output was NaN
    with pytest.raises(ValueError, match=r"init_scale must be a finite number >= 0.*init_scale="):
        create_model(name, init_scale=scale)
    model = create_model(name, init_scale=0.0, dim=4)  # zero weights stay allowed
    assert torch.isfinite(model(torch.eye(4).expand(2, 4, 4))).all()


@pytest.mark.parametrize("width", [float("nan"), float("inf")])
def test_a_resnet_width_that_is_not_finite_is_refused_by_name(width: float) -> None:
    # NaN passed the positivity check and both failed in round() ("cannot convert float NaN to
    # integer", an OverflowError for infinity), naming neither the field nor a fix
    with pytest.raises(ValueError, match=r"ResNetConfig\.width must be a positive finite number"):
        create_model("resnet18", width=width)
