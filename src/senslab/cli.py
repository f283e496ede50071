"""The ``senslab`` command: train, measure, run experiments, report, list.

    senslab list models|datasets|experiments
    senslab train --model vit_small --data mnist --set optim.lr=0.05 --out runs/vit
    senslab measure --model mlp --data digits [--checkpoint runs/x] --sigma 0.5
                    [--set device=cuda --autocast bf16 --compile]
    senslab run demo [--scale cpu|paper] [--out runs/demo]
    senslab report runs/demo [more run or experiment dirs]
    senslab demo            # = senslab run demo, then the report
    senslab reproduction    # record runs/<name> results, regenerate REPRODUCTION.md
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any


def _list(args: argparse.Namespace) -> int:
    if args.what == "models":
        from .models import list_models

        names = list_models(args.pattern)
    elif args.what == "datasets":
        from .data import list_datasets

        names = list_datasets(args.pattern)
    else:
        from .experiments import get_experiment, list_experiments

        for name in list_experiments(args.pattern):
            exp = get_experiment(name)
            runtime = f" [{exp.cpu_runtime} on CPU]" if exp.cpu_runtime else ""
            print(f"{name:<24} {exp.claim}{runtime}")
        return 0
    print("\n".join(names))
    return 0


def _config(args: argparse.Namespace) -> Any:
    from .train.config import RunConfig, apply_overrides

    cfg = RunConfig(name=args.name or f"{args.model}-{args.data}-s{args.seed}", seed=args.seed)
    cfg.model.name, cfg.data.name = args.model, args.data
    if args.data_root:
        cfg.data.root = args.data_root
    return apply_overrides(cfg, args.set or [])


def _train(args: argparse.Namespace) -> int:
    from .report import final_table, format_table, load_runs
    from .train.loop import fit

    cfg = _config(args)
    out = Path(args.out or Path("runs") / cfg.name)
    summary = fit(cfg, out)
    print(format_table(final_table(load_runs([out]))))
    print(f"run directory: {out} ({summary['seconds']} s)")
    return 0


#: ``senslab measure --autocast`` names → dtypes
AUTOCAST = {"bf16": "bfloat16", "fp16": "float16"}


def _measure(args: argparse.Namespace) -> int:
    import torch

    from .measure import TokenSensitivity
    from .train.loop import build_model, load_data, resolve_device
    from .train.rundir import RunDir

    cfg = _config(args)
    if args.checkpoint:
        rd = RunDir(args.checkpoint)
        from .train.config import RunConfig

        cfg = RunConfig.from_dict(rd.read_json("config.json"))
    train, test = load_data(cfg)
    data = train if args.split == "train" else test
    device = resolve_device(cfg.device)
    model = build_model(cfg, train).to(device)
    if args.checkpoint:
        state = RunDir(args.checkpoint).latest_checkpoint()
        if state is None:
            raise SystemExit(f"no readable checkpoint in {args.checkpoint}/checkpoints")
        model.load_state_dict(state["model"])
    g = torch.Generator().manual_seed(args.seed + 1)
    subset = data.first(min(args.num_examples, len(data)), generator=g)
    fast = {"autocast": getattr(torch, AUTOCAST[args.autocast]) if args.autocast else None,
            "compile": args.compile}
    print(f"{'sigma':>8} {'sensitivity':>12} {'s.e.':>8} {'95% CI':>17} {'forwards':>9}")
    for sigma in args.sigma:
        metric = TokenSensitivity(model, sigma=sigma, repeats=args.repeats, generator=args.seed,
                                  **fast)
        for lo in range(0, len(subset), 256):
            x, _ = subset.batch(slice(lo, lo + 256))
            metric.update({k: v.to(device) for k, v in x.items()} if isinstance(x, dict)
                          else x.to(device))
        r = metric.compute()
        print(f"{sigma:>8g} {r.estimate:>12.4f} {r.stderr:>8.4f} "
              f"{r.ci95[0]:>8.4f}–{r.ci95[1]:<8.4f} {r.num_forward:>9,}")
    return 0


def _run(args: argparse.Namespace) -> int:
    from .experiments import get_experiment, run_experiment
    from .report import final_table, format_table, load_runs, make_report

    out = Path(args.out or Path("runs") / args.experiment)
    start = time.perf_counter()
    verdict = run_experiment(args.experiment, out, scale=args.scale, overrides=args.set)
    options = getattr(get_experiment(args.experiment), "report_options", {})
    report = make_report([out], **options)
    print()
    print(format_table(final_table(load_runs([out]))))
    print(f"\nverdict: {verdict['verdict']} — {verdict.get('reason', '')}")
    print(f"report: {report}  ({time.perf_counter() - start:.0f} s)")
    return 0


def _report(args: argparse.Namespace) -> int:
    from .report import final_table, format_table, load_runs, make_report

    path = make_report(args.paths, out_dir=args.out)
    print(format_table(final_table(load_runs(args.paths))))
    print(f"report: {path}")
    return 0


def _reproduction(args: argparse.Namespace) -> int:
    from .reproduction import reproduction

    path = reproduction(args.dirs or None, records=args.records, out=args.out,
                        runs_root=args.runs)
    print(f"wrote {path}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    args.experiment, args.scale = "demo", "cpu"
    return _run(args)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="senslab", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    # every command takes --threads: small models on a shared CPU run many times faster with
    # fewer threads than cores (oversubscription), big ones want all cores
    shared = argparse.ArgumentParser(add_help=False)
    shared.add_argument("--threads", type=int, metavar="N",
                        help="torch CPU threads (default: torch's choice, usually all cores)")

    s = sub.add_parser("list", parents=[shared],
                       help="list registered models, datasets or experiments")
    s.add_argument("what", choices=["models", "datasets", "experiments"])
    s.add_argument("pattern", nargs="?", default="*")
    s.set_defaults(fn=_list)

    def common(s: argparse.ArgumentParser) -> None:
        s.add_argument("--model", default="mlp")
        s.add_argument("--data", default="digits")
        s.add_argument("--data-root", help="directory holding the dataset's files")
        s.add_argument("--seed", type=int, default=0)
        s.add_argument("--name")
        s.add_argument("--set", action="append", metavar="KEY=VALUE",
                       help="config override, e.g. optim.lr=0.05 (repeatable)")

    s = sub.add_parser("train", parents=[shared],
                       help="train one model with sensitivity tracked")
    common(s)
    s.add_argument("--out", help="run directory (re-running resumes it)")
    s.set_defaults(fn=_train)

    s = sub.add_parser("measure", parents=[shared],
                       help="sensitivity of a model (or a run's checkpoint) on data")
    common(s)
    s.add_argument("--checkpoint", help="a run directory: use its config and last checkpoint")
    s.add_argument("--split", choices=["train", "test"], default="train")
    s.add_argument("--sigma", type=float, nargs="+", default=[0.1],
                   help="noise standard deviation(s)")
    s.add_argument("--repeats", type=int, default=1)
    s.add_argument("--num-examples", type=int, default=512)
    s.add_argument("--autocast", choices=sorted(AUTOCAST),
                   help="run the perturbed forwards under bf16/fp16 autocast (GPU: 2-6× faster, "
                        "within the float32 interval; see the README's GPU benchmark)")
    s.add_argument("--compile", action="store_true",
                   help="evaluate the perturbed copies through torch.compile(model)")
    s.set_defaults(fn=_measure)

    s = sub.add_parser("run", parents=[shared],
                       help="run a registered experiment and write its report")
    s.add_argument("experiment")
    s.add_argument("--scale", choices=["cpu", "paper"], default="cpu")
    s.add_argument("--out")
    s.add_argument("--set", action="append", metavar="KEY=VALUE")
    s.set_defaults(fn=_run)

    s = sub.add_parser("report", parents=[shared],
                       help="plots and report.html from run/experiment directories")
    s.add_argument("paths", nargs="+")
    s.add_argument("--out")
    s.set_defaults(fn=_report)

    s = sub.add_parser("reproduction", parents=[shared],
                       help="record finished experiment directories and write REPRODUCTION.md")
    s.add_argument("dirs", nargs="*",
                   help="experiment directories (default: RUNS/<name> for every experiment)")
    s.add_argument("--runs", default="runs", help="where the default directories are")
    s.add_argument("--records", default="reproduction", help="where the JSON records are kept")
    s.add_argument("--out", default="REPRODUCTION.md")
    s.set_defaults(fn=_reproduction)

    s = sub.add_parser("demo", parents=[shared],
                       help="the headline experiment at CPU scale, with its report")
    s.add_argument("--out")
    s.add_argument("--set", action="append", metavar="KEY=VALUE")
    s.set_defaults(fn=_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.threads is not None:
        if args.threads < 1:
            print(f"senslab: error: --threads must be ≥ 1, got {args.threads}", file=sys.stderr)
            return 2
        import torch

        torch.set_num_threads(args.threads)
    try:
        return args.fn(args)
    except (KeyError, ValueError, TypeError, FileNotFoundError, ImportError) as err:
        if "SENSLAB_DEBUG" in __import__("os").environ:
            raise
        msg = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"senslab: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
