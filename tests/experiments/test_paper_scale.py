"""The paper-scale path of every experiment, exercised here so that it cannot rot (issue 17).

* ``test_paper_scale_models_and_optimizers_build`` (fast): for every registered experiment,
  ``resolve("paper", [])``, then for every distinct model/optimiser configuration among its runs
  the model and optimiser (and scheduler) built exactly as its trainer builds them, on a
  stand-in dataset of the real data's shape; one forward pass, the parameter count compared
  with the cpu-scale run of the same name, the optimiser's type, learning rate and parameters
  compared with the configuration.
* ``test_paper_scale_runs_train_a_few_steps`` (slow): every paper-scale run of every experiment
  (seed replicates dropped with ``seeds=1``; of the Boolean-transformer runs one per function,
  data mode and sensitivity method: :func:`representatives`), a few steps through its registered
  trainer into a temporary directory, on small stand-in files in the real formats where the real
  data is not available here; overrides go through ``resolve("paper", [...])``, like
  ``senslab run``'s.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from senslab import optim as so
from senslab.data import ArrayDataset
from senslab.experiments import get_experiment, list_experiments
from senslab.experiments.base import Run
from senslab.models import create_model
from senslab.train.config import RunConfig
from senslab.train.loop import build_model, build_optimizer, build_scheduler
from senslab.train.loops import attention as attention_loop
from senslab.train.loops.boolean import BooleanRunConfig
from senslab.train.loops.grokking import GrokkingRun, grokking_model
from senslab.train.loops.pretrained import PretrainedConfig
from senslab.train.loops.sparse_frequent import SparseFrequentRun
from senslab.train.loops.sparse_parity import SparseParityRun
from senslab.train.steps import forward
from senslab.train.trainers import get_trainer

EXPERIMENTS = list_experiments()
HAS_TIMM = importlib.util.find_spec("timm") is not None

# -- stand-in data of the real shapes (fast test) -----------------------------------------------

#: (channels, side, classes) of every image dataset a fit run may name
IMAGE_SHAPES = {"cifar10": (3, 32, 10), "svhn": (3, 32, 10), "mnist": (1, 28, 10),
                "fashion_mnist": (1, 28, 10), "digits": (1, 8, 10)}
#: text datasets: (classes, the loaders' default vocabulary size and max_len)
TEXT_DATA = {"mrpc": 2, "qqp": 2, "sst2": 2, "rotten_tomatoes": 2}


def stand_in(data: Any) -> ArrayDataset:
    """Two examples shaped like ``data``'s dataset (a :class:`DataConfig`), with the meta the
    model builder reads: images (N, C, H, W), text ``input_ids``/``attention_mask``."""
    gen = torch.Generator().manual_seed(0)
    if data.name in IMAGE_SHAPES:
        channels, side, classes = IMAGE_SHAPES[data.name]
        digits = data.options.get("digits")
        classes = len(digits) if digits else classes
        x = torch.rand(2, channels, side, side, generator=gen) * 2 - 1
        return ArrayDataset(x, torch.tensor([0, 1]), num_classes=classes, name=data.name)
    if data.name in TEXT_DATA:
        max_len = data.options.get("max_len", 128)
        vocab = data.options.get("vocab_size", 8000)
        ids = torch.randint(4, vocab, (2, max_len), generator=gen)
        mask = torch.ones(2, max_len, dtype=torch.bool)
        mask[1, max_len // 2:] = False
        ids[~mask] = 1
        return ArrayDataset({"input_ids": ids, "attention_mask": mask}, torch.tensor([0, 1]),
                            num_classes=TEXT_DATA[data.name], name=data.name,
                            meta={"vocab_size": vocab, "pad_id": 1})
    raise AssertionError(f"no stand-in shape for dataset {data.name!r}: add it to IMAGE_SHAPES "
                         "or TEXT_DATA in this test")


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def optimizer_params(opt: torch.optim.Optimizer) -> int:
    return sum(p.numel() for g in opt.param_groups for p in g["params"])


FIT_OPTIMIZERS = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW,
                  "ngd": so.NGD, "sngd": so.NGD, "sps": so.SPS}


def build_fit(cfg: RunConfig) -> int:
    """The ``fit`` trainer's model (:func:`build_model`), optimiser and scheduler for ``cfg``,
    checked; returns the number of trained parameters."""
    data = stand_in(cfg.data)
    model = build_model(cfg, data)
    size = n_params(model)
    opt = build_optimizer(cfg, model)
    o = cfg.optim
    assert type(opt) is FIT_OPTIMIZERS[o.name], (o.name, type(opt))
    group = opt.param_groups[0]
    if o.name == "sps":
        assert group["eta_max"] == o.eta_max
    else:
        assert group["lr"] == o.lr
    if o.name in ("sgd", "adam", "adamw"):
        assert group["weight_decay"] == o.weight_decay
    assert optimizer_params(opt) == size
    sched = build_scheduler(cfg, opt)
    if o.schedule == "constant":
        assert sched is None
    elif o.schedule == "step":
        assert (sched.step_size, sched.gamma) == (o.step_epochs, o.gamma)
    else:
        assert sched.T_max == cfg.train.epochs
    model.eval()
    with torch.no_grad():
        out = forward(model, data.batch(slice(0, 2))[0])
    width = 1 if out.dim() == 1 else out.shape[1]
    assert out.shape[0] == 2 and width in (1, data.num_classes), (out.shape, data.num_classes)
    assert torch.isfinite(out).all()
    return size


def build_boolean(cfg: BooleanRunConfig) -> int:
    """The ``boolean`` trainer's transformer and AdamW (see train_boolean)."""
    model = create_model("boolean_transformer", n_bits=cfg.n, dim=cfg.dim, ff_dim=cfg.dim,
                         layers=cfg.layers, heads=cfg.heads, init=cfg.init, seed=cfg.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    x = torch.randint(0, 2, (3, cfg.n), generator=torch.Generator().manual_seed(0)).float() * 2 - 1
    with torch.no_grad():
        out = model(x)
    assert out.shape == (3,) and torch.isfinite(out).all()
    assert optimizer_params(opt) == n_params(model)
    return n_params(model)


def build_attention(cfg: attention_loop.AttentionConfig) -> int:
    """The ``attention`` trainer's task, model and optimiser (its own functions)."""
    task = attention_loop.load_task(**dataclasses.asdict(cfg.data))
    model = attention_loop.build_model(cfg, task)
    opt = attention_loop.make_optimizer(cfg, list(model.parameters()))
    kinds = {"sgd": torch.optim.SGD, "ngd": so.NGD, "polyak": so.Polyak, "sps": so.SPS,
             "adam": torch.optim.Adam}
    assert type(opt) is kinds[cfg.optimizer]
    if cfg.optimizer in ("sgd", "ngd", "adam"):
        assert opt.param_groups[0]["lr"] == cfg.lr
    if cfg.optimizer in ("ngd", "sps"):
        assert opt.param_groups[0]["eta_max"] == cfg.eta_max
    assert task.X.shape == (cfg.data.num_samples, cfg.data.seq_len, cfg.data.dim)
    with torch.no_grad():
        assert math.isfinite(float(attention_loop.logistic_loss(model, task)))
    return n_params(model)


def build_grokking(cfg: GrokkingRun) -> int:
    model = grokking_model(cfg)  # the trainer's own builder, with the paper code's structure
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay,
                            betas=(cfg.beta1, cfg.beta2))
    x = torch.tensor([[1, 2, cfg.p], [cfg.p - 1, 0, cfg.p]])
    with torch.no_grad():
        out = model(x)
    assert out.shape == (2, cfg.p + cfg.eq_logit) and opt.param_groups[0]["lr"] == cfg.lr
    return n_params(model)


def build_sparse_parity(cfg: SparseParityRun) -> int:
    mlp_dim = 4 * cfg.width if cfg.mlp_dim is None else cfg.mlp_dim
    model = create_model("parity_transformer", n_bits=cfg.n_bits, dim=cfg.width,
                         heads=cfg.heads, layers=cfg.layers, mlp_dim=mlp_dim, seed=cfg.seed)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    x = torch.randint(0, 2, (3, cfg.n_bits), generator=torch.Generator().manual_seed(0)) * 2 - 1
    with torch.no_grad():
        out = model(x.float())
    assert out.shape == (3, 2) and opt.param_groups[0]["lr"] == cfg.lr
    return n_params(model)


def build_sparse_frequent(cfg: SparseFrequentRun) -> int:
    from senslab.data.synthetic import SPARSE_FREQUENT_SETTINGS

    vocab = SPARSE_FREQUENT_SETTINGS[cfg.case, cfg.setting].vocab_size
    model = create_model("sparse_attention", dim=vocab, init_scale=cfg.init_scale, seed=cfg.seed)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    assert opt.param_groups[0]["lr"] == cfg.lr
    return n_params(model)


def build_pretrained(cfg: PretrainedConfig) -> int:
    if cfg.source == "timm":
        if not HAS_TIMM:
            pytest.skip(f"{cfg.name}: the timm model {cfg.model} needs the optional package "
                        "timm, which is not installed")
        import timm

        model = timm.create_model(cfg.model, pretrained=False)  # the weights are a download
    else:
        model = create_model(cfg.model, image_size=32, in_channels=3, num_classes=10)
    return sum(p.numel() for p in model.parameters())


BUILDERS: dict[str, Callable[[Any], int]] = {
    "fit": build_fit, "boolean": build_boolean, "attention": build_attention,
    "grokking": build_grokking, "sparse_parity": build_sparse_parity,
    "sparse_frequent": build_sparse_frequent, "pretrained": build_pretrained,
}
#: the configuration fields that do not change what a trainer builds
NOT_BUILT = {"name", "label", "seed", "function_seed", "data", "train", "track", "device",
             "steps", "epochs", "eval_every", "eval_size", "sharp_draws", "batch", "stop_below",
             "post_epochs", "per_decade", "sens_examples", "bool_samples", "test_size",
             "train_size", "root", "num_images", "num_tokens", "repeats", "batch_size"}


def build_key(run: Run) -> str:
    """What the trainer of ``run`` builds from: the fields of its configuration that shape the
    model and the optimiser (the data's shape for ``fit``, the whole task for ``attention``)."""
    d = dataclasses.asdict(run.config)
    if run.trainer == "fit":
        d = {"model": d["model"], "optim": d["optim"], "epochs": d["train"]["epochs"],
             "data": [d["data"]["name"], d["data"]["options"]]}
    elif run.trainer == "attention":
        d = {k: v for k, v in d.items() if k not in ("name", "label", "steps", "per_decade")}
    elif run.trainer == "boolean":
        # its AdamW takes lr and weight_decay as given: 2,000 sampled pairs would build the
        # same 88 transformers of hr_norm_vs_blowup again (20 s)
        d = {k: v for k, v in d.items() if k not in NOT_BUILT | {"lr", "weight_decay"}}
    else:
        d = {k: v for k, v in d.items() if k not in NOT_BUILT}
    return json.dumps([run.trainer, d], sort_keys=True)


_BUILT: dict[str, int] = {}  # build_key → parameters, shared by the experiments' cases


def built_size(run: Run) -> int:
    key = build_key(run)
    if key not in _BUILT:
        _BUILT[key] = BUILDERS[run.trainer](run.config)
    return _BUILT[key]


#: experiments whose cpu scale trains the paper's models themselves (they differ in data, steps,
#: sizes of the task or seeds): no paper-scale model is larger than the cpu one of its name, nor
#: the largest paper-scale model than the largest cpu-scale one
SAME_MODEL_AT_CPU = {"ib_fixed_v", "ib_joint", "imagenet", "synthetic_sparse_frequent"}


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_paper_scale_models_and_optimizers_build(name: str) -> None:
    exp = get_experiment(name)
    _, runs = exp.resolve("paper", [])
    assert runs, f"{name} has no paper-scale runs"
    cpu = {r.name: r for r in exp.resolve("cpu", [])[1]}
    larger = 0
    for run in runs:
        trainer = get_trainer(run.trainer)
        assert isinstance(run.config, trainer.config_type)
        size = built_size(run)
        assert size > 0
        if run.name in cpu and cpu[run.name].trainer == run.trainer:
            small = built_size(cpu[run.name])
            assert size >= small, f"{name}/{run.name}: paper {size} < cpu {small} parameters"
            larger += size > small
    biggest = max(built_size(r) for r in runs)
    biggest_cpu = max(built_size(r) for r in cpu.values())
    assert biggest >= biggest_cpu, f"{name}: the cpu scale has the larger model"
    larger += biggest > biggest_cpu
    if name in SAME_MODEL_AT_CPU:
        assert larger == 0, f"{name}: a paper model is larger than cpu's; update the set"
    else:  # the cpu scale shrinks at least one model
        assert larger > 0, f"{name}: no paper-scale model is larger than its cpu-scale run's"


# -- a few steps of every paper-scale run (slow) ------------------------------------------------

_WORDS = ("the company said its shares rose sharply on monday after a strong quarter while "
          "analysts expected lower profits and the market fell later that week in new york "
          "how do i learn to cook rice what is the best way to study for an exam").split()


def _sentence(rng: np.random.Generator) -> str:
    return " ".join(rng.choice(_WORDS, size=int(rng.integers(5, 12))))


def write_glue_pairs(root: Path, task: str, n_train: int = 24, n_dev: int = 8) -> Path:
    """GLUE's ``train.tsv``/``dev.tsv`` of MRPC (Quality, #1 ID, #2 ID, #1 String, #2 String;
    a UTF-8 BOM) or QQP (id, qid1, qid2, question1, question2, is_duplicate)."""
    rng = np.random.default_rng(0)
    root.mkdir(parents=True, exist_ok=True)
    for file, n in (("train.tsv", n_train), ("dev.tsv", n_dev)):
        if task == "mrpc":
            lines = ["\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String"]
        else:
            lines = ["id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate"]
        for i in range(n):
            a = _sentence(rng)
            b = a if i % 2 else _sentence(rng)
            if task == "mrpc":
                lines.append(f"{i % 2}\t{1000 + i}\t{2000 + i}\t{a}\t{b}")
            else:
                lines.append(f"{i}\t{2 * i}\t{2 * i + 1}\t{a}?\t{b}?\t{i % 2}")
        (root / file).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def write_sst2(root: Path, n_train: int = 24, n_dev: int = 8) -> Path:
    """GLUE's SST-2 ``train.tsv``/``dev.tsv``: a ``sentence<TAB>label`` header, one sentence a
    line."""
    rng = np.random.default_rng(0)
    root.mkdir(parents=True, exist_ok=True)
    for file, n in (("train.tsv", n_train), ("dev.tsv", n_dev)):
        lines = ["sentence\tlabel", *(f"{_sentence(rng)}\t{i % 2}" for i in range(n))]
        (root / file).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def write_svhn(root: Path, monkeypatch: pytest.MonkeyPatch, n_train: int = 40,
               n_test: int = 10) -> Path:
    """SVHN's ``train_32x32.mat``/``test_32x32.mat``: X (32, 32, 3, N) uint8, y (N, 1) in 1..10
    (10 is the digit 0); their md5s registered for this test only."""
    from scipy.io import savemat

    from senslab.data import images as im
    from senslab.data._download import md5sum

    rng = np.random.default_rng(0)
    root.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("test", n_test)):
        x = rng.integers(0, 256, (32, 32, 3, n), dtype=np.uint8)
        y = (np.arange(n) % 10 + 1).astype(np.uint8)[:, None]
        path = root / f"{split}_32x32.mat"
        savemat(path, {"X": x, "y": y})
        monkeypatch.setitem(im.SVHN_FILES, path.name, md5sum(path))
    return root


def write_images(root: Path, n: int = 4) -> Path:
    """ImageFolder-style PNGs in two WordNet-ID class folders (the ``pretrained`` trainer's)."""
    from PIL import Image

    for i in range(n):
        path = root / f"n0144{i % 2}764" / f"img{i}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (40, 30), (30 * i, 100, 200 - 20 * i)).save(path, "PNG")
    return root


@pytest.fixture
def stand_in_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cifar_tarball: Any,
                  idx_dataset: Any) -> Callable[[str], str | None]:
    """``root(dataset)``: a folder holding small files of ``dataset`` in its real format (None:
    the real data is installed here and is used)."""

    def root(name: str) -> str | None:
        path = tmp_path / "data" / name
        if name == "cifar10":
            cifar_tarball(path, 10)  # 50 training, 10 test images
        elif name == "svhn":
            write_svhn(path, monkeypatch)
        elif name == "fashion_mnist":
            idx_dataset(path, 40, 10)
        elif name in ("mrpc", "qqp"):
            write_glue_pairs(path, name)
        elif name == "sst2":
            write_sst2(path)
        elif name in ("mnist", "rotten_tomatoes", "digits"):
            return None  # installed with the package's dependencies
        else:
            raise AssertionError(f"no stand-in files for dataset {name!r}: add a writer")
        return str(path)

    return root


#: the overrides that shorten every run of a trainer to a few steps and a tiny evaluation (the
#: keys of the loop trainers are their experiments' settings fields)
FEW_STEPS = {
    "fit": ["train.max_steps=2", "track.num_examples=4", "track.eval_examples=8",
            "track.repeats=1", "train.keep_checkpoints=1", "device=cpu"],
    "boolean": ["steps=2", "eval_every=2", "eval_size=32", "sharp_draws=2", "device=cpu"],
    "attention": ["steps=2"],
    "grokking": ["epochs=2", "eval_every=1", "sens_examples=8"],
    "sparse_parity": ["epochs=1", "test_size=64", "bool_samples=32"],
    "sparse_frequent": ["epochs=1", "eval_every=1", "test_size=64", "sens_examples=8"],
    "pretrained": ["pretrained=false", "num_images=2", "batch_size=2", "num_tokens=2"],
}


def few_step_overrides(name: str, root: Callable[[str], str | None], tmp_path: Path
                       ) -> list[str]:
    """The overrides of ``senslab run NAME --scale paper`` that train each run for a few steps
    on stand-in data: one seed, :data:`FEW_STEPS` of its trainer, the data's root."""
    _, runs = get_experiment(name).resolve("paper", ["seeds=1"])
    trainers = {r.trainer for r in runs}
    assert len(trainers) == 1, f"{name}: several trainers {trainers}; give each its overrides"
    trainer = trainers.pop()
    sets = ["seeds=1", *FEW_STEPS[trainer]]
    if trainer == "fit":
        datasets = {r.config.data.name for r in runs}
        assert len(datasets) == 1, f"{name}: several datasets {datasets}; give each its root"
        folder = root(datasets.pop())
        if folder is not None:
            sets.append(f"data.root={folder}")
    if trainer == "pretrained":
        if not HAS_TIMM:
            pytest.skip(f"{name}: its paper-scale runs measure timm models, and the optional "
                        "package timm is not installed")
        sets.append(f"root={write_images(tmp_path / 'images')}")
    return sets


def representatives(runs: list[Run]) -> list[Run]:
    """``runs``, except for the ``boolean`` trainer: one run per function, data mode and
    sensitivity method (exact up to n = 12, sampled above), the smallest n of each. An
    evaluation's as(f̂) over n > 12 bits takes 2,000 × (n + 1) forward passes of a paper-size
    model, ~15-30 s on one busy thread: every run of the 103 paper-scale ones would take an hour,
    and the others differ only in n, the learning rate and the weight decay."""
    if not runs or runs[0].trainer != "boolean":
        return runs
    groups: dict[tuple[Any, ...], Run] = {}
    for run in sorted(runs, key=lambda r: r.config.n):
        c = run.config
        groups.setdefault((c.function, c.train_size is None, c.completion, c.n > 12), run)
    return list(groups.values())


@pytest.mark.slow
@pytest.mark.parametrize("name", EXPERIMENTS)
def test_paper_scale_runs_train_a_few_steps(name: str, tmp_path: Path,
                                            stand_in_data: Callable[[str], str | None]) -> None:
    exp = get_experiment(name)
    overrides = few_step_overrides(name, stand_in_data, tmp_path)
    _, runs = exp.resolve("paper", overrides)
    assert runs
    for run in representatives(runs):
        trainer = get_trainer(run.trainer)
        if trainer.check is not None:
            trainer.check(run.config)  # finds the data, as `senslab run` does before training
        path = tmp_path / "runs" / run.name
        summary = trainer.train(run.config, path, progress=False, log=lambda _: None)
        assert (path / "summary.json").exists(), f"{name}/{run.name} did not finish"
        assert json.loads((path / "summary.json").read_text()) == summary
        lines = (path / "metrics.jsonl").read_text().splitlines()
        last = json.loads(lines[-1])
        key = "sens/train" if run.trainer == "pretrained" else "train/loss"
        assert math.isfinite(last[key]), f"{name}/{run.name}: {key} = {last[key]}"
        if run.trainer == "fit":
            assert summary["steps"] == 2 and summary["final"]["train/loss"] == last["train/loss"]
