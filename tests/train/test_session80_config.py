"""`--set` of a list of names written with the brackets of a list and its names unquoted
(`functions=[parity,majority]`): read as the names '[parity' and 'majority]' before, which the
field then refused as unknown functions, naming no syntax."""

import pytest

from senslab.experiments import get_experiment
from senslab.train.config import RunConfig, apply_overrides


@pytest.mark.parametrize("written", ["[parity,majority]", "[parity, majority]",
                                     "[parity, 'majority']", "parity,majority",
                                     "['parity', 'majority']", "(parity,majority)"])
def test_a_bracketed_list_of_names_reads_as_the_names(written: str) -> None:
    settings, runs = get_experiment("hr_norm_vs_blowup").resolve("cpu", [f"functions={written}"])
    assert settings.functions == ("parity", "majority")
    assert {r.config.function for r in runs} == {"parity", "majority"}


def test_a_run_configs_list_of_names_too() -> None:
    cfg = apply_overrides(RunConfig(), ["track.report_to=[tensorboard]"])
    assert cfg.track.report_to == ["tensorboard"]


def test_an_unknown_name_in_brackets_is_named_without_its_bracket() -> None:
    with pytest.raises(ValueError, match=r"\['parit'\]"):
        get_experiment("hr_norm_vs_blowup").resolve("cpu", ["functions=[parit,majority]"])
