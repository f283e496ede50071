"""Documented examples no other test runs, run as written (placeholders filled in where a block
has ``...``), and what the text around them promises:

- docs/experiments.md's experiment spec judges every seed at its own CPU scale (it declared
  three seeds without ``seed_aware``, so its verdict was never called: "not comparable"), and its
  runs follow the seed-naming rule the page states;
- docs/experiments.md's trainer hands ``LoopRun`` the dataclass, so a field added later, left at
  its default, keeps a recorded run (``dataclasses.asdict(cfg)`` lost the defaults: refused);
- docs/compatibility.md's "Not used" torch APIs are not used in ``src/senslab``;
- README's "Measure your own model in three lines" and its ``compare_sensitivity`` block print
  what their comments show;
- docs/integrations.md's "Regularize in your own loop" blocks, on a small BERT and a zoo model.

The other documents' blocks are run elsewhere (tests/test_session79_docs.py lists where)."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
BLOCK = re.compile(r"^ *```python\n(.*?)^ *```", re.S | re.M)


def section(path: Path, heading: str) -> str:
    """The text under the ``## heading`` of a Markdown file, up to the next ``## ``."""
    text = path.read_text(encoding="utf-8")
    assert f"\n## {heading}\n" in text, f"{path.name} has no '## {heading}' section"
    return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def blocks(path: Path, heading: str) -> list[str]:
    """The python blocks of a section, dedented by their fence's indentation."""
    out = []
    for m in BLOCK.finditer(section(path, heading)):
        indent = len(m.group(0)) - len(m.group(0).lstrip(" "))
        out.append("\n".join(line[indent:] for line in m.group(1).splitlines()) + "\n")
    return out


def fill(code: str, edits: list[tuple[str, str]]) -> str:
    """``code`` with each placeholder line replaced (each must be there: the block drifted
    otherwise)."""
    for old, new in edits:
        assert old in code, f"the block no longer has {old!r}"
        code = code.replace(old, new)
    return code


# --------------------------------------------------------------------------- experiments.md
#: a tiny Boolean transformer on 5 bits: the settings' own fields first, then run fields
TINY = ["steps=40", "n=5", "eval_every=20", "eval_size=32", "sharp_draws=2", "dim=8", "batch=32",
        "device=cpu"]


@pytest.fixture
def own_registries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Registrations made by a test are undone after it (the trainers' modules loaded first, so
    they stay registered)."""
    from senslab.experiments.base import EXPERIMENTS
    from senslab.train.trainers import TRAINERS, list_trainers

    list_trainers()
    monkeypatch.setattr(EXPERIMENTS, "_entries", dict(EXPERIMENTS._entries))
    monkeypatch.setattr(TRAINERS, "_entries", dict(TRAINERS._entries))


@pytest.mark.usefixtures("own_registries")
def test_the_experiment_block_judges_every_seed_at_its_own_scale(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch):
    from senslab.experiments.base import run_experiment

    code = blocks(DOCS / "experiments.md", "The shape of an experiment")[0]
    scope: dict[str, Any] = {}
    exec(compile(code, "docs/experiments.md", "exec"), scope)  # noqa: S102
    exp = scope["MyFigure"]()
    with pytest.raises(ValueError, match="n must be ≥ 1"):  # "`--set n=0` is refused"
        exp.settings("cpu", ["n=0"])

    judged: list[list[dict]] = []

    def verdict(self: Any, summaries: list[dict]) -> dict:  # the block's own is "..."
        judged.append(summaries)
        return {"verdict": "inconclusive", "reason": "a test", "evidence": {}, "effects": {}}

    monkeypatch.setattr(scope["MyFigure"], "verdict", verdict)
    out = tmp_path / "my_figure"
    got = run_experiment("my_figure", out, overrides=TINY, progress=False, log=lambda _: None)
    assert got["verdict"] == "inconclusive", got["reason"]  # not "not comparable": 3 seeds
    assert len(judged) == 1 and len(judged[0]) == 3
    assert {s["label"] for s in judged[0]} == {"parity"}
    # "Seed 0 keeps the plain run name"
    assert json.loads((out / "experiment.json").read_text())["runs"] == [
        "parity", "parity-s1", "parity-s2"]
    # the files' keys as docs/run-directory.md lists them (the verdict's own parts aside)
    listed = exp_dir_keys()
    assert set(json.loads((out / "experiment.json").read_text())) == listed["experiment.json"]
    written = set(json.loads((out / "verdict.json").read_text()))
    assert written <= listed["verdict.json"], written - listed["verdict.json"]
    assert listed["verdict.json"] - written <= {"effects", "correction", "effect", "interval"}


def exp_dir_keys() -> dict[str, set[str]]:
    """The JSON keys docs/run-directory.md shows for each file of an experiment directory."""
    listing = section(DOCS / "run-directory.md", "Experiment directories").split("```")[1]
    keys: dict[str, set[str]] = {}
    name = None
    for line in listing.splitlines():
        if m := re.match(r"^  (\S+\.json)\s", line):
            name = m.group(1)
        elif re.match(r"^  \S", line):
            name = None
        if name:
            keys.setdefault(name, set()).update(re.findall(r'"(\w+)":', line))
    assert {"experiment.json", "verdict.json"} <= set(keys), keys
    return keys


def _trainer_code() -> str:
    code = blocks(DOCS / "experiments.md", "Trainers")[0]
    return fill(code, [
        ("        ...                                  # model, optimizer, generators; load "
         "`state`\n",
         "        start, w = (0, 0.0) if state is None else (state['step'], float(state['w']))\n"),
        ("        for step in ...:\n            ...\n",
         "        for step in range(start + 1, cfg.steps + 1):\n"
         "            w += 1.0\n"
         "            record = {'step': step, 'epoch': float(step), 'w': w}\n"),
        ('run.checkpoint(step, {"model": ..., "optimizer": ..., "rng": ...})',
         "run.checkpoint(step, {'w': torch.tensor(w)})"),
        ('run.finish({"label": ..., ', "run.finish({'label': 'mine', "),
    ])


@dataclasses.dataclass
class MyRunConfig:
    steps: int = 200


@dataclasses.dataclass
class MyRunConfigLater:
    """MyRunConfig with a field added after runs were recorded."""

    steps: int = 200
    lr: float = 0.1


@pytest.mark.usefixtures("own_registries")
def test_the_trainer_block_reuses_its_runs_and_keeps_them_across_an_added_field(tmp_path: Path):
    from senslab.train.trainers import get_trainer

    scope: dict[str, Any] = {"MyRunConfig": MyRunConfig, "Path": Path, "torch": torch}
    exec(compile(_trainer_code(), "docs/experiments.md", "exec"), scope)  # noqa: S102
    train, path = scope["train"], tmp_path / "run"
    first = train(MyRunConfig(steps=6), path, log=lambda _: None)
    assert first["final"]["step"] == 6 and first["final"]["w"] == 6.0
    log = (path / "metrics.jsonl").read_text()
    assert len(log.splitlines()) == 6
    assert train(MyRunConfig(steps=6), path) == first  # reused, not trained again
    assert (path / "metrics.jsonl").read_text() == log
    # registered with check_dir: another configuration is refused before anything is written
    with pytest.raises(Exception, match="different configuration"):
        get_trainer("my_loop").check_dir(MyRunConfig(steps=7), path)
    # a field added later, at its default, is no difference (docs/run-directory.md)
    assert train(MyRunConfigLater(steps=6), path) == first


# --------------------------------------------------------------------------- compatibility.md
#: each torch API the page says is not used, and how its use would read in the source
NOT_USED = {
    "torch.nn.attention": r"\bnn\.attention\b|torch\.nn import attention",
    "torch.func": r"\btorch\.func\b|from torch import func\b",
    "torch.library": r"\btorch\.library\b",
    "torch.utils.flop_counter": r"\bflop_counter\b",
    "torch.get_default_device": r"\bget_default_device\b",
    "nn.Buffer": r"\bnn\.Buffer\b",
    "nn.RMSNorm": r"\bRMSNorm\b",
    "with_kwargs=": r"\bwith_kwargs\s*=",
}


def test_the_torch_apis_said_not_used_are_not_used():
    text = (DOCS / "compatibility.md").read_text(encoding="utf-8")
    m = re.search(r"^Not used \(so they set no floor\):(.*?)\n\n", text, re.S | re.M)
    assert m, "docs/compatibility.md: no 'Not used (so they set no floor):' paragraph"
    named = set(re.findall(r"`([^`]+)`", m.group(1)))
    assert named <= set(NOT_USED), f"add a pattern here for {sorted(named - set(NOT_USED))}"
    sources = {p: p.read_text(encoding="utf-8") for p in (ROOT / "src" / "senslab").rglob("*.py")}
    used = [f"{name}: {p.relative_to(ROOT)}" for name in sorted(named)
            for p, src in sources.items() if re.search(NOT_USED[name], src)]
    assert not used, "docs/compatibility.md says these are not used:\n" + "\n".join(used)


# --------------------------------------------------------------------------- README.md
def _number_pattern(comment: str) -> re.Pattern[str]:
    """The printed line a comment shows: its numbers any numbers, its "..." anything."""
    parts = re.split(r"(\d[\d,]*(?:\.\d+)?|\.\.\.)", comment.strip())
    out = "".join(".*" if p == "..." else r"[+-]?\d[\d,]*(?:\.\d+)?" if p and p[0].isdigit()
                  else re.escape(p) for p in parts)
    return re.compile(out)


def _small_classifier(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.Tanh(), nn.Linear(16, 3)).eval()


def _run_printing(code: str, scope: dict[str, Any]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), scope)  # noqa: S102
    return out.getvalue()


@pytest.mark.filterwarnings("ignore:.*the standard error rests on")
def test_the_readme_three_lines_print_what_their_comment_shows():
    code = blocks(ROOT / "README.md", "Measure your own model in three lines")[0]
    comment = code.rsplit("# ", 1)[1]
    images = torch.randn(16, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    printed = _run_printing(code, {"model": _small_classifier(0), "images": images * 3})
    assert _number_pattern(comment).fullmatch(printed.strip()), (printed, comment)


@pytest.mark.filterwarnings("ignore:.*the standard error rests on")
@pytest.mark.filterwarnings("ignore:.*no copy")
def test_the_readme_comparison_prints_the_paired_difference():
    found = [b for b in blocks(ROOT / "README.md", "Measure your own model in three lines")
             if "compare_sensitivity" in b]
    assert len(found) == 1, "README: the compare_sensitivity block is gone or doubled"
    images = torch.randn(16, 1, 8, 8, generator=torch.Generator().manual_seed(1)) * 3
    printed = _run_printing(found[0], {"base": _small_classifier(0),
                                       "reg": _small_classifier(1), "images": images})
    # the comment: "regularized − base: estimate ± paired s.e. (95% CI …)"
    assert re.fullmatch(r"regularized − base: [+-]\d\.\d+ ± \d\.\d+ paired \(95% CI .*\)\n",
                        printed), printed


# --------------------------------------------------------------------------- integrations.md
def test_the_regularizer_blocks_run_and_mix_the_losses_as_written():
    transformers = pytest.importorskip("transformers")
    import torch.nn.functional as F

    from senslab.models import create_model
    from senslab.tokens import Embedding

    code, penalty_code = blocks(DOCS / "integrations.md", "Regularize in your own loop")
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=24, max_position_embeddings=32))
    g = torch.Generator().manual_seed(1)
    mask = torch.ones(4, 7, dtype=torch.long)
    mask[0, 5:] = 0
    loader = [{"input_ids": torch.randint(5, 40, (4, 7), generator=g), "attention_mask": mask,
               "labels": torch.tensor([0, 1, 0, 1])}]
    before = [p.detach().clone() for p in model.parameters()]
    scope = {"loader": loader, "model": model,
             "opt": torch.optim.SGD(model.parameters(), lr=0.1)}
    exec(compile(code, "docs/integrations.md", "exec"), scope)  # noqa: S102
    parts = scope["parts"]
    assert set(parts) == {"loss", "task", "mse"}
    assert all(not v.requires_grad for v in parts.values())  # "detached … for logging"
    assert torch.allclose(parts["loss"], 0.5 * parts["task"] + 0.5 * parts["mse"])  # alpha=0.5
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))

    zoo = create_model("roberta", dim=16, layers=1, heads=2, vocab_size=50, max_len=16)
    batch = torch.randint(3, 50, (4, 10), generator=g)
    labels = torch.tensor([0, 1, 0, 1])
    scope = {"model": zoo, "batch": batch, "labels": labels, "Embedding": Embedding,
             "gen": torch.Generator().manual_seed(0), "my_loss": F.cross_entropy}
    exec(compile(penalty_code, "docs/integrations.md", "exec"), scope)  # noqa: S102
    penalty, logits = scope["penalty"], scope["logits"]
    assert penalty.ndim == 0 and penalty.requires_grad and penalty >= 0
    assert logits.shape == (4, 2) and logits.requires_grad  # the clean output, (B, classes)
    assert torch.allclose(scope["loss"], F.cross_entropy(logits, labels) + 0.1 * penalty)
