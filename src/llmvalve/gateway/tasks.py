"""Background asyncio tasks that are started together and stopped together. A task that
ends by an error (a bug: each loop guards what it expects) is logged when it ends, not when
it is stopped, and stopping the others goes on."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger(__name__)


def _report(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("background task %s died", task.get_name(), exc_info=task.exception())


class Background:
    def __init__(self) -> None:
        self._tasks: list[asyncio.Task[Any]] = []

    def start(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, name=name)
        task.add_done_callback(_report)
        self._tasks.append(task)
        return task

    async def stop(self) -> None:
        """Cancel every task and wait for each to end."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)  # errors: logged by _report

    def __len__(self) -> int:
        return len(self._tasks)
