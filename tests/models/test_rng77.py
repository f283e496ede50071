"""Building a model leaves the caller's CUDA random stream alone: ``torch.manual_seed`` inside
``fork_rng(devices=[])`` seeded CUDA's generator too (before CUDA starts, a seeding queued for
when it does), so every ``create_model`` of a vision model set it to the model's seed."""

from __future__ import annotations

import pytest
import torch
import torch.cuda

from senslab.models import create_model, list_models


def _queued() -> int:
    return sum(call is not None for call in torch.cuda._lazy_seed_tracker.get_calls())


@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.is_initialized(),
                    reason="CUDA running: seedings are not queued")
@pytest.mark.parametrize("name", ["vit_small", "resnet18", "mlp", "cnn"])
def test_building_a_vision_model_queues_no_cuda_seeding(name: str) -> None:
    if name not in list_models():
        pytest.skip(f"{name} is not registered")
    before = torch.cuda._lazy_seed_tracker.get_calls()
    torch.cuda._lazy_seed_tracker.__init__()  # a clean queue: what this build adds
    try:
        a = create_model(name, seed=5, image_size=8, patch_size=4) if name == "vit_small" \
            else create_model(name, seed=5, image_size=8)
        assert _queued() == 0, torch.cuda._lazy_seed_tracker.get_calls()
    finally:
        tracker = torch.cuda._lazy_seed_tracker
        tracker.__init__()
        for call in before:
            if call is not None:
                tracker.queue_seed_all(*call)
    # the seed still decides the weights, and the global CPU stream is neither read nor moved
    state = torch.random.get_rng_state()
    b = create_model(name, seed=5, image_size=8, patch_size=4) if name == "vit_small" \
        else create_model(name, seed=5, image_size=8)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(),
                                                  b.state_dict().values(), strict=True))


def test_a_default_device_does_not_move_where_the_seed_draws() -> None:
    """Under ``torch.set_default_device`` the weights are still drawn on the CPU from the seed
    (here the meta device, which draws nothing, stands in for a GPU)."""
    cpu = create_model("mlp", seed=2, image_size=8)
    with torch.device("meta"):
        other = create_model("mlp", seed=2, image_size=8)
    assert all(torch.equal(x, y) for x, y in zip(cpu.state_dict().values(),
                                                  other.state_dict().values(), strict=True))
