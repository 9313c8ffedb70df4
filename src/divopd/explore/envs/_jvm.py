"""Helpers shared by the JVM-backed adapters (ScienceWorld, TextWorld-Express): heap cap and clean shutdown."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from typing import Any

#: JVM options applied while an adapter starts its server: a capped heap and the serial collector keep each JVM at
#: ~250-350 MB instead of 0.5-1.6 GB (MACHINE-NOTES). ``DIVOPD_JAVA_OPTS`` overrides.
DEFAULT_JAVA_OPTS = "-Xmx256m -XX:+UseSerialGC"


@contextlib.contextmanager
def java_opts(opts: str | None = None) -> Iterator[None]:
    """Set ``JAVA_TOOL_OPTIONS`` only while a JVM is being launched, then restore the caller's value."""
    opts = opts if opts is not None else os.environ.get("DIVOPD_JAVA_OPTS", DEFAULT_JAVA_OPTS)
    old = os.environ.get("JAVA_TOOL_OPTIONS")
    os.environ["JAVA_TOOL_OPTIONS"] = opts
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("JAVA_TOOL_OPTIONS", None)
        else:
            os.environ["JAVA_TOOL_OPTIONS"] = old


def shutdown_gateway(package_env: Any, timeout: float = 5.0) -> None:
    """Close a py4j-backed package env and make sure its JVM process has exited (killed after ``timeout`` s).

    The packages' own ``__del__`` calls ``close()`` again at garbage collection; it is replaced by a no-op here so the
    second call cannot raise on an already closed gateway.
    """
    gateway = getattr(package_env, "_gateway", None)
    proc = getattr(gateway, "java_process", None)
    with contextlib.suppress(Exception):
        package_env.close()
    package_env.close = lambda: None  # the package's __del__ calls close() again
    if proc is not None:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout)


def jvm_alive(package_env: Any) -> bool:
    """Whether the package env's JVM process is still running."""
    proc = getattr(getattr(package_env, "_gateway", None), "java_process", None)
    return proc is not None and proc.poll() is None
