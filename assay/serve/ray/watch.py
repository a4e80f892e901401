"""Which engine replicas are alive, as the router sees them: the Serve controller's list of replicas (polled
every POLL_S), less those the router has itself seen die (a request's stream broke) and the controller has
not yet noticed. /health answers from it: ok, degraded (fewer live replicas than asked for: one is being
restarted) or, with none live, 503; with the requests the router has running on each replica.

A replica counts as lost once, whether the router saw it die under a request or it left the controller's
running set while idle.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

POLL_S = 0.5

log = logging.getLogger("assay.serve")


def _controller():
    # The Serve controller is a named actor; its get_serve_instance_details is what `serve status` and the
    # dashboard read (replica states and actor ids; serve.status() gives only counts).
    import ray
    from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

    return ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)


class ReplicaWatch:
    def __init__(self, app_name: str, deployment: str, asked: int, on_loss: Callable[[], None] = lambda: None):
        self.app_name, self.deployment, self.asked = app_name, deployment, asked
        self.on_loss = on_loss
        self.running: set[str] = set()  # actor ids the controller lists as RUNNING
        self.dead: set[str] = set()  # actor ids seen dead (by the router or the controller)
        self._controller = None

    @property
    def live(self) -> int:
        return len(self.running - self.dead)

    def lost(self, actor_id: str | None) -> None:
        """A request's replica died under it (actor_id as its ActorDiedError or Accepted message named it)."""
        if actor_id is None:
            return
        if actor_id not in self.dead:
            self.dead.add(actor_id)
            self.on_loss()

    def health(self, running: dict[str, int] | None = None) -> tuple[int, dict]:
        """(HTTP status, body) of /health; running: the engine requests the router has on each replica."""
        live = self.live
        body = {"status": "ok" if live >= self.asked else "degraded" if live else "unavailable",
                "replicas": {"live": live, "asked": self.asked, "running": dict(running or {})}}
        return (200 if live else 503), body

    def update(self, replicas: list[dict]) -> None:
        """The controller's replicas of the engine deployment (dicts with "actor_id" and "state")."""
        running = {r["actor_id"] for r in replicas if str(r.get("state", "")).rsplit(".", 1)[-1] == "RUNNING" and r.get("actor_id")}
        for actor_id in self.running - running:
            self.lost(actor_id)  # left the running set: killed while idle, or failed its health check
        listed = {r.get("actor_id") for r in replicas}
        self.dead &= listed | running  # forget ids the controller no longer lists
        self.running = running

    async def poll(self) -> None:
        if self._controller is None:
            self._controller = _controller()
        details = await self._controller.get_serve_instance_details.remote()
        app = (details.get("applications") or {}).get(self.app_name) or {}
        deployment = (app.get("deployments") or {}).get(self.deployment) or {}
        self.update(list(deployment.get("replicas") or []))

    async def run(self) -> None:
        """Poll until cancelled (the router's lifespan)."""
        while True:
            try:
                await self.poll()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the controller restarting: keep the last view, try again
                log.debug("replica watch: %s", exc)
            await asyncio.sleep(POLL_S)
