"""A run's measurement noise comes from a stream of its own, never from the seed its model's
weights were drawn from: noise drawn from the run's seed was, row for row, the text models'
initial embedding table (and a trained model reads those directions)."""

from __future__ import annotations

import pytest
import torch

from senslab._seeds import CPU_SEED_END
from senslab.measure import noise_seed, token_sensitivity
from senslab.measure._noise import NoiseStream
from senslab.models import create_model
from senslab.train.config import RunConfig, apply_overrides
from senslab.train.loop import build_model, load_data
from senslab.train.track import Tracker

SMALL = dict(vocab_size=64, max_len=8, dim=16, layers=1, heads=2)


def _cosine(name: str, seed: int, noise_from: int) -> float:
    table = create_model(name, seed=seed, **SMALL).embed.weight.detach()
    stream = NoiseStream(torch.Generator().manual_seed(noise_from), table.shape[1],
                         torch.device("cpu"))
    rows = stream.take(table.shape[0])
    return float(torch.nn.functional.cosine_similarity(table.flatten(), rows.flatten(), dim=0))


@pytest.mark.parametrize("name", ["roberta", "gpt2", "lstm"])
@pytest.mark.parametrize("seed", [0, 7])
def test_the_noise_of_a_run_is_not_its_models_initial_embedding_table(name: str,
                                                                      seed: int) -> None:
    assert _cosine(name, seed, seed) > 0.999  # why: the run's own seed drew the table
    assert abs(_cosine(name, seed, noise_seed(seed))) < 0.1


def test_noise_seeds_stay_off_the_run_seed_and_in_the_cpu_range() -> None:
    for seed in [0, 1, 2, 41, 2**31, CPU_SEED_END - 1]:
        s = noise_seed(seed)
        assert 0 <= s < CPU_SEED_END and s != seed


def test_the_tracker_measures_with_the_runs_noise_seed() -> None:
    """The tracked sens/train is token_sensitivity with the noise seed of the run (it was the
    run's seed itself, the stream the model's weights came from)."""
    cfg = apply_overrides(RunConfig(name="t"), ["data.name=digits", "model.name=mlp",
                                                "track.num_examples=48", "seed=3"])
    train, test = load_data(cfg)
    model = build_model(cfg, train)
    tracker = Tracker(cfg, model, train, test, torch.device("cpu"))
    tracked = tracker.sensitivity(tracker.sens_train)
    x = tracker.sens_train.inputs
    mine = token_sensitivity(model, x, sigma=cfg.track.sigma, repeats=cfg.track.repeats,
                             generator=noise_seed(cfg.seed))
    assert tracked.estimate == mine.estimate and tracked.stderr == mine.stderr
    assert torch.equal(tracked.per_sample, mine.per_sample)  # example by example


def test_reproduction_names_the_records_measured_with_the_shared_seed() -> None:
    """REPRODUCTION.md says which records were finished while the noise came from the run's own
    seed: those of experiments that measure sensitivity, before the day it changed."""
    from senslab.reproduction import OWN_NOISE_FROM, _shared_seed_note

    old = {"name": "grokking", "scale": "cpu", "finished": "2026-11-24T20:20:04+00:00"}
    new = {**old, "finished": OWN_NOISE_FROM + "T01:00:00+00:00"}
    paper = {**old, "scale": "paper"}
    ib = {**old, "name": "ib_joint"}  # measures no sensitivity
    note = _shared_seed_note({"a": old, "b": ib})
    assert len(note) == 2 and note[0].startswith("1 record (grokking) was finished before")
    assert _shared_seed_note({"a": new, "b": ib}) == []
    assert "grokking (paper scale)" in _shared_seed_note({"a": new, "b": paper})[0]
