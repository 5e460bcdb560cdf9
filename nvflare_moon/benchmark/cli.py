"""Command line of the reproduction benchmark.

    python -m nvflare_moon.benchmark --protocol quick [--methods fedavg,moon] [--out benchmark_results]
    python -m nvflare_moon.benchmark --protocol quick --dataset synthetic --rounds 2 --sites 3 --out /tmp/smoke
    python -m nvflare_moon.benchmark --list
    python -m nvflare_moon.benchmark verify-docs     # the docs' figures against the committed records (.verify_docs)

Each run is a real NVFlare simulator job (SOLO: its script) exported with the protocol's settings; finished runs are
recorded in ``<out>/runs/`` and skipped when the same command runs again. ``<out>/<protocol>/`` receives
``summary.md``, the plots and the per-round CSV. Protocols and methods: ``--list``; docs: ``docs/benchmark.md`` (the
tool) and ``docs/results.md``.
"""

import argparse
import os
import shlex
import signal
import sys
from typing import List, Optional, Sequence

from ..data import DATASETS
from .methods import METHODS, variant_label
from .protocols import PROTOCOLS, customised
from .runner import load_finished, record_path, run_protocol


def _list_of(kind):
    return lambda text: [kind(item) for item in text.split(",") if item.strip()]


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m nvflare_moon.benchmark",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--protocol", choices=sorted(PROTOCOLS), help="which runs (see --list)")
    parser.add_argument("--methods", type=_list_of(str), help=f"comma-separated subset of {','.join(METHODS)}")
    parser.add_argument("--out", default="benchmark_results", help="output folder (default: %(default)s)")
    parser.add_argument(
        "--data-root",
        help="dataset folder for every run (default: $NVFLARE_MOON_DATA, else ~/.cache/nvflare_moon/data)",
    )
    parser.add_argument("--list", action="store_true", help="print the protocols, their runs and what is finished")
    parser.add_argument("--summary-only", action="store_true", help="write the summary of the finished runs, run none")
    parser.add_argument("--run-timeout", type=float, help="give up a run after this many seconds")
    parser.add_argument(
        "--save-progress",
        metavar="DIR",
        help="run nothing: save the state of every interrupted run into DIR/<run_id>/ (a few MB, "
        "small enough to commit), e.g. docs/results/paper/in_progress",
    )
    parser.add_argument(
        "--resume-from",
        metavar="DIR",
        help="continue interrupted runs from the states saved in DIR/<run_id>/ by --save-progress, "
        "where they are further than <out>'s own",
    )
    parser.add_argument(
        "--keep-work",
        action="store_true",
        help="keep each run's exported job and simulator workspace (models, TensorBoard events) in "
        "<out>/work/<run_id>/",
    )
    overrides = parser.add_argument_group("overrides of the protocol's settings (smoke tests, shorter runs)")
    overrides.add_argument("--dataset", choices=DATASETS)
    overrides.add_argument("--rounds", type=int)
    overrides.add_argument("--local-epochs", type=int)
    overrides.add_argument("--sites", type=int, help="number of sites (the simulator's -n)")
    overrides.add_argument("--threads", type=int, help="the simulator's -t (default: one per site)")
    overrides.add_argument("--device", help="auto, cpu, cuda, cuda:1, ...")
    overrides.add_argument("--batch-size", type=int)
    overrides.add_argument("--lr", type=float)
    overrides.add_argument("--solo-epochs", type=int, help="SOLO's epochs per site")
    overrides.add_argument("--seeds", type=_list_of(int), help="e.g. 0,1,2: these seeds for every method")
    overrides.add_argument("--betas", type=_list_of(float), help="e.g. 0.1,0.5,5")
    args = parser.parse_args(argv)
    if not args.list and not args.protocol:
        parser.error("--protocol is required (or --list)")
    return args


def describe(args: argparse.Namespace) -> List[str]:
    """The registered methods and, per protocol, its settings and runs with their state in ``args.out``."""
    lines = ["methods: " + ", ".join(f"{name} ({m.label})" for name, m in METHODS.items()), ""]
    for name in [args.protocol] if args.protocol else sorted(PROTOCOLS):
        protocol = _protocol(args, name)
        lines += [f"{name}: {protocol.description}", f"  settings: {protocol.settings}"]
        for spec in protocol.runs(args.methods):
            try:
                state = "finished" if load_finished(record_path(args.out, spec), spec) else "to run"
            except ValueError:
                state = "finished with other settings"
            lines.append(f"  {spec.run_id:<40} {variant_label(spec.variant):<28} {state}")
        lines.append("")
    return lines


def _protocol(args: argparse.Namespace, name: str):
    return customised(
        PROTOCOLS[name],
        seeds=args.seeds,
        betas=args.betas,
        dataset=args.dataset,
        rounds=args.rounds,
        local_epochs=args.local_epochs,
        num_sites=args.sites,
        threads=args.threads,
        device=args.device,
        batch_size=args.batch_size,
        lr=args.lr,
        solo_epochs=args.solo_epochs,
    )


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, a batch queue's time limit), handled as Ctrl-C is: the run in progress has its whole process
    tree ended and continues next time."""


def _raise_terminated(signum, frame):
    raise Terminated()


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    # Without this, SIGTERM ends the driver alone and leaves the simulator's processes training on.
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        if args.list:
            print("\n".join(describe(args)))
            return 0
        command = "python -m nvflare_moon.benchmark " + shlex.join(sys.argv[1:] if argv is None else list(argv))
        data_root = os.path.abspath(os.path.expanduser(args.data_root)) if args.data_root else None
        return run_protocol(
            _protocol(args, args.protocol),
            args.out,
            args.methods,
            data_root,
            command,
            args.run_timeout,
            args.summary_only,
            args.keep_work,
            log=lambda line: print(line, flush=True),
            resume_from=args.resume_from,
            save_progress=args.save_progress,
        )
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        print(
            "interrupted; run the same command again to resume (finished runs are kept, an interrupted run "
            "continues after its last aggregated round)",
            file=sys.stderr,
        )
        return 128 + (signal.SIGTERM if isinstance(e, Terminated) else signal.SIGINT)
