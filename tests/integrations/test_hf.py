"""Hugging Face SensitivityCallback: a real tiny ``Trainer`` run (random-init BERT, CPU,
``report_to="tensorboard"``) logs the subset's sensitivity to ``state.log_history`` and to the
TensorBoard event file, equal to ``token_sensitivity`` on the same subset and seed (no mocks)."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("tensorboard")
pytest.importorskip("accelerate")  # the Trainer needs it

from tensorboard.backend.event_processing.event_accumulator import (  # noqa: E402
    EventAccumulator,
)
from transformers import (  # noqa: E402
    BertConfig,
    BertForSequenceClassification,
    Trainer,
    TrainingArguments,
)

from senslab.integrations.hf import SensitivityCallback  # noqa: E402
from senslab.measure import token_sensitivity  # noqa: E402
from senslab.tokens import Embedding  # noqa: E402

TOKENS = "bert.embeddings.LayerNorm"


def tiny_bert() -> BertForSequenceClassification:
    torch.manual_seed(0)
    config = BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=16, num_labels=2)
    return BertForSequenceClassification(config)


class Texts(torch.utils.data.Dataset):
    """Right-padded random token sequences of lengths 3–8 with labels."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(1, 40, (n, 8), generator=g)
        lengths = torch.randint(3, 9, (n,), generator=g)
        self.mask = (torch.arange(8) < lengths[:, None]).long()
        self.ids = self.ids * self.mask
        self.labels = torch.randint(0, 2, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i],
                "labels": self.labels[i]}

    def batch(self, n: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[:n], "attention_mask": self.mask[:n],
                "labels": self.labels[:n]}


def arguments(out: Path, **extra) -> TrainingArguments:
    return TrainingArguments(
        output_dir=str(out), max_steps=extra.pop("max_steps", 4), per_device_train_batch_size=8,
        per_device_eval_batch_size=8, eval_strategy="steps", eval_steps=2, logging_steps=2,
        learning_rate=1e-2, save_strategy=extra.pop("save_strategy", "no"),
        report_to=extra.pop("report_to", "tensorboard"),
        use_cpu=True, disable_tqdm=True, seed=0, dataloader_num_workers=0, **extra)


def scalars(out: Path, tag: str) -> list[tuple[int, float]]:
    found = []
    for path in sorted(out.rglob("events.out.tfevents*")):
        acc = EventAccumulator(str(path))
        acc.Reload()
        if tag in acc.Tags()["scalars"]:
            found += [(e.step, e.value) for e in acc.Scalars(tag)]
    return found


def test_callback_logs_through_the_trainer_and_tensorboard(tmp_path: Path):
    train, val = Texts(32, 1), Texts(8, 2)
    subset = val.batch(6)
    model = tiny_bert()
    trainer = Trainer(model=model, args=arguments(tmp_path), train_dataset=train,
                      eval_dataset=val)
    callback = SensitivityCallback(subset, Embedding(TOKENS), sigma=2.0, repeats=2,
                                   generator=3).attach(trainer)
    trainer.train()

    logged = [(e["step"], e["eval_sensitivity"], e["eval_sensitivity_stderr"])
              for e in trainer.state.log_history if "eval_sensitivity" in e]
    assert [s for s, _, _ in logged] == [2, 4]
    inputs = {k: v for k, v in subset.items() if k != "labels"}
    ref = token_sensitivity(model, inputs, Embedding(TOKENS), sigma=2.0, repeats=2, generator=3)
    assert 0 < ref.estimate < 1  # not a degenerate value
    assert logged[-1][1] == ref.estimate and logged[-1][2] == ref.stderr
    assert callback.results[-1][0] == 4 and callback.results[-1][1].num_examples == 6

    events = scalars(tmp_path, "eval/sensitivity")
    assert [s for s, _ in events] == [2, 4]
    assert events[-1][1] == pytest.approx(ref.estimate, rel=1e-6)  # TensorBoard keeps float32
    assert [s for s, _ in scalars(tmp_path, "eval/sensitivity_stderr")] == [2, 4]

    metrics = trainer.evaluate()  # evaluate() returns it too
    assert metrics["eval_sensitivity"] == ref.estimate


def test_best_model_by_sensitivity_warns_where_the_most_sensitive_would_be_kept(tmp_path: Path):
    """transformers takes a larger value as better for a metric not ending in "loss": with
    metric_for_best_model naming the callback's metric and greater_is_better left at that
    default, load_best_model_at_end keeps the most sensitive checkpoint — the callback warns,
    on attach and at the start of training without attach; greater_is_better=False does not."""
    val = Texts(8, 2)
    best = {"metric_for_best_model": "eval_sensitivity", "save_strategy": "steps",
            "save_steps": 2, "load_best_model_at_end": True, "report_to": "none"}
    args = arguments(tmp_path / "a", **best)
    assert args.greater_is_better is True  # transformers' default for this name
    trainer = Trainer(model=tiny_bert(), args=args, train_dataset=val, eval_dataset=val)
    with pytest.warns(UserWarning, match="keeps the most sensitive checkpoint.*"
                                         "greater_is_better=False"):
        SensitivityCallback(val.batch(4), Embedding(TOKENS), sigma=2.0).attach(trainer)
    callback = SensitivityCallback(val.batch(4), Embedding(TOKENS), sigma=2.0, name="sens")
    trainer = Trainer(model=tiny_bert(), args=arguments(tmp_path / "b", **{
        **best, "metric_for_best_model": "sens"}), train_dataset=val, eval_dataset=val,
        callbacks=[callback])
    with pytest.warns(UserWarning, match="metric_for_best_model='sens'"):
        callback.on_train_begin(trainer.args, trainer.state, trainer.control)
    fine = arguments(tmp_path / "c", **best, greater_is_better=False)
    trainer = Trainer(model=tiny_bert(), args=fine, train_dataset=val, eval_dataset=val)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        SensitivityCallback(val.batch(4), Embedding(TOKENS), sigma=2.0).attach(trainer)


def test_early_stopping_on_sensitivity_sees_it(tmp_path: Path):
    """attach() puts the callback first, so an EarlyStoppingCallback on eval_sensitivity given
    to the Trainer reads the value in the same evaluation (before: it came first, found no
    eval_sensitivity, disabled itself, and training ran on). With a threshold no change can
    meet, training stops at the second evaluation."""
    from transformers import EarlyStoppingCallback

    val = Texts(8, 2)
    args = arguments(tmp_path, max_steps=8, metric_for_best_model="eval_sensitivity",
                     greater_is_better=False, save_strategy="steps", save_steps=2,
                     load_best_model_at_end=True, report_to="none")
    stop = EarlyStoppingCallback(early_stopping_patience=1, early_stopping_threshold=2.0)
    trainer = Trainer(model=tiny_bert(), args=args, train_dataset=Texts(32, 1),
                      eval_dataset=val, callbacks=[stop])
    callback = SensitivityCallback(val.batch(4), Embedding(TOKENS), sigma=2.0, repeats=1)
    callback.attach(trainer)
    assert trainer.callback_handler.callbacks[0] is callback
    trainer.train()
    assert [step for step, _ in callback.results] == [2, 4]
    assert trainer.state.global_step == 4


def test_a_left_padded_subset_is_refused_when_the_callback_is_made():
    val = Texts(4, 2).batch(4)
    val["attention_mask"] = val["attention_mask"].flip(1)  # left padding
    with pytest.raises(ValueError, match="SensitivityCallback: the inputs are left-padded"):
        SensitivityCallback(val, Embedding(TOKENS), sigma=2.0)


def test_without_attach_it_warns_and_still_records(tmp_path: Path):
    train, val = Texts(16, 1), Texts(8, 2)
    callback = SensitivityCallback(val.batch(4), Embedding(TOKENS), sigma=2.0)
    trainer = Trainer(model=tiny_bert(), args=arguments(tmp_path, report_to="none"),
                      train_dataset=train, eval_dataset=val, callbacks=[callback])
    with pytest.warns(UserWarning, match="attach"):
        metrics = trainer.evaluate()
    assert "eval_sensitivity" in metrics
    assert any("eval_sensitivity" in e for e in trainer.state.log_history)
    with pytest.raises(TypeError, match="did you mean sigma"):
        SensitivityCallback(val.batch(4), Embedding(TOKENS), sigmas=2.0)


def test_docs_snippet_runs(snippet, tmp_path: Path):
    train, val = Texts(16, 1), Texts(8, 2)
    model = tiny_bert()
    subset = val.batch(5)
    scope = {"model": model, "args": arguments(tmp_path, report_to="none"), "train": train,
             "val": val, "subset": subset}
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    exec(snippet("Hugging Face Trainer", 0), scope)
    history = scope["trainer"].state.log_history
    last = [e for e in history if "eval_sensitivity" in e][-1]
    inputs = {k: v for k, v in subset.items() if k != "labels"}
    ref = token_sensitivity(model, inputs, Embedding(TOKENS), sigma=0.5, generator=0)
    assert last["eval_sensitivity"] == ref.estimate


def test_tokens_default_to_auto():
    """No tokens given: the HF model's auto_tokens (the embeddings block's LayerNorm)."""
    model, subset = tiny_bert().eval(), Texts(8, 2).batch(6)
    callback = SensitivityCallback(subset, sigma=2.0, generator=3)
    inputs = {k: v for k, v in subset.items() if k != "labels"}
    ref = token_sensitivity(model, inputs, Embedding(TOKENS), sigma=2.0, generator=3)
    assert callback.measure(model).estimate == ref.estimate


def test_a_bf16_trainer_leaves_the_measurement_in_float32(tmp_path: Path):
    """Trainer(bf16=True) has accelerate replace model.forward with an autocast one, which
    stays after training: the callback, and any later token_sensitivity of that model, ran in
    bf16 whatever precision= said (+7.8% at σ = 0.3 in an audit). They measure through the
    model's own forward, and accelerate's patch is left in place."""
    data, subset = Texts(32, 1), Texts(16, 2).batch(16)
    batch = {k: subset[k] for k in ("input_ids", "attention_mask")}
    model = tiny_bert()
    with torch.no_grad():  # weights large enough for bf16 to move the logits
        for m in model.modules():
            if isinstance(m, torch.nn.Linear):
                m.weight.normal_(0, 0.3, generator=torch.Generator().manual_seed(m.weight.numel()))
    opts = dict(sigma=3.0, repeats=16, precision="float32")
    trainer = Trainer(model=model, args=arguments(tmp_path, bf16=True, report_to="none"),
                      train_dataset=data, eval_dataset=Texts(16, 2))
    callback = SensitivityCallback(batch, Embedding(TOKENS), **opts).attach(trainer)
    trainer.train()
    assert "_original_forward" in vars(model)  # accelerate's patch, still there
    with torch.no_grad():
        patched = model(**batch).logits
        model.eval()
        plain = model._original_forward(**batch).logits
    assert not torch.equal(patched, plain)  # the patch does run in bf16
    fresh = tiny_bert()
    fresh.load_state_dict(model.state_dict())
    ref = token_sensitivity(fresh, batch, Embedding(TOKENS), generator=0, **opts)
    low = token_sensitivity(fresh, batch, Embedding(TOKENS), generator=0,
                            sigma=3.0, repeats=16, autocast=torch.bfloat16)
    assert not torch.equal(low.per_sample, ref.per_sample)  # bf16 would have shown
    step, logged = callback.results[-1]
    assert torch.equal(logged.per_sample, ref.per_sample)
    again = token_sensitivity(model, batch, Embedding(TOKENS), generator=0, **opts)
    assert torch.equal(again.per_sample, ref.per_sample)
    assert "forward" in vars(model)  # the patch is put back


def test_several_evaluation_sets_share_one_measurement_and_say_so(tmp_path: Path):
    """eval_dataset as a dict: the Trainer evaluates each set under its own prefix (eval_a,
    eval_b) and calls on_evaluate for each. The callback measured its one fixed subset again
    for every set and logged it as eval_a_sensitivity, eval_b_sensitivity without a word, as if
    each were a sensitivity of that set: it now measures once per evaluation, logs that value
    under each prefix, and warns (once) that it is the same measurement. A model whose weights
    change at the same step is measured again."""
    train, subset = Texts(16, 1), Texts(8, 2).batch(6)
    model = tiny_bert()
    trainer = Trainer(model=model, args=arguments(tmp_path, report_to="none"),
                      train_dataset=train, eval_dataset={"a": Texts(8, 3), "b": Texts(8, 4)})
    callback = SensitivityCallback(subset, Embedding(TOKENS), sigma=2.0, repeats=2,
                                   generator=3).attach(trainer)
    with pytest.warns(UserWarning, match="eval_a_sensitivity, eval_b_sensitivity are the same "
                                         "measurement") as said:
        trainer.train()
    assert sum("same measurement" in str(w.message) for w in said) == 1
    assert [step for step, _ in callback.results] == [2, 4]  # one measurement per evaluation
    history = trainer.state.log_history
    for name in ("eval_a_sensitivity", "eval_b_sensitivity"):
        assert [e[name] for e in history if name in e] == [r.estimate for _, r in callback.results]

    with torch.no_grad():  # other weights at the same global step: measured again
        model.classifier.weight.mul_(-1)
    inputs = {k: v for k, v in subset.items() if k != "labels"}
    ref = token_sensitivity(model, inputs, Embedding(TOKENS), sigma=2.0, repeats=2, generator=3)
    metrics = trainer.evaluate()
    assert len(callback.results) == 3 and callback.results[-1][1].estimate == ref.estimate
    assert ref.estimate != callback.results[1][1].estimate  # not the old weights' value
    assert metrics["eval_a_sensitivity"] == metrics["eval_b_sensitivity"] == ref.estimate
