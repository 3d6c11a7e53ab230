"""The `process` marker, put on a test at collection by reading its code, and held to at run time.

`make test-fast` runs the tests without it, so the marker must be on every test that starts a
process, including tests written later by someone who never heard of it. A test is marked when
its code, its fixtures' code, or the code it calls (the suite's, testbed's, the benchmarks',
Caramel's and the operator's; followed through modules, what making a class runs and the methods
the code names, nested functions, tables of cases) names a way to start a process: the subprocess
or multiprocessing modules, os.fork and its kin, asyncio's subprocesses. Tests marked e2e, recovery,
docker or cluster start processes by what they are.

The reading cannot follow a method called on an object that the code under test was handed, so an
unmarked test runs with process creation watched: one that starts a process fails, telling its
author to mark it `@pytest.mark.process`.
"""

from __future__ import annotations

import _posixsubprocess
import asyncio
import inspect
import os
import platform
import subprocess
import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest

PROCESS = "process"
UNIT_TEST_SECONDS = 120
_STARTS_PROCESSES = ("e2e", "recovery", "docker", "cluster")
# The packages whose code is read, besides tests/ itself; the rest (TensorFlow, kopf, ...) is not.
_READ_PACKAGES = ("testbed", "benchmarks", "caramel", "caramel_operator")
_TESTS = os.path.dirname(os.path.abspath(__file__))
_PROCESS_MODULES = ("subprocess", "multiprocessing", "concurrent.futures.process", "_posixsubprocess")
# Attributes that start a process, of modules that mostly do not (os, asyncio).
_PROCESS_ATTRIBUTES = {
    os: {"fork", "forkpty", "system", "popen", "posix_spawn", "posix_spawnp", "spawnv", "spawnve", "spawnl", "execv", "execve"},
    asyncio: {"create_subprocess_exec", "create_subprocess_shell"},
}

# Importing TensorFlow reads platform.processor(), which runs `uname -p` the first time in a
# process and remembers it: read here, before any test is watched, so that whichever unit test
# imports TensorFlow first in a worker is not taken for one that starts processes.
platform.processor()

_MADE_BY = frozenset({"__new__", "__init__", "__post_init__", "__enter__", "__aenter__", "__call__"})


class _Reader:
    """Whether code names a way to start a process, remembered per code object."""

    def __init__(self) -> None:
        self._verdicts: dict[types.CodeType, bool] = {}

    def function(self, function: Any) -> bool:
        function = inspect.unwrap(function)
        code = getattr(function, "__code__", None)
        return code is not None and self._code(code, function.__globals__)

    def _code(self, code: types.CodeType, namespace: dict[str, Any]) -> bool:
        if code not in self._verdicts:
            self._verdicts[code] = False  # a recursive call is judged by the rest of its caller
            self._verdicts[code] = any(self._value(namespace.get(name), code.co_names) for name in code.co_names) or any(
                self._code(constant, namespace) for constant in code.co_consts if isinstance(constant, types.CodeType)
            )
        return self._verdicts[code]

    def _value(self, value: Any, attributes: tuple[str, ...]) -> bool:
        value = inspect.unwrap(value) if callable(value) else value  # through @cache and the like
        if isinstance(value, types.ModuleType):
            if value.__name__.startswith(_PROCESS_MODULES):
                return True
            if value in _PROCESS_ATTRIBUTES:
                return not _PROCESS_ATTRIBUTES[value].isdisjoint(attributes)
            # A module used as `module.function(...)`: what it names of the module.
            return _is_read(value) and any(self._value(getattr(value, name, None), attributes) for name in attributes)
        if isinstance(value, (dict, list, tuple)):  # a table of cases, such as parametrize's
            cases = value.values() if isinstance(value, dict) else value
            return any(self._value(case, attributes) for case in cases if inspect.isfunction(case))
        module = getattr(value, "__module__", None)
        if isinstance(module, str) and module.startswith(_PROCESS_MODULES):
            return True
        if not _is_read(value):
            return False
        if inspect.isclass(value):
            # What making one runs, and the methods the code names: not every method of a class
            # that is only made, or only named for a constant.
            called = _MADE_BY.union(attributes)
            members = [member for klass in value.__mro__ if _is_read(klass) for name, member in vars(klass).items() if name in called]
            return any(self.function(member) for member in members if inspect.isfunction(member))
        return inspect.isfunction(value) and self.function(value)


def _is_read(value: Any) -> bool:
    """Defined in code that is read: tests/ or one of _READ_PACKAGES."""
    module = value.__name__ if isinstance(value, types.ModuleType) else getattr(value, "__module__", None)
    if not isinstance(module, str):
        return False
    if module.split(".")[0] in _READ_PACKAGES:
        return True
    source = getattr(sys.modules.get(module), "__file__", None) or ""
    return os.path.dirname(os.path.abspath(source)).startswith(_TESTS)



def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    reader = _Reader()
    for item in items:
        if item.get_closest_marker(PROCESS) or any(item.get_closest_marker(marker) for marker in _STARTS_PROCESSES):
            item.add_marker(PROCESS)
            continue
        fixtures = [
            definition.func
            for name, definitions in item._fixtureinfo.name2fixturedefs.items()
            if name != _no_process_unless_marked.__name__  # the guard names the ways it watches
            for definition in definitions
        ]
        callspec = getattr(item, "callspec", None)
        parameters = [value for value in callspec.params.values() if inspect.isfunction(value)] if callspec else []
        if any(reader.function(function) for function in [getattr(item, "function", None), *fixtures, *parameters] if function is not None):
            item.add_marker(PROCESS)
        elif not item.get_closest_marker("timeout"):
            # The slowest unit test takes about 20 s on 2 busy cores: one that hangs (a collective
            # waiting for a rank that is not there) fails the fast run long before the 600 s of the rest.
            item.add_marker(pytest.mark.timeout(UNIT_TEST_SECONDS))


@pytest.fixture(autouse=True)
def _no_process_unless_marked(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    if request.node.get_closest_marker(PROCESS):
        yield
        return
    started: list[str] = []

    def watched(name: str, original: Any) -> Any:
        def start(*args: Any, **kwargs: Any) -> Any:
            started.append(name)
            return original(*args, **kwargs)

        return start

    # subprocess forks through its own reference to fork_exec (or posix_spawn), multiprocessing's
    # spawn and forkserver through _posixsubprocess's, its fork through os.fork.
    monkeypatch.setattr(subprocess, "_fork_exec", watched("subprocess", subprocess._fork_exec))  # type: ignore[attr-defined]
    monkeypatch.setattr(_posixsubprocess, "fork_exec", watched("multiprocessing", _posixsubprocess.fork_exec))
    for name in ("fork", "posix_spawn", "posix_spawnp", "system"):
        monkeypatch.setattr(os, name, watched(f"os.{name}", getattr(os, name)))
    yield
    if started:
        pytest.fail(
            f"{request.node.nodeid} started a process ({', '.join(sorted(set(started)))}) but is not marked "
            "`process`: mark it @pytest.mark.process, so that `make test-fast` leaves it out (tests/process_marks.py)",
            pytrace=False,
        )
