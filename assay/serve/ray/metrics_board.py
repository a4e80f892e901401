"""/metrics over every Ray Serve engine replica: the router answers a scrape with its own counts (the HTTP
outcomes, the replicas lost, the requests run again) plus the sum over every engine replica, read then.

Ray Serve routes a request to one replica and has no broadcast, so the engine replicas meet at a named actor,
the board. Each replica runs a reporter thread that long-polls the board; a scrape raises the board's
epoch, every live reporter answers with its replica's snapshot (metrics.ServerMetrics.snapshot, a few
dozen numbers), and the board hands the router one snapshot per replica, each taken after the scrape
began. A replica that has not polled for STALE_S is taken as gone; one that does not answer within
SCRAPE_TIMEOUT_S is left out, and assay_replicas says how many were summed.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the board's own process (and the driver that creates it) never loads torch
    from assay.serve.http.metrics import Snapshot

BOARD_NAME = "assay-metrics-board"
BOARD_NAMESPACE = "assay"
POLL_S = 5.0  # a reporter's long poll returns at least this often (to notice shutdown)
STALE_S = 3 * POLL_S
SCRAPE_TIMEOUT_S = 2.0

log = logging.getLogger("assay.serve")


class MetricsBoard:
    """The named actor the replicas meet at (async: polls wait on the actor's event loop, not a thread each)."""

    def __init__(self):
        self.epoch = 0
        self.latest: dict[str, tuple[int, list]] = {}  # replica id -> (epoch answered, snapshot)
        self.seen: dict[str, float] = {}  # replica id -> when it last polled or answered
        self._changed: asyncio.Condition | None = None

    @property
    def changed(self) -> asyncio.Condition:
        if self._changed is None:  # created on the actor's own event loop
            self._changed = asyncio.Condition()
        return self._changed

    async def poll(self, replica_id: str, answered: int) -> int:
        """Wait until a scrape newer than `answered` begins (or POLL_S passes); the current epoch."""
        self.seen[replica_id] = time.monotonic()
        async with self.changed:
            try:
                await asyncio.wait_for(self.changed.wait_for(lambda: self.epoch > answered), POLL_S)
            except asyncio.TimeoutError:
                pass
        self.seen[replica_id] = time.monotonic()
        return self.epoch

    async def answer(self, replica_id: str, epoch: int, snapshot: list) -> None:
        self.seen[replica_id] = time.monotonic()
        self.latest[replica_id] = (epoch, snapshot)
        async with self.changed:
            self.changed.notify_all()

    async def scrape(self) -> list[list]:
        """One snapshot per live replica, each taken after this call began."""
        now = time.monotonic()
        for replica_id in [r for r, seen in self.seen.items() if now - seen > STALE_S]:
            self.seen.pop(replica_id)
            self.latest.pop(replica_id, None)
        self.epoch += 1
        epoch = self.epoch
        expected = set(self.seen)

        def complete() -> bool:
            return all(self.latest.get(r, (0, None))[0] >= epoch for r in expected)

        async with self.changed:
            self.changed.notify_all()
            try:
                await asyncio.wait_for(self.changed.wait_for(complete), SCRAPE_TIMEOUT_S)
            except asyncio.TimeoutError:
                pass
        return [snapshot for r, (answered, snapshot) in self.latest.items() if r in expected and answered >= epoch]


def board(ray):
    """The board actor, created by the first caller (the `assay serve` driver, or a replica started otherwise)."""
    actor = ray.remote(num_cpus=0)(MetricsBoard)
    return actor.options(name=BOARD_NAME, namespace=BOARD_NAMESPACE, get_if_exists=True, max_concurrency=1000).remote()


def start_reporter(ray, board_handle, replica_id: str, snapshot) -> threading.Event:
    """A daemon thread answering every scrape with snapshot(); set the returned event to stop it."""
    stop = threading.Event()

    def report() -> None:
        answered = 0
        while not stop.is_set():
            try:
                epoch = ray.get(board_handle.poll.remote(replica_id, answered), timeout=POLL_S + 10)
                if epoch > answered:
                    board_handle.answer.remote(replica_id, epoch, snapshot())
                    answered = epoch
            except Exception as exc:  # the board restarting or the cluster shutting down: try again shortly
                log.debug("metrics reporter: %s", exc)
                stop.wait(1.0)

    threading.Thread(target=report, name="assay-metrics-reporter", daemon=True).start()
    return stop


async def scrape_all(board_handle, own: Snapshot) -> bytes:
    """The Prometheus text of the router's own snapshot and every engine replica's, summed (what /metrics
    answers under Ray Serve); assay_replicas counts the engine replicas."""
    from assay.serve.http.metrics import render_sum

    replicas = await board_handle.scrape.remote()
    return render_sum([*replicas, own], replicas=len(replicas))
