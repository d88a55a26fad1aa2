"""The Redis delivery contract between the learner and the rollout workers, both ends (docs/architecture.md,
"Streams"). Services import this face, never its modules.

Two streams under `searchr1:{run}:` (`StreamKeys`), each one pydantic wire model per entry:

- `tasks` (`tasks_stream`, `Task`): the producer is the learner's dispatcher; the consumers are the
  rollout workers, in consumer group `TASKS_GROUP`. A worker acks a task only after its group is
  published.
- `trajectories` (`trajectories_stream`, `TrajectoryGroup`): the producers are the rollout workers; the
  consumer is the learner (rank 0), in group `TRAJECTORIES_GROUP`. The learner acks a group only after
  the step that trained it is checkpointed.

What the contract guarantees, to both ends:

- At-least-once delivery. An entry stays pending until its consumer acks it; one idle past the
  visibility timeout is reclaimed by another consumer (`TypedStream.reclaim`), and a restarted consumer
  re-reads its own (`reread_own`). A consumer that holds an entry heartbeats it (`Held`), so only a dead
  or hung consumer's entries are reclaimed; one it abandons is released for the next reclaim at once.
  A publish whose reply was lost may be applied twice: task ids make replays harmless at the learner.
- Nothing malformed reaches a consumer, nothing is lost silently. An entry that does not decode, or that
  was delivered `max_deliveries` times without an ack, goes to the dead stream with its reason and is
  acked in the same atomic step (`dead_letters`: `read_dead`, `redrive`); a consumer may refuse a valid
  entry the same way (`dead_letter`). `TypedStream.buried` counts what a stream buried on its own;
  `TypedStream.burials()` reads back what any process buried of it, so its producer can replace it (the
  learner's dispatcher replaces the tasks the rollout workers dead-letter).
- One learner per run. The learner holds the run's `Lease`; its acks and dead letters are checked
  against the lease's fencing token inside Redis, in the script that writes them, so a stale learner's
  writes are refused (`LeaseLost`), not applied.
- Bounded memory. Entries every consumer group has acked are deleted (`trim_every`, one atomic script);
  the dead stream is capped at about `DEAD_MAXLEN` entries, each bounded in bytes.
- Redis outages are waited through. Every command of a stream built with a `RedisLink` is retried while
  Redis is away or refusing writes for now; the link says whether Redis is up (the services' readiness).

What it does not decide: when to ack, how many entries to keep in flight, what to do with an entry —
that is each service's loop. `connect` makes the Redis client every service uses.
"""

from searchr1.streams.dead_letters import (
    DEAD_MAXLEN,
    DEAD_PAYLOAD_MAX_BYTES,
    PAYLOAD_FIELD,
    Burials,
    DeadLetter,
    read_dead,
    redrive,
)
from searchr1.streams.delivery import Entry, StreamBase
from searchr1.streams.held import Held
from searchr1.streams.keys import TASKS_GROUP, TRAJECTORIES_GROUP, StreamKeys, format_id, parse_id, text
from searchr1.streams.lease import FENCE_CHECK, Lease, LeaseHeld, LeaseLost, default_holder
from searchr1.streams.link import SOCKET_TIMEOUT_S, Call, RedisLink, connect, direct, refusal_kind
from searchr1.streams.redelivery import TypedStream, tasks_stream, trajectories_stream
from searchr1.streams.trim import GroupView, group_views, safe_min_id, trim_acked

__all__ = [
    # the run's names
    "StreamKeys", "TASKS_GROUP", "TRAJECTORIES_GROUP", "text", "parse_id", "format_id",
    # typed streams and their entries
    "TypedStream", "StreamBase", "Entry", "tasks_stream", "trajectories_stream", "PAYLOAD_FIELD",
    # the consumer's held entries
    "Held",
    # the dead stream
    "DeadLetter", "read_dead", "redrive", "DEAD_MAXLEN", "DEAD_PAYLOAD_MAX_BYTES", "Burials",
    # trimming
    "trim_acked", "safe_min_id", "group_views", "GroupView",
    # one learner per run
    "Lease", "LeaseHeld", "LeaseLost", "FENCE_CHECK", "default_holder",
    # the link to Redis
    "RedisLink", "connect", "refusal_kind", "Call", "direct", "SOCKET_TIMEOUT_S",
]
