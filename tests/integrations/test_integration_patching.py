"""The patching every framework integration shares (``integrations._patching``, ``integrations._instrumentor``):
wrappers of the original's kind that act only while switched on, attributes put back exactly, post-import hooks
registered once, and an instrumentor that starts nothing where its framework is not installed."""

from __future__ import annotations

import asyncio
import inspect
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from otel_agentloop.integrations._instrumentor import Instrumentor
from otel_agentloop.integrations._patching import (
    Args,
    Kwargs,
    Original,
    Patches,
    Switch,
    awaited_in,
    on_import,
    put_back,
    switched,
)


def _double(x: int, *, by: int = 2) -> int:
    return x * by


async def _adouble(x: int, *, by: int = 2) -> int:
    await asyncio.sleep(0)
    return x * by


def test_a_wrapper_keeps_the_kind_and_acts_only_while_switched_on() -> None:
    switch = Switch()
    seen: list[tuple[Args, Kwargs]] = []

    def impl(original: Original, args: Args, kwargs: Kwargs) -> object:
        seen.append((args, kwargs))
        return original(*args, **kwargs)

    async def aimpl(original: Original, args: Args, kwargs: Kwargs) -> object:
        seen.append((args, kwargs))
        return await original(*args, **kwargs)  # type: ignore[misc]

    sync = switched(switch, _double, impl)
    coro = switched(switch, _adouble, aimpl)
    assert not inspect.iscoroutinefunction(sync) and inspect.iscoroutinefunction(coro)
    assert sync(3, by=3) == 9 and asyncio.run(coro(3)) == 6  # type: ignore[arg-type]
    assert seen == []  # off: straight through
    switch.active = True
    assert sync(3, by=3) == 9 and asyncio.run(coro(4)) == 8  # type: ignore[arg-type]
    assert seen == [((3,), {"by": 3}), ((4,), {})]


def test_an_exception_ends_the_span_and_comes_out_unchanged() -> None:
    class BoomError(Exception):
        pass

    async def fails() -> None:
        raise BoomError("x")

    with pytest.raises(BoomError, match="x"):
        asyncio.run(awaited_in(None, fails, (), {}))  # type: ignore[arg-type]


def test_patches_put_back_the_very_same_objects_and_delete_what_was_inherited() -> None:
    class Base:
        def method(self) -> str:
            return "base"

    class Child(Base):
        def own(self) -> str:
            return "own"

    original_own = vars(Child)["own"]
    patches = Patches()
    assert not patches
    patches.set(Child, "own", lambda self: "patched")
    patches.set(Child, "method", lambda self: "patched")  # inherited: Child's __dict__ had none
    assert patches and patches.holds(Child, "own") and not patches.holds(Base, "method")
    assert Child().own() == "patched" and Child().method() == "patched"
    patches.restore()
    assert vars(Child)["own"] is original_own and "method" not in vars(Child)
    assert Child().method() == "base" and not patches


def test_an_instance_attribute_is_put_back_only_while_it_is_still_ours() -> None:
    class Session:
        def post(self) -> str:
            return "class"

    ours = Session()
    ours.post = lambda: "ours"  # type: ignore[method-assign]
    put_back(ours, "post", vars(ours)["post"], None, "test")
    assert ours.post() == "class" and "post" not in vars(ours)

    theirs = Session()
    installed = lambda: "ours"  # noqa: E731
    replaced = lambda: "someone else's"  # noqa: E731
    theirs.post = replaced  # type: ignore[method-assign]
    put_back(theirs, "post", installed, None, "test")
    assert theirs.post is replaced


def test_a_module_is_patched_now_when_imported_else_when_it_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    name = "otel_agentloop_patch_target"
    (tmp_path / f"{name}.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    applied: list[str] = []
    hooked: set[str] = set()
    on_import(name, lambda module: applied.append(module.__name__), hooked)
    assert applied == [] and hooked == {name}  # not imported: nothing imported for it
    on_import(name, lambda module: applied.append("twice"), hooked)  # one hook per name for the process
    __import__(name)
    assert applied == [name]
    on_import(name, lambda module: applied.append("now"), hooked)  # imported: applied at once
    assert applied == [name, "now"]


def test_an_instrumentor_starts_nothing_where_its_framework_is_not_installed() -> None:
    calls: list[str] = []

    class Absent(Instrumentor):
        package, dependencies = "otel_agentloop_no_such_framework", ("nothing >= 1",)

        def _start(self, kwargs: Mapping[str, object]) -> None:
            calls.append("start")

    class Present(Instrumentor):  # not a subclass of Absent: BaseInstrumentor keeps one instance per class tree
        package = "json"

        def _start(self, kwargs: Mapping[str, object]) -> None:
            calls.append(f"start {sorted(kwargs)}")

        def _stop(self) -> None:
            calls.append("stop")

    assert Absent().instrumentation_dependencies() == ("nothing >= 1",)
    Absent()._instrument()
    Present()._instrument(tracer_provider=None)
    Present()._uninstrument()
    assert calls == ["start ['tracer_provider']", "stop"]
