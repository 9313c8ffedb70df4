"""What the JVM-backed adapters (ScienceWorld, TextWorld-Express) share: a heap cap, a clean shutdown, a deadline on
every call (:func:`jvm_call`: a hung JVM is killed, never hangs the explorer) and an authenticated gateway (the
packages' default is loopback with no token: another local user could drive the JVM)."""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from divopd.explore.children import no_quit
from divopd.explore.envs.base import Env, EnvCrash

#: JVM options applied while an adapter starts its server: a capped heap and the serial collector keep each JVM at
#: ~250-350 MB instead of 0.5-1.6 GB (MACHINE-NOTES). ``DIVOPD_JAVA_OPTS`` overrides.
DEFAULT_JAVA_OPTS = "-Xmx256m -XX:+UseSerialGC"
#: The longest one JVM call may take before the JVM is killed (s): far above the slowest legitimate call (a
#: ScienceWorld gold-path load, a few seconds), far below "forever".
DEFAULT_CALL_TIMEOUT_S = 120.0
#: The packages' own step limit: the explorer owns the step limit.
NO_STEP_LIMIT = 10**9


def read_timeout_for(call_timeout_s: float) -> float:
    """The gateway sockets' read timeout for a call deadline: a backstop for round trips no watchdog watches (py4j's
    finalizers, in whatever thread the garbage collector runs)."""
    return 1.5 * call_timeout_s + 5.0


def check_call_timeout(owner: str, value: Any) -> float:
    """``value`` as a call deadline in seconds (> 0), or a ``ValueError`` naming ``owner``'s ``call_timeout_s``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{owner}: call_timeout_s must be a number of seconds > 0, got {value!r}")
    return float(value)


@dataclass
class _Watch:
    """One watched call: ``fired`` once the watchdog killed its JVM."""

    proc: Any
    deadline: float
    fired: bool = False


class Watchdog:
    """Kills the JVM of a call still running at its deadline (every :func:`jvm_call` and every shutdown): one daemon
    thread per process, started on demand and ended after a few idle seconds."""

    POLL_S = 0.1
    IDLE_EXIT_S = 5.0

    def __init__(self) -> None:
        self._lock = threading.RLock()  # re-entered when a finalizer closes an env in a thread that holds it
        self._calls: dict[int, _Watch] = {}
        self._thread: threading.Thread | None = None
        self._starting = False
        self._pid = 0

    @contextlib.contextmanager
    def watching(self, proc: Any, timeout: float) -> Iterator[_Watch]:
        """Watch the body: past ``timeout`` s, ``proc`` is killed and the yielded watch marked ``fired``."""
        watch = _Watch(proc, time.monotonic() + timeout)
        thread = None
        with self._lock:
            self._calls[id(watch)] = watch
            if self._thread is None or self._pid != os.getpid() or not (self._thread.is_alive() or self._starting):
                self._pid, self._starting = os.getpid(), True
                thread = self._thread = threading.Thread(target=self._run, name="divopd-jvm-watchdog", daemon=True)
        if thread is not None:  # started outside the lock: a finalizer run in the new thread may need the lock
            try:
                thread.start()
            finally:
                self._starting = False
        try:
            yield watch
        finally:
            with self._lock:
                self._calls.pop(id(watch), None)

    def _run(self) -> None:
        idle_since = time.monotonic()
        while True:
            time.sleep(self.POLL_S)
            now = time.monotonic()
            with self._lock:
                due = [w for w in self._calls.values() if now >= w.deadline and not w.fired]
                for watch in due:
                    watch.fired = True
                if self._calls:
                    idle_since = now
                elif now - idle_since > self.IDLE_EXIT_S:
                    self._thread = None
                    return
            for watch in due:
                with contextlib.suppress(Exception):
                    watch.proc.kill()


WATCHDOG = Watchdog()


def _java_process(package_env: Any) -> Any:
    return getattr(getattr(package_env, "_gateway", None), "java_process", None)


@contextlib.contextmanager
def guarded_gateway(module: Any, read_timeout: float | None = None) -> Iterator[None]:
    """While a package env is built, make ``module`` (the package module that calls ``launch_gateway`` and
    ``JavaGateway``) launch the JVM with py4j's ``enable_auth`` in a process group of its own (a terminal's Ctrl-C is
    not for it), and connect with the JVM's token, the gateway's sockets with ``read_timeout`` (s)."""
    from py4j.protocol import escape_new_line

    launch, gateway = module.launch_gateway, module.JavaGateway
    token: list[str] = []

    def launch_with_auth(*args: Any, **kwargs: Any) -> Any:
        port, auth_token, proc = launch(*args, **{**kwargs, "enable_auth": True, "return_proc": True,
                                                  "create_new_process_group": True})
        token.append(escape_new_line(auth_token))  # as GatewayParameters(auth_token=...) stores it
        return port, proc

    def gateway_with_auth(*args: Any, **kwargs: Any) -> Any:
        for key in ("gateway_parameters", "callback_server_parameters"):
            if token and kwargs.get(key) is not None:
                kwargs[key].auth_token = token[-1]
        if read_timeout is not None and kwargs.get("gateway_parameters") is not None:
            kwargs["gateway_parameters"].read_timeout = read_timeout
        return gateway(*args, **kwargs)

    module.launch_gateway, module.JavaGateway = launch_with_auth, gateway_with_auth
    try:
        yield
    finally:
        module.launch_gateway, module.JavaGateway = launch, gateway


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


@contextlib.contextmanager
def _py4j_quiet() -> Iterator[None]:
    """Silence py4j's logger: its connection errors on a dead JVM come with tracebacks, which are noise here."""
    names = [n for n in list(logging.root.manager.loggerDict) if n == "py4j" or n.startswith("py4j.")]
    loggers = [logging.getLogger(n) for n in names or ["py4j"]]
    old = [logger.disabled for logger in loggers]
    for logger in loggers:
        logger.disabled = True  # per logger: a parent's flag does not stop its children's records
    try:
        yield
    finally:
        for logger, flag in zip(loggers, old, strict=True):
            logger.disabled = flag


def guard_finalizer(package_env: Any) -> None:
    """Make the package env's close at garbage collection (its ``__del__``) quiet and never raising: on a dead JVM py4j
    logs tracebacks at whatever moment the collector runs (inside an ``ast.parse``, CPython 3.11's traceback formatting
    fails). Call it right after the package env is created."""
    ref = weakref.ref(package_env)  # no strong cycle: the env stays collectable by reference counting

    def close_at_collection() -> None:
        env = ref()
        if env is not None:
            _close_quietly(env)

    package_env.close = close_at_collection


def _close_quietly(package_env: Any) -> None:
    """The package's real ``close``, py4j silenced, then the gateway client marked disconnected: py4j's own shutdown
    fails on a dead JVM before it does so, and every Java object's finalizer would then reconnect and log."""
    with no_quit():
        with contextlib.suppress(Exception), _py4j_quiet():
            type(package_env).close(package_env)
        client = getattr(getattr(package_env, "_gateway", None), "_gateway_client", None)
        if client is not None:
            with contextlib.suppress(Exception), _py4j_quiet():
                client.close()
            client.is_connected = False


def shutdown_gateway(package_env: Any, timeout: float = 5.0) -> None:
    """Close a py4j-backed package env and make sure its JVM process has exited (killed after ``timeout`` s; also
    when the close itself hangs on a stopped JVM)."""
    proc = _java_process(package_env)
    # An env still open at interpreter exit (its __del__): no thread can start now (3.11 waits for one forever), so no
    # watchdog; the JVM goes first, then py4j's client.
    finalizing = sys.is_finalizing()
    if finalizing and proc is not None:
        with contextlib.suppress(Exception):
            proc.kill()
            proc.wait(timeout=timeout)
    with contextlib.nullcontext() if finalizing or proc is None else WATCHDOG.watching(proc, timeout):
        _close_quietly(package_env)
    package_env.close = lambda: None  # the package's __del__ calls close() again: it must not raise
    if proc is not None and not finalizing:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout)


def jvm_alive(package_env: Any) -> bool:
    proc = _java_process(package_env)
    return proc is not None and proc.poll() is None


def jvm_call(adapter: Any, fn: Callable[[], Any]) -> Any:
    """Run ``fn``, a call into ``adapter``'s JVM (a :class:`JvmEnv`), under a deadline; a dead JVM, a broken gateway
    or a call still running after ``adapter.call_timeout_s`` (the JVM is then killed) becomes :class:`EnvCrash`. A JVM
    found dead closes the adapter at once, before the crash is raised (:func:`_close_quietly`)."""
    name = type(adapter).__name__
    if adapter.closed:
        raise EnvCrash(f"{name}: used after close()")
    from py4j.protocol import Py4JError

    timeout = getattr(adapter, "call_timeout_s", DEFAULT_CALL_TIMEOUT_S)
    proc = _java_process(adapter._env)
    with contextlib.nullcontext(None) if proc is None else WATCHDOG.watching(proc, timeout) as watch, no_quit():
        try:
            result = fn()
        except Exception as exc:  # noqa: BLE001 — a backend error, or whatever a call cut off by the watchdog raised
            if not isinstance(exc, (Py4JError, ConnectionError, OSError)) and not (watch is not None and watch.fired):
                raise
            failure: BaseException | None = exc
        else:
            failure = None
    fired = watch is not None and watch.fired
    if failure is None and not fired:
        return result
    if not fired and watch is not None and time.monotonic() >= watch.deadline:  # the socket's timeout came first
        with contextlib.suppress(Exception):
            proc.kill()
        fired = True
    alive = jvm_alive(adapter._env) and not fired
    if not alive:
        adapter.close()
    if fired:
        with contextlib.suppress(Exception):  # reaped before the crash: the next env must not take it for alive
            proc.wait(timeout=10)
        raise EnvCrash(f"{name}: the JVM gave no answer within call_timeout_s={timeout:g} s; it was killed")
    raise EnvCrash(f"{name}: JVM call failed (jvm alive={alive}): {failure}") from failure


class JvmEnv(Env):
    """An adapter over a package env on a JVM (``_env``, ended by ``_release``), every call under :func:`jvm_call`
    with the deadline ``call_timeout_s``: past it the JVM is killed and the call raises :class:`EnvCrash`."""

    closed = False
    call_timeout_s = DEFAULT_CALL_TIMEOUT_S
    _env: Any
    _release: Callable[[], None]

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._release()

    def _call(self, fn: Callable[[], Any]) -> Any:
        """Run a call into the JVM. Every JVM round trip (a Java method's lookup, iterating a Java list) must happen
        inside ``fn``: outside it has no deadline."""
        return jvm_call(self, fn)
