"""Audit of session 75: a run directory of another trainer given as ``--out`` was refused as "a
run with a different configuration (differs in batch_size, case, epochs, …)", which read as a
changed configuration of the same kind of run; the refusal now names the trainer (and the
experiment) the run belongs to, as ``measure --checkpoint`` does."""

from __future__ import annotations

from pathlib import Path

import pytest

from senslab.train.trainers import get_trainer, train_run


def trained(name: str, path: Path) -> Path:
    trainer = get_trainer(name)
    assert trainer.example is not None
    train_run(name, trainer.example(), path, progress=False, log=lambda _: None)
    return path


def test_fit_into_a_run_of_another_trainer_names_it(tmp_path: Path):
    run = trained("sparse_parity", tmp_path / "parity")
    with pytest.raises(ValueError, match=r"holds a run of the 'sparse_parity' trainer, not of "
                                         r"`senslab train` \(trainer 'fit'\)"):
        train_run("fit", get_trainer("fit").example(), run, progress=False, log=lambda _: None)


def test_another_trainer_into_a_fit_run_names_it(tmp_path: Path):
    run = trained("fit", tmp_path / "fit")
    with pytest.raises(ValueError, match=r"holds a run of the 'fit' trainer, so its "
                                         r"configuration differs"):
        train_run("sparse_parity", get_trainer("sparse_parity").example(), run, progress=False,
                  log=lambda _: None)


def test_the_same_trainer_with_other_settings_says_only_the_differences(tmp_path: Path):
    import dataclasses

    run = trained("sparse_parity", tmp_path / "parity")
    other = get_trainer("sparse_parity").example()
    field = next(f.name for f in dataclasses.fields(other) if f.name == "seed")
    other = dataclasses.replace(other, **{field: getattr(other, field) + 1})
    with pytest.raises(ValueError, match=r"holds a run with a different configuration "
                                         r"\(differs in seed\)"):
        train_run("sparse_parity", other, run, progress=False, log=lambda _: None)
