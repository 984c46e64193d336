"""Node choice: which healthy compute node gets a job.

Round-robin over the healthy nodes sorted by id, so that consecutive submissions spread evenly
and predictably (the original iterated a Go map, so its round robin was random). A retried job
prefers a node other than the one it failed on; an instance-pinned job goes to its instance's
node or nowhere. The registry client supplies the facts; this module owns the rules.
"""

from __future__ import annotations

import itertools
import threading

from .errors import PlacementError
from .registry import Registry

NO_HEALTHY_NODES = "no healthy compute nodes"


class Placement:
    """Chooses nodes for jobs."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self._turn = itertools.count()
        self._turn_lock = threading.Lock()

    def place(self, instance_id: str = "", avoid: str | None = None) -> str:
        """The node for a new (or retried) job; raises PlacementError with the spec's text.

        `avoid` is the node a retried job failed on: another healthy node is preferred, but
        when it is the only one the job goes back to it.
        """
        if instance_id:
            return self.instance_node(instance_id)
        healthy = self.registry.nodes().healthy
        if avoid is not None and len(healthy) > 1 and avoid in healthy:
            healthy = tuple(node for node in healthy if node != avoid)
        if not healthy:
            raise PlacementError(NO_HEALTHY_NODES)
        with self._turn_lock:
            turn = next(self._turn)
        return healthy[turn % len(healthy)]

    def instance_node(self, instance_id: str) -> str:
        """The node of a running instance whose node is healthy."""
        instance = self.registry.instance(instance_id)
        status = instance.get("status")
        if status != "running":
            raise PlacementError(f"instance {instance_id} not running (status={status})")
        node_id = instance.get("node_id")
        if not isinstance(node_id, str) or not self.registry.nodes().is_healthy(node_id):
            raise PlacementError(f"node {node_id} for instance {instance_id} is not healthy")
        return node_id
