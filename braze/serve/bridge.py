"""The engine's thread and the server's event loop, joined: a submitted request's events
arrive on an ``asyncio.Queue`` (``loop.call_soon_threadsafe`` from the engine's
callback), and a client that goes away cancels its sequence.

The engine thread does all of braze's work; the event loop only parses, queues and
writes. Nothing here blocks the loop.
"""

from __future__ import annotations

import asyncio
from typing import AsyncGenerator, Awaitable, Callable

from .engine import Engine, Event, Request

#: waits until the client has gone (``http.disconnect``); never returns while it is there
Disconnected = Callable[[], Awaitable[None]]


class Submitted:
    """One request in the engine. ``events()`` yields its events up to the last one
    (``finish_reason`` set); if the client disconnects first, or the consumer stops
    iterating, the sequence is cancelled and the iteration ends."""

    def __init__(self, engine: Engine, req: Request, disconnected: Disconnected) -> None:
        self.engine = engine
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[Event | None] = asyncio.Queue()
        self.finished = False
        self.client_gone = False
        self._disconnected = disconnected
        self.seq_id = engine.submit(req, self._on_event)  # QueueFull / check errors raise here

    def _on_event(self, ev: Event) -> None:  # the engine's thread
        self.loop.call_soon_threadsafe(self.queue.put_nowait, ev)

    async def _watch(self) -> None:
        await self._disconnected()
        self.client_gone = True
        self.queue.put_nowait(None)

    async def events(self) -> AsyncGenerator[Event, None]:
        watcher = asyncio.ensure_future(self._watch())
        try:
            while True:
                ev = await self.queue.get()
                if ev is None:
                    return
                if ev.finish_reason is not None:
                    self.finished = True
                yield ev
                if self.finished:
                    return
        finally:
            watcher.cancel()
            if not self.finished:  # the client went away, or the task was cancelled
                self.engine.cancel(self.seq_id)
