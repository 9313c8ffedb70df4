"""JVM hosts of the package envs (ScienceWorld, TextWorld-Express): a JVM of their own or one shared per process, every
construction under :data:`CONSTRUCTION_LOCK`. The calls into those JVMs: :mod:`divopd.explore.envs._jvm`."""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from divopd.errors import UsageError
from divopd.explore.children import no_quit
from divopd.explore.envs._jvm import (
    DEFAULT_JAVA_OPTS,
    guard_finalizer,
    guarded_gateway,
    java_opts,
    jvm_alive,
    shutdown_gateway,
)

__all__ = ["CONSTRUCTION_LOCK", "JavaNotFoundError", "check_java", "construction", "own_package_env",
           "shared_package_env"]

#: Every construction of a package env happens under this lock: :func:`shared_package_env` swaps the package module's
#: gateway launcher while it builds a guest, and no other construction may see the swap.
CONSTRUCTION_LOCK = threading.RLock()
#: Releases of shared-JVM guests that found :data:`CONSTRUCTION_LOCK` held by another thread. A release may run as a
#: finalizer in a thread the lock's holder waits for (py4j's callback server), so it never waits for the lock: it
#: leaves itself here and the holder runs it before (or right after) it lets the lock go.
_DEFERRED: list[Callable[[], None]] = []


def _run_deferred() -> None:  # under CONSTRUCTION_LOCK
    while _DEFERRED:
        _DEFERRED.pop()()


def _run_deferred_if_free() -> None:
    """Run the deferred releases unless another thread holds :data:`CONSTRUCTION_LOCK` (its holder runs them then)."""
    while _DEFERRED and CONSTRUCTION_LOCK.acquire(blocking=False):
        try:
            _run_deferred()
        finally:
            CONSTRUCTION_LOCK.release()


@contextlib.contextmanager
def construction() -> Iterator[None]:
    """Hold :data:`CONSTRUCTION_LOCK`; the releases deferred meanwhile run before it is let go (and any that arrived
    in between, right after)."""
    with CONSTRUCTION_LOCK:
        try:
            yield
        finally:
            _run_deferred()
    _run_deferred_if_free()


@dataclass
class _Host:
    """A package env that launched a JVM which guests share (never used for a game itself), and its guest count."""

    env: Any
    users: int = 0


#: (package module, JVM options, process id): a forked child never reuses its parent's gateway.
_HOSTS: dict[tuple[str, str, int], _Host] = {}


class JavaNotFoundError(UsageError, FileNotFoundError):
    """No ``java`` on ``PATH``: the JVM-backed environments cannot start (one line from the CLI, exit 2)."""


def check_java(what: str = "this environment") -> None:
    """Raise :class:`JavaNotFoundError` (one line) when there is no ``java`` on ``PATH`` to start a JVM with."""
    if shutil.which("java") is None:
        raise JavaNotFoundError(f"{what} runs on a Java VM, but there is no `java` on PATH; install a Java 17+ "
                                "runtime (e.g. `apt-get install openjdk-17-jre-headless`) and put it on PATH")


def own_package_env(module: Any, make: Callable[[], Any], opts: str | None = None,
                    read_timeout: float | None = None) -> tuple[Any, Callable[[], None]]:
    """A package env on a JVM of its own (``make()`` under ``opts``, the gateway of ``module``, the package module,
    guarded: :func:`guarded_gateway`), and the function that ends that JVM. No ``java``: :class:`JavaNotFoundError`."""
    what = module.__name__.split(".")[0]
    check_java(what)
    with construction(), no_quit(), java_opts(opts), guarded_gateway(module, read_timeout):
        try:
            env = make()
        except FileNotFoundError as exc:  # java went missing between the check and the start
            if exc.filename != "java":
                raise
            raise JavaNotFoundError(f"{what}: cannot start `java`: {exc.strerror}") from None
    guard_finalizer(env)
    return env, lambda: shutdown_gateway(env)


def _end_host(key: tuple[str, str, int], host: _Host) -> None:
    """Shut ``host``'s JVM down and forget it (under :data:`CONSTRUCTION_LOCK`)."""
    if _HOSTS.get(key) is host:
        del _HOSTS[key]
    shutdown_gateway(host.env)


def shared_package_env(module: Any, make: Callable[[], Any], opts: str | None = None,
                       read_timeout: float | None = None) -> tuple[Any, Callable[[], None]]:
    """A package env whose game runs on this process's one JVM for ``module``, and the function that releases it.

    The first call launches the JVM (a host env that plays no game); every call builds a guest with ``make()`` while
    ``module.launch_gateway`` and ``module.JavaGateway`` return the host's process and gateway, so the guest gets its
    own game object on the shared JVM. The release (also run when the guest is collected unclosed) ends the JVM with
    its last guest. A JVM found dead, or one a new guest cannot reach, is replaced (once); its guests' calls fail.
    """
    opts = opts if opts is not None else os.environ.get("DIVOPD_JAVA_OPTS", DEFAULT_JAVA_OPTS)
    key = (module.__name__, opts, os.getpid())
    from py4j.protocol import Py4JError

    with construction(), no_quit():
        for attempt in (1, 2):
            host = _HOSTS.get(key)
            if host is not None and not jvm_alive(host.env):
                _end_host(key, host)
                host = None
            fresh = host is None
            if host is None:
                host = _HOSTS[key] = _Host(own_package_env(module, make, opts, read_timeout)[0])
            gateway = host.env._gateway
            saved = module.launch_gateway, module.JavaGateway
            module.launch_gateway = lambda *args, _gw=gateway, **kwargs: (None, _gw.java_process)
            module.JavaGateway = lambda *args, _gw=gateway, **kwargs: _gw
            try:
                guest = make()
                break
            except (Py4JError, OSError):  # the host's JVM died under us (e.g. killed at a call deadline, still exiting)
                if attempt == 2 or fresh:
                    raise
                _end_host(key, host)  # its other guests' calls fail as EnvCrash; a new host for this one
            finally:
                module.launch_gateway, module.JavaGateway = saved
        host.users += 1
    released = False

    def release_held() -> None:
        nonlocal released
        if released:
            return
        released = True
        host.users -= 1
        if host.users <= 0 or not jvm_alive(host.env):
            _end_host(key, host)

    def release() -> None:  # never waits for the lock (it may run as a finalizer): see _DEFERRED
        _DEFERRED.append(release_held)
        _run_deferred_if_free()

    guest.close = release  # the package's __del__ calls close(): an unclosed guest is released at collection
    return guest, release
