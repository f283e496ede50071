"""What the tracker measures at every evaluation can be trusted: a count larger than its split
is said (not cut without a word), the same model gives the same numbers at every evaluation,
and measuring leaves the model, its mode, its BatchNorm statistics and the training RNG alone."""

from __future__ import annotations

import warnings

import pytest
import torch

from senslab.train.config import RunConfig, apply_overrides
from senslab.train.loop import build_model, load_data
from senslab.train.track import Tracker

TINY_VIT = ["model.name=vit_small", "model.overrides.patch_size=2", "model.overrides.depth=1",
            "model.overrides.dim=16", "model.overrides.heads=2", "model.overrides.dim_head=8",
            "model.overrides.mlp_dim=16"]  # dropout 0.1 stays: the training RNG is at stake
TINY_CONVMIXER = ["model.name=convmixer", "model.overrides.dim=8", "model.overrides.depth=1"]


def _tracker(extra: list[str], shard: tuple[int, int] | None = None) -> Tracker:
    cfg = apply_overrides(RunConfig(name="t"), ["data.name=digits", "model.name=mlp", *extra])
    train, test = load_data(cfg)
    torch.manual_seed(0)
    return Tracker(cfg, build_model(cfg, train), train, test, torch.device("cpu"), shard=shard)


def test_counts_within_the_splits_are_drawn_as_asked_without_a_word():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t = _tracker(["track.num_examples=300", "track.val=true", "track.eval_examples=359"])
    assert (len(t.sens_train), len(t.sens_val), len(t.eval_train), len(t.eval_test)) == (
        300, 300, 359, 359)


def test_a_tracked_count_larger_than_the_test_split_is_said():
    """track.num_examples=400 with track.val: sens/train rested on 400 training images and
    sens/val, logged beside it as "the same number of test examples", on the 359 the test split
    has, without a word."""
    with pytest.warns(UserWarning) as said:
        t = _tracker(["track.num_examples=400", "track.val=true"])
    assert (len(t.sens_train), len(t.sens_val)) == (400, 359)
    assert len(said) == 1  # the training split holds 400: nothing said of sens/train
    msg = str(said[0].message)
    assert msg.startswith("track.num_examples=400, but the test split of digits has 359 "
                          "examples: sens/val is measured on all 359")
    assert "set track.num_examples=359 or less" in msg


def test_counts_larger_than_a_training_subset_are_said_for_each_measure():
    """data.train_subset=20 with track.num_examples=32 and track.eval_examples=500: sens/train
    on 20 images, train/acc on 20 and test/acc on 359, while config.json said 32 and 500."""
    with pytest.warns(UserWarning) as said:
        t = _tracker(["data.train_subset=20", "track.num_examples=32",
                      "track.eval_examples=500"])
    assert (len(t.sens_train), len(t.eval_train), len(t.eval_test)) == (20, 20, 359)
    msgs = [str(w.message) for w in said]
    assert len(msgs) == 3, msgs
    assert msgs[0].startswith("track.num_examples=32, but the train split of digits "
                              "(data.train_subset=20) has 20 examples: sens/train is measured "
                              "on all 20")
    assert msgs[1].startswith("track.eval_examples=500, but the train split of digits "
                              "(data.train_subset=20) has 20 examples: train/loss and train/acc "
                              "are measured on all 20")
    assert msgs[2].startswith("track.eval_examples=500, but the test split of digits has 359 "
                              "examples: test/loss and test/acc are measured on all 359")


def test_only_the_first_rank_says_it():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t = _tracker(["track.num_examples=400", "track.val=true"], shard=(1, 2))
    assert len(t.sens_val) == 359  # the same subset on every rank
    with pytest.warns(UserWarning, match="sens/val is measured on all 359"):
        _tracker(["track.num_examples=400", "track.val=true"], shard=(0, 2))


@pytest.mark.parametrize("model", [[], TINY_VIT, TINY_CONVMIXER],
                         ids=["mlp", "dropout", "batchnorm"])
def test_measuring_leaves_the_model_and_the_training_rng_alone(model: list[str]):
    """Every evaluation measures the same examples with the same noise, in eval mode: two
    evaluations of one model give the same record, and the weights, the BatchNorm statistics,
    the train mode and the global RNG (dropout's) are as they were, so that tracking cannot
    change the model training goes on with."""
    t = _tracker([*model, "track.num_examples=8", "track.eval_examples=32", "track.val=true",
                  "track.sigma=10", "track.sharpness=true", "track.loss_sharpness=true"])
    t.model.train()
    before = {k: v.clone() for k, v in t.model.state_dict().items()}
    rng = torch.get_rng_state()
    first, second = t.measure("ce"), t.measure("ce")
    assert first == second
    if model is not TINY_VIT:  # the untrained ViT flips nothing; these do, at random noise
        assert 0 < first["sens/train"] < 1 and 0 < first["sens/val"] < 1
    assert {"sens/train", "sens/val", "sharpness/shop", "sharpness/loss"} <= set(first)
    assert t.model.training
    assert all(torch.equal(before[k], v) for k, v in t.model.state_dict().items())
    assert torch.equal(rng, torch.get_rng_state())


def test_experiment_trainers_warn_of_fewer_sensitivity_examples(tmp_path) -> None:
    """grokking and sparse_frequent cut ``sens_examples`` to the training set without a word
    while config.json kept the count asked for."""
    import dataclasses

    from senslab.train.loops.grokking import example as grokking_example
    from senslab.train.loops.grokking import train_grokking
    from senslab.train.loops.sparse_frequent import example as frequent_example
    from senslab.train.loops.sparse_frequent import train_sparse_frequent

    for example, train in ((grokking_example, train_grokking),
                           (frequent_example, train_sparse_frequent)):
        cfg = dataclasses.replace(example(), epochs=1, eval_every=1, sens_examples=100_000)
        with pytest.warns(UserWarning, match=r"sens_examples=100000, but the training set has "
                                             r"[\d,]+ examples: sens/train is measured on all"):
            train(cfg, tmp_path / train.__name__, progress=False)
