"""Run a coroutine at once, and make a task of it only if it has to wait.

A review is judged by a coroutine (the authorizer may ask the API server), but with offline RBAC
it never waits. A task per review costs a loop iteration and its scheduling, about as much as the
decision; so the listener steps the coroutine itself, and only one that suspends continues in a
task (what Python 3.12's eager tasks do; the floor here is 3.11).
"""

from __future__ import annotations

import asyncio
import types
from collections.abc import Coroutine, Generator
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Finished(Generic[T]):
    """The coroutine's result, computed without suspending."""

    __slots__ = ("value",)

    def __init__(self, value: T) -> None:
        self.value = value


@types.coroutine
def _resume(coro: Coroutine[Any, Any, T], pending: Any) -> Generator[Any, Any, T]:
    """Yield what the coroutine waits on to the task, and pass the task's wake-ups (and its
    cancellation) back into the coroutine, until it returns."""
    while True:
        try:
            sent = yield pending
        except BaseException as exc:  # noqa: BLE001 - cancellation or anything thrown in: the coroutine decides
            try:
                pending = coro.throw(exc)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
        else:
            try:
                pending = coro.send(sent)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]


async def _continue(coro: Coroutine[Any, Any, T], pending: Any) -> T:
    return await _resume(coro, pending)


def start(coro: Coroutine[Any, Any, T], name: str | None = None) -> Finished[T] | asyncio.Task[T]:
    """Finished(result) when ``coro`` ran to its end without waiting (its exception propagates
    here); otherwise the task that runs the rest of it."""
    try:
        pending = coro.send(None)
    except StopIteration as done:
        return Finished(done.value)
    return asyncio.get_running_loop().create_task(_continue(coro, pending), name=name)
