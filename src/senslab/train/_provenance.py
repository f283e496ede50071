"""Which code trained a run: every sitting's commit, kept across resumes.

env.json describes the sitting that last trained a run (versions, commit, device); a run resumed
after a kill is trained in several sittings, possibly by different code. Each write of env.json
therefore carries the earlier sittings forward in ``"sittings"`` (commit, senslab version, start
time, the step it started from), and a run resumed or reused by another commit than the one that
trained it says so: its metrics, or its whole result, come from that code. The experiment's
verdict lists the commits behind its runs (``run_commits``).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

from .rundir import RunDir, commit_relation, git_commit


def _sittings(old: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The sittings an env.json records (one written before sittings were kept: itself)."""
    if not isinstance(old, dict):
        return []
    kept = old.get("sittings")
    if isinstance(kept, list):
        return [s for s in kept if isinstance(s, dict)]
    return [{"git_commit": old.get("git_commit"), "senslab": old.get("senslab"),
             "started": old.get("started"), "from_step": None}]


def _read_env(path: Path) -> dict[str, Any] | None:
    try:
        env = json.loads((path / "env.json").read_text())
    except (OSError, ValueError):
        return None
    return env if isinstance(env, dict) else None


def commits_of(path: str | Path) -> list[str]:
    """The commits that trained the run at ``path`` (every sitting's; none recorded: [])."""
    seen: list[str] = []
    for s in _sittings(_read_env(Path(path))):
        c = s.get("git_commit")
        if isinstance(c, str) and c and c not in seen:
            seen.append(c)
    return seen


def _other(commits: list[str], now: str | None, how: str = "other") -> list[str]:
    """The ``commits`` whose :func:`~senslab.train.rundir.commit_relation` to ``now`` is
    ``how``: ``"other"`` (other code) or ``"unknown"`` (the same commit, one of the two
    ``+unknown``: whether the code differs cannot be told)."""
    return [c for c in commits if now is not None and commit_relation(c, now) == how]


def _unknown_note(commits: list[str], now: str | None) -> str:
    """A sentence for a run trained by the same commit as ``now`` where one of the two was
    recorded ``+unknown``; "" when there is none."""
    unknown = _other(commits, now, "unknown")
    if not unknown:
        return ""
    return (f"it was trained by commit {', '.join(_short(c) for c in unknown)} and this is "
            f"{_short(now)}: the same commit, but git status failed when one of the two "
            "started (+unknown), so whether src/ was edited in between cannot be determined")


#: what a sitting's numbers depend on beyond the seed and the code (:func:`_setup`)
SETUP = ("torch", "device", "threads", "cuda")


def _setup(env: dict[str, Any]) -> dict[str, Any]:
    """The setup ``env`` records: torch version, device, thread count and, on a GPU, its model
    (``cuda``: on another GPU model the kernels round differently; on the CPU it names a GPU
    the run did not use, so it is left out)."""
    out = {k: env[k] for k in SETUP[:3] if k in env}
    if str(env.get("device", "")).startswith("cuda") and "cuda" in env:
        out["cuda"] = env["cuda"]
    return out


def _writer(earlier: list[dict[str, Any]], step: int) -> dict[str, Any] | None:
    """The sitting that wrote the checkpoint of ``step``: the last to start before it (a sitting
    that stopped before its first checkpoint, or whose checkpoints a resume fell back past,
    trained nothing the run keeps)."""
    for s in reversed(earlier):
        start = s.get("from_step")
        if not isinstance(start, int) or isinstance(start, bool) or start < step:
            return s
    return None


def write_env(rd: RunDir, env: dict[str, Any], step: int | None, warn: bool = True) -> None:
    """Write env.json for a sitting that starts at ``step`` (None: a fresh run), keeping the
    earlier sittings of a resumed run (each with its setup), and warn (``warn``: one rank of
    several says it) when the checkpoint resumed from was trained on another setup, or the run
    by other code."""
    old = _read_env(rd.path) if step is not None else None
    earlier = _sittings(old)
    if old is not None and warn:
        # the same seed gives the same numbers only on the same torch, device, thread count and
        # GPU model: float32 reductions split across other threads round differently, and
        # training amplifies the last bits, so the metrics after the resume are not the
        # uninterrupted run's. Compared with the sitting that wrote the checkpoint: env.json's
        # top level is the last sitting's, which may have stopped (and been warned) before it
        # wrote one; an earlier writer's setup is the one its sitting recorded
        writer = _writer(earlier, step) if step is not None else None
        kept = (writer or {}).get("setup")
        before = (kept if isinstance(kept, dict) and writer is not earlier[-1]
                  else _setup(old))
        now = _setup(env)
        moved = [f"{key} {before[key]} → {now.get(key)}" for key in SETUP
                 if key in before and key in now and before[key] != now[key]]
        if moved:
            warnings.warn(
                f"resuming {rd.path} at step {step} on another setup than the sitting before "
                f"({', '.join(moved)}): its numbers from step {step} on may differ from an "
                "uninterrupted run's (reductions round differently, and training amplifies "
                "it). Resume with the earlier setup (e.g. the same --threads) to keep them",
                UserWarning, stacklevel=3)
    commits = [s["git_commit"] for s in earlier if isinstance(s.get("git_commit"), str)]
    other = _other(commits, env.get("git_commit"))
    if other and warn:
        warnings.warn(
            f"resuming {rd.path} at step {step} with commit {_short(env.get('git_commit'))}, "
            f"but it was trained by commit {', '.join(_short(c) for c in other)}: its metrics "
            f"up to step {step} come from that code. Delete the run directory to train it "
            "again with this code alone", UserWarning, stacklevel=3)
    elif (note := _unknown_note(commits, env.get("git_commit"))) and warn:
        warnings.warn(f"resuming {rd.path} at step {step}: {note}", UserWarning, stacklevel=3)
    sitting = {"git_commit": env.get("git_commit"), "senslab": env.get("senslab"),
               "started": env.get("started"), "from_step": step, "setup": _setup(env)}
    rd.write_json("env.json", {**env, "sittings": [*earlier, sitting]})


def check_reused(path: str | Path) -> None:
    """Warn when a finished run about to be reused was trained by another commit than this
    one (its result is that code's)."""
    now = git_commit()
    other = _other(commits_of(path), now)
    if other:
        warnings.warn(
            f"reusing the finished run {path}, trained by commit "
            f"{', '.join(_short(c) for c in other)}, not by this commit "
            f"({_short(now)}): its numbers are that code's. Delete the run directory "
            "to train it again with this code", UserWarning, stacklevel=3)
    elif note := _unknown_note(commits_of(path), now):
        warnings.warn(f"reusing the finished run {path}: {note}", UserWarning, stacklevel=3)


def _short(commit: str | None) -> str:
    if not commit:
        return "unknown"
    sha, plus, mark = commit.partition("+")
    return sha[:10] + plus + mark
