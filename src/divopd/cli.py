"""``divopd`` command line. Each subcommand lives in its own module with ``add_arguments(parser)`` and ``run(args)``.

Modules are imported only when their command runs, so ``divopd replay`` never imports torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# command -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("divopd.train", "run asynchronous OPD training from a YAML config"),
    "eval": ("divopd.evaluate", "evaluate a checkpoint (student-only rollouts)"),
    "report": ("divopd.report", "compare run directories: SR curves, time-to-target, nAUC, plots"),
    "sft": ("divopd.sft_cli", "behaviour cloning on an environment's gold trajectories (tiny teachers, warm starts)"),
    "simulate": ("divopd.simulate", "write a synthetic asynchronous experience log"),
    "replay": ("divopd.replay", "replay selection rules over an experience log"),
    "tune-cap": ("divopd.tune_cap", "choose the cap k from an experience log"),
    "bench": ("divopd.bench", "run the paper benchmark suite (resumable; --dry-run, --only, --report)"),
}


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    parser = argparse.ArgumentParser(
        prog="divopd", description="DivOPD: asynchronous on-policy distillation of multi-turn agents")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers = {}
    for name, (_, help_text) in COMMANDS.items():
        subparsers[name] = sub.add_parser(name, help=help_text, description=help_text)
    return parser, subparsers


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser, subparsers = build_parser()
    # Parse the command name first, then let its module add its own arguments.
    command = next((a for a in argv if not a.startswith("-")), None)
    if command in COMMANDS:
        module_name = COMMANDS[command][0]
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                parser.exit(2, f"divopd: command {command!r} is not available in this build\n")
            raise
        module.add_arguments(subparsers[command])
        subparsers[command].set_defaults(_run=module.run)
    args = parser.parse_args(argv)
    if args.version:
        from divopd import __version__

        print(__version__)
        return 0
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    return int(args._run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
