"""``divopd`` command line. Each subcommand module (imported only when its command runs: ``divopd replay`` never
imports torch) has ``add_arguments(parser)`` and ``run(args)``. Input errors (:class:`divopd.errors.UsageError`,
pydantic and YAML errors, missing input files, bad arguments) print one line, ``divopd <command>: error: <message>``,
and exit 2 (``--debug`` or ``DIVOPD_DEBUG=1``: their traceback); other exceptions are bugs and keep a traceback."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from typing import NoReturn

from divopd.errors import UsageError, describe_validation_error, describe_yaml_error, env_flag, one_line

# command -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("divopd.commands.train", "run asynchronous OPD training from a YAML config"),
    "eval": ("divopd.commands.eval", "evaluate a checkpoint (student-only rollouts)"),
    "export": ("divopd.commands.export", "a checkpoint's student as a Hugging Face folder (LoRA: adapter or --merged)"),
    "report": ("divopd.commands.report", "compare run directories: SR curves, time-to-target, nAUC, plots"),
    "sft": ("divopd.commands.sft",
            "behaviour cloning on an environment's gold trajectories (tiny teachers, warm starts)"),
    "simulate": ("divopd.analysis.simulate", "write a synthetic asynchronous experience log"),
    "replay": ("divopd.analysis.replay", "replay selection rules over an experience log"),
    "tune-cap": ("divopd.analysis.tune_cap", "choose the cap k from an experience log"),
    "bench": ("divopd.commands.bench", "run the paper benchmark suite (resumable; --dry-run, --only, --report)"),
    "doctor": ("divopd.commands.doctor", "what this machine offers and what a config needs (a table; exit 2 on a "
               "blocker)"),
    "tasks": ("divopd.commands.tasks", "write a setting's task file for Trinity-RFT's or verl's per-turn OPD"),
}

#: Loggers of libraries that chat at INFO, set to WARNING unless ``--verbose`` (Ray's children too: it resets ``ray``).
THIRD_PARTY_LOGGERS: tuple[str, ...] = (
    "py4j", "ray", "ray._private", "ray.util", "ray.data", "ray.train", "ray.tune", "vllm", "urllib3", "filelock",
    "fsspec", "httpx", "httpcore", "huggingface_hub", "transformers", "datasets", "torch", "matplotlib", "PIL",
    "tensorboard", "tensorflow", "h5py", "asyncio", "numexpr", "jieba", "nltk", "gym", "gymnasium", "textworld",
    "scienceworld", "textworld_express", "alfworld", "pyserini", "faiss", "spacy",
)

#: Environment variables that turn third-party progress bars off unless ``--verbose`` (kept where the user set them).
QUIET_PROGRESS_ENV = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "TQDM_DISABLE": "1"}

class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (``divopd train: error: ...; see divopd train --help``)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)\n")


def _add_global_flags(parser: argparse.ArgumentParser, default: object) -> None:
    parser.add_argument("--debug", action="store_true", default=default,
                        help="show the full traceback of input errors (also DIVOPD_DEBUG=1)")
    parser.add_argument("--verbose", action="store_true", default=default,
                        help="keep third-party INFO logs and progress bars (py4j, Ray, transformers, ...; also "
                        "DIVOPD_VERBOSE=1)")


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    parser = _Parser(prog="divopd", description="DivOPD: asynchronous on-policy distillation of multi-turn agents")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    _add_global_flags(parser, False)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers = {}
    for name, (_, help_text) in COMMANDS.items():
        subparsers[name] = sub.add_parser(name, help=help_text, description=help_text)
        _add_global_flags(subparsers[name], argparse.SUPPRESS)  # also accepted after the command
    return parser, subparsers


def quiet_third_party_loggers(verbose: bool = False) -> None:
    """Third-party loggers at WARNING and their progress bars off (``verbose``: both left as they are)."""
    if verbose:
        return
    for name in THIRD_PARTY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    for name, value in QUIET_PROGRESS_ENV.items():
        os.environ.setdefault(name, value)
    if "transformers" in sys.modules:  # imported before the variable was set
        sys.modules["transformers"].utils.logging.disable_progress_bar()


def input_error_message(exc: BaseException) -> str | None:
    """The one-line message of an input error, or ``None`` when ``exc`` is not one (a bug: keep the traceback)."""
    if isinstance(exc, UsageError):
        return str(exc)
    pydantic = sys.modules.get("pydantic")
    if pydantic is not None and isinstance(exc, pydantic.ValidationError):
        return describe_validation_error(exc)
    yaml = sys.modules.get("yaml")
    if yaml is not None and isinstance(exc, yaml.YAMLError):
        return f"YAML syntax error at {describe_yaml_error(exc)}"
    if isinstance(exc, (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError)):
        if exc.filename is not None and exc.strerror:
            return one_line(f"{exc.filename}: {exc.strerror}")
        return one_line(exc)
    return None


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
    debug = args.debug = args.debug or env_flag("DIVOPD_DEBUG")
    quiet_third_party_loggers(args.verbose or env_flag("DIVOPD_VERBOSE"))
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:  # Ctrl-C outside a training loop (which stops cleanly by itself): no traceback
        if debug:
            raise
        print(f"divopd {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        message = None if debug else input_error_message(exc)
        if message is None:
            raise
        print(f"divopd {args.command}: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
