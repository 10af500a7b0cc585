"""Keep a group join that completed while no ``poll()`` awaited it (kafka-python 3.0.12).

kafka-python runs a member's JoinGroup + SyncGroup round as a task on its IO
thread; ``poll(timeout_ms)`` awaits it at most ``timeout_ms`` and leaves it in
flight when the time is up, so that the next ``poll()`` awaits the same round.
But if the round *completes* before the next ``poll()`` comes (its
SyncGroup answer arrives while the polling thread is between two calls:
descheduled on a loaded machine, or processing the records of the last poll),
that next ``poll()`` sees a finished task, drops its assignment unread and
sends a new JoinGroup. For the group's leader that is a new rebalance of the
whole group: the Kafka coordinator rebalances a stable group whenever its
leader rejoins. Every member then loses its partitions a second time, and a
member that had received records of its new partitions in between rewinds
them (its ``Consumer.generation`` goes up and its next commit fails) for no
change of membership. The transport contract, looped on a loaded machine,
showed exactly this (a CI run had failed on it once): member ``b`` joined;
generation 2 was assigned, the leader ``a`` sent a new JoinGroup without
applying its assignment, and generation 3 rewound what ``b`` had read of its
generation-2 partitions.

:func:`keep_finished_joins` makes the next ``poll()`` take the assignment of
the finished round instead, as the Java client does (its join future is reset
only once its result was used). It wraps two coroutines of the consumer's
group coordinator on that one instance (kafka-python itself is not patched):

* the join round (``_do_join_and_sync_async``) remembers the assignment of a
  round that succeeded, with the generation (member id and generation id) the
  JoinGroup answer gave;
* a round started again while that assignment is unused (the coordinator
  skipped its join preparation, so it is the same rebalance) returns it at
  once, provided the coordinator still holds that generation (nothing reset
  it since); a stale one is dropped and the round is sent anew;
* the join preparation (``_on_join_prepare_async``, run once per new
  rebalance, before the first round) forgets an assignment kept from before.

If the group moved on meanwhile, the member's next heartbeat or commit meets
the new generation and it rejoins, as after any rebalance that follows a join.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["keep_finished_joins"]

log = logging.getLogger("pipeline.transport.kafka")


def keep_finished_joins(consumer: Any) -> bool:
    """Install the wrappers on ``consumer`` (a ``kafka.KafkaConsumer``); ``False`` (one warning) if its
    coordinator lacks the coroutines this relies on (another kafka-python release: nothing is changed)."""
    coordinator = getattr(consumer, "_coordinator", None)
    join: Callable[[], Awaitable[Any]] | None = getattr(coordinator, "_do_join_and_sync_async", None)
    prepare: Callable[..., Awaitable[Any]] | None = getattr(coordinator, "_on_join_prepare_async", None)
    if coordinator is None or join is None or prepare is None or not hasattr(coordinator, "_generation"):
        log.warning(
            "this kafka-python has no join round to wrap: a group join that completes between two polls "
            "may be repeated (one more rebalance)"
        )
        return False
    kept: list[tuple[Any, Any]] = []  # at most one (generation, assignment) of a round no poll() took

    async def join_and_sync() -> Any:
        if kept:
            generation, assignment = kept.pop()
            if coordinator._generation is generation:
                log.debug(
                    "group %s: taking the assignment of the join round that completed between two polls",
                    coordinator.group_id,
                )
                return assignment
        assignment = await join()
        kept.append((coordinator._generation, assignment))
        return assignment

    async def prepare_join(*args: Any, **kwargs: Any) -> Any:
        kept.clear()
        return await prepare(*args, **kwargs)

    coordinator._do_join_and_sync_async = join_and_sync
    coordinator._on_join_prepare_async = prepare_join
    return True
