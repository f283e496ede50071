"""A run recorded at ``<sha>+unknown`` (git status failed when a sitting started) and resumed
or reused at ``<sha>`` is not said to be another commit's: the warning says the difference
cannot be determined."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from senslab.train._provenance import check_reused, write_env
from senslab.train.rundir import RunDir, git_commit

SHA = "0123456789abcdef0123456789abcdef01234567"


def _recorded(path: Path, commit: str) -> RunDir:
    rd = RunDir(path)
    rd.write_json("env.json", {"git_commit": commit, "sittings": [
        {"git_commit": commit, "senslab": "x", "started": "t", "from_step": None}]})
    return rd


@pytest.mark.parametrize(("recorded", "now"), [(SHA + "+unknown", SHA), (SHA, SHA + "+unknown")])
def test_a_resume_across_an_unknown_commit_claims_no_other_commit(
        tmp_path: Path, recorded: str, now: str) -> None:
    rd = _recorded(tmp_path / "r", recorded)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        write_env(rd, {"git_commit": now}, step=4)
    said = [str(w.message) for w in caught]
    assert len(said) == 1 and "cannot be determined" in said[0], said
    assert "but it was trained by commit" not in said[0]
    assert [s["git_commit"] for s in rd.read_json("env.json")["sittings"]] == [recorded, now]


def test_another_sha_is_still_another_commit(tmp_path: Path) -> None:
    rd = _recorded(tmp_path / "r", "f" * 40 + "+unknown")
    with pytest.warns(UserWarning, match=r"but it was trained by commit ffffffffff\+unknown"):
        write_env(rd, {"git_commit": SHA}, step=4)


def test_reusing_a_run_recorded_at_an_unknown_commit(tmp_path: Path) -> None:
    now = git_commit()
    if now is None:
        pytest.skip("not a git checkout of senslab: no commit to compare")
    sha, _, mark = now.partition("+")
    recorded = sha if mark == "unknown" else sha + "+unknown"
    _recorded(tmp_path / "r", recorded)
    with pytest.warns(UserWarning, match="cannot be determined") as caught:
        check_reused(tmp_path / "r")
    assert not any("not by this commit" in str(w.message) for w in caught)
