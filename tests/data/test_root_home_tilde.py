"""A data root or ``$SENSLAB_DATA`` that starts with ``~`` is the home folder, as a shell reads it:
``--set data.root=~/x`` and a quoted ``SENSLAB_DATA="~/data"`` reach senslab unexpanded, and were
looked for (or downloaded into) ``./~/x`` in the working directory."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from senslab.data import DataUnavailableError, create_dataset, locate
from senslab.data import _roots as roots
from senslab.train.config import RunConfig, apply_overrides
from senslab.train.loop import locate_data


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SENSLAB_DATA", raising=False)
    monkeypatch.chdir(tmp_path)  # where ./~ would have been made
    return home


def test_a_root_under_the_home_folder_is_found_and_loaded(
        home: Path, tmp_path: Path, idx_dataset: Callable[..., Path]) -> None:
    idx_dataset(home / "mine", 20, 5)
    assert locate("fashion_mnist", "~/mine") == roots.Location(home / "mine", "root")
    assert len(create_dataset("fashion_mnist", split="test", root="~/mine")) == 5
    # the config records the folder read, not the unexpanded text
    cfg = apply_overrides(RunConfig(), ["data.name=fashion_mnist", "data.root=~/mine"])
    locate_data(cfg)
    assert cfg.data.root == str(home / "mine")
    assert not (tmp_path / "~").exists()


def test_a_download_goes_under_the_home_folder_not_into_a_folder_named_tilde(home: Path) -> None:
    assert locate("fashion_mnist", "~/fresh", download=True) == roots.Location(
        home / "fresh", "root")


def test_a_missing_root_under_the_home_folder_is_named_expanded(home: Path) -> None:
    with pytest.raises(DataUnavailableError) as err:
        locate("fashion_mnist", "~/nothing")
    assert str(home / "nothing") in str(err.value)


def test_senslab_data_starting_with_tilde_is_the_home_folder(
        home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        idx_dataset: Callable[..., Path]) -> None:
    monkeypatch.setenv("SENSLAB_DATA", "~/data")
    idx_dataset(home / "data" / "fashion_mnist", 20, 7)
    assert locate("fashion_mnist") == roots.Location(
        home / "data" / "fashion_mnist", "data home")
    assert len(create_dataset("fashion_mnist", split="test")) == 7
    assert not (tmp_path / "~").exists()
