"""benchmarks/real_models.py compares senslab with its references on equal terms: a row's model
FLOPs count the work its copies do (so no senslab row passes the bf16 GEMM target on FLOPs it
never ran), and every record says what machine and how many threads it ran on."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from senslab.tokens import Embedding

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchscripts import BENCHMARKS, load  # noqa: E402

sys.path.insert(0, str(BENCHMARKS))
bench = load("real_models.py", "senslab_bench_real_fair")

D, CLASSES, R = 16, 2, 3
LENGTHS = [9, 4, 7, 2]
WIDTH = 10


def tiny_gpt2_case():
    """The zoo's GPT-2 at one layer of width 16 on 4 right-padded sentences of mixed lengths,
    padded to 10 (wider than the longest), whose copies resume from the clean prefix."""
    from _real import RealCase

    from senslab.models import create_model

    model = create_model("gpt2", vocab_size=50, max_len=16, dim=D, layers=1, heads=2,
                         dropout=0.0, seed=0, num_classes=CLASSES).eval()
    lengths = torch.tensor(LENGTHS)
    mask = torch.arange(WIDTH)[None] < lengths[:, None]
    ids = torch.randint(2, 50, (len(LENGTHS), WIDTH), generator=torch.Generator().manual_seed(1))
    inputs = {"input_ids": ids.masked_fill(~mask, 1), "attention_mask": mask.long()}
    return RealCase("tiny_gpt2", "text", model, inputs, Embedding("embed_ln"), 2.0, R)


def forward(k: int) -> int:
    """FLOPs of one whole forward at k positions, written out: per position the Q/K/V, output
    projection and 4× MLP products, the two k × k attention products, and the head's row."""
    return (2 * k * D * 3 * D + 4 * k * k * D + 2 * k * D * D + 2 * k * D * 8 * D
            + 2 * D * CLASSES)


def suffix(k: int, t: int) -> int:
    """FLOPs of a copy of a k-token sentence perturbed at t and resumed from its clean prefix:
    Q/K/V of the suffix rows t..k-1; the last row's attention over k keys, projection and MLP;
    the head. The padding after k is never recomputed, kept or not."""
    return 2 * (k - t) * D * 3 * D + 4 * k * D + 2 * D * D + 2 * D * 8 * D + 2 * D * CLASSES


def test_the_flop_model_matches_a_count_by_hand():
    fl = bench.flops_by_length(tiny_gpt2_case())
    assert all(fl[k] == forward(k) for k in [*LENGTHS, WIDTH])


@pytest.mark.parametrize("label, options, single", [
    ("senslab trim_padding=False", {"trim_padding": False}, False),
    ("senslab per-example calls", {}, True),
    ("senslab defaults", {}, False),
])
def test_resumed_copies_are_counted_at_the_suffix_they_recompute_in_every_row(
        label, options, single):
    """Before: a row that kept its padding counted every copy as a whole forward of the padded
    width, and one that called ``update`` per example as a whole forward at its length — 4.75
    and 3.26 MFLOP here against the 1.01 counted by hand; on the real GPT-2 that made
    ``trim_padding=False`` the 'best' row of the bf16 GEMM target, at 263% of the bf16 peak
    (``benchmarks/results/real-gpt2-2threads.json``)."""
    case = tiny_gpt2_case()
    fl = bench.flops_by_length(case)
    row = bench.senslab_row(case, label, {"repeats": R, "precision": "float32", **options},
                            0.0, single)
    copies = sum(R * sum(suffix(k, t) for t in range(k)) for k in LENGTHS)
    expected = len(LENGTHS) * fl[WIDTH] + copies  # the clean forwards at the padded width
    assert bench.row_flops(case, row, fl) == pytest.approx(expected)
    assert row["copies_per_example"] == [R * k for k in LENGTHS]  # each copy to its example


def test_whole_copies_that_keep_their_padding_are_counted_at_the_padded_width():
    case = tiny_gpt2_case()
    fl = bench.flops_by_length(case)
    tokens = Embedding("embed_ln", reuse_prefix=False)
    row = bench.senslab_row(case, "senslab trim_padding=False",
                            {"repeats": R, "precision": "float32", "trim_padding": False,
                             "tokens": tokens}, 0.0)
    expected = len(LENGTHS) * forward(WIDTH) + R * sum(LENGTHS) * forward(WIDTH)
    assert bench.row_flops(case, row, fl) == pytest.approx(expected)
    # a record written before the tally weighed the padded width keeps its meaning: its
    # untrimmed copies counted whole at the padded width, whatever its tally says
    old = {k: v for k, v in row.items() if k != "work_unit"}
    old["work_per_example"] = [1.0] * len(LENGTHS)
    assert bench.row_flops(case, old, fl) == pytest.approx(expected)


def test_machine_names_the_cpu_and_the_threads_read_back():
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        info = bench.machine()
    finally:
        torch.set_num_threads(before)
    assert info["threads"] == 1 and info["interop_threads"] >= 1
    assert info["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                 if line.startswith("model name")]
        flags = next((set(line.split(":", 1)[1].split())
                      for line in cpuinfo.read_text().splitlines() if line.startswith("flags")),
                     set())
        if names:
            assert info["cpu"] == names[0]
        kept = sys.modules[bench.machine.__module__].CPU_FLAGS  # benchmarks/_machine.py's
        assert set(info["cpu_flags"]) == flags & set(kept)
    assert info["cpu"]


def test_a_record_says_the_machine_and_the_threads_it_ran(tmp_path, monkeypatch):
    """The written record holds the CPU and the threads the run set, not just the host name
    (``vm`` on every VM record so far). The real cases load MiniLM and MNIST, so a tiny
    one stands in for them."""
    monkeypatch.setattr(bench, "make_case", lambda name, n: tiny_gpt2_case())
    before = torch.get_num_threads()
    out = tmp_path / "record.json"
    try:
        bench.main(["--cases", "gpt2", "--threads", "1", "--gemm-n", "32", "--methods",
                    "senslab defaults", "--out", str(out)])
    finally:
        torch.set_num_threads(before)
    record = json.loads(out.read_text())
    assert record["threads"] == 1
    assert record["cpu"] == bench.machine()["cpu"] and "cpu_flags" in record
    assert record["cases"][0]["rows"][-1]["work_unit"] == bench.WORK_UNIT
