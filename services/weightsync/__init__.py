"""Weight sync: how each new policy version goes from the learner to the rollout engines, both ends
(docs/architecture.md, "Weight sync"). Services import this face, never its modules.

The learner's end publishes (`build_transport` → a `WeightTransport`, over a `WeightPublisher`): after
each update it delivers the version to the engines and announces a `WeightVersion` {version, uri,
sha256} on Redis (`announce`). The rollout worker's end loads (`WeightLoader`): it polls the
announcement, fetches and verifies what it names, and reloads its engine in place through the engine's
reload protocol (`vllm_ext`: `WORKER_EXTENSION`, `reload_engine`, `receive_broadcast`). Two wires, chosen
by the learner's `weights.transport` (`PublishSettings`; the worker's section is `LoadSettings`):

- snapshot: a safetensors snapshot directory per version with a manifest of per-chunk BLAKE3 digests,
  whose sha256 is the announced digest (`snapshot_digest`); on a shared volume or served by the learner
  over HTTP (`weights_app` ↔ `fetch_snapshot`); the engine reads it verified (`read_verified`) and loads
  those very bytes. A version goes out full or as a delta against the version before (`VersionChain`,
  `[learner.weights.delta]`: the values whose bits changed, with the checksum of every resulting tensor;
  `delta.py`), in a directory of the same kind; `WeightVersion.base` names a delta's base, and every full
  version is recorded (`newest_full`). A worker one version behind applies the delta to its engine's
  verified copy of the version it runs (`apply_engine_delta`, `BaseWeights`); any other worker starts
  from the newest full and applies the deltas after it. `materialize` rebuilds the newest version as a
  full snapshot for what reads a run's weights afterwards.
- broadcast: tensors sent in buckets from rank 0 over a torch.distributed group the learner forms with
  the engines (`Broadcaster` ↔ `Receiver`), an in-band xxh3 digest signed with the run's weight token;
  a version goes out as a delta (`WireDelta`: the same encoding) when every receiver holds the version
  before. Each generation of the group forms from the receivers that join it (`rendezvous`); a recovery
  snapshot every `snapshot_every` versions and after any failed broadcast (`record_snapshot`), from which
  a worker that missed one catches up (`latest_snapshot_fenced`), acknowledging what it runs.

What the protocol guarantees:

- Only verified bytes are loaded, and a delta only onto the version it was made against: a delta whose
  base is not the version an engine holds, or whose resulting tensors fail their published checksums, is
  refused with the engine's weights unchanged, and the worker falls back to the newest full version.
- Only verified bytes are loaded. A snapshot is checked against the announced digest as the engine reads
  it (cryptographic hashes: whoever can write the volume cannot pass other weights for the announced
  ones); a broadcast against the sender's digest and signature. Anything refused leaves the engine on the
  weights it had (`SnapshotError`, `DigestMismatch`).
- Only the run's learner is obeyed. Announcements and recovery records carry the writer's fencing token
  and are refused in Redis from an older one (`FencedOff`, or `LeaseLost` with the lease); a worker
  refuses an announcement with an older token than it has seen, or one the learner never published
  (`is_published`). Versions never go backwards except by `rollback` to a published one.
- No worker blocks the learner. Snapshots and deltas are pulled: the learner writes and announces, and
  waits for no worker. A broadcast receiver that is dead, late or slow fails that version (`BroadcastFailed`,
  after at most `timeout_s`): training goes on, the next generation forms from the receivers that join it
  within `join_window_s`, the worker catches up from a snapshot and joins a later generation; a receiver
  that stays stopped costs the learner the timeout of the version in flight only.
- A worker the learner finds out of sync reloads on request (`request_resync` → `take_resync`).

Metrics come in as callbacks (the loader's `on_loaded`, `on_refused`, `on_form`, `stages`; the Redis
link's) or as figures (each transport's `figures` of its last publication: the share of values changed,
the bytes written); the
fault suite's hook as a `searchr1.core.faults.Faults` object. torch and vLLM are imported inside the
functions that need them (the learner and the engines have them): importing this face needs neither.
"""

from searchr1.weightsync.announce import (
    FencedOff,
    announce,
    announced_fence,
    is_published,
    latest,
    latest_fenced,
    newest_full,
    published,
    request_resync,
    resync_key,
    rollback,
    take_resync,
)
from searchr1.weightsync.apply import BaseWeights
from searchr1.weightsync.broadcast import (
    WEIGHTS_KEY_ENV,
    Broadcaster,
    BroadcastFailed,
    WireDelta,
    parse_group_uri,
)
from searchr1.weightsync.buckets import DigestMismatch
from searchr1.weightsync.catchup import (
    acknowledge,
    acknowledgements,
    latest_snapshot,
    latest_snapshot_fenced,
    record_snapshot,
)
from searchr1.weightsync.delta import (
    DELTA_FILE,
    Delta,
    DeltaRefused,
    Diff,
    checksum,
    checksums,
    diff,
)
from searchr1.weightsync.fetch import fetch_snapshot, prune_copies
from searchr1.weightsync.loader import Reloadable, WeightLoader, is_broadcast
from searchr1.weightsync.manifest import (
    MANIFEST,
    SnapshotError,
    manifest_digest,
    snapshot_digest,
    snapshot_files,
    snapshot_listing,
)
from searchr1.weightsync.publish import WEIGHTS_FILE, WeightPublisher, drop_shared, weights_app
from searchr1.weightsync.read import read_verified
from searchr1.weightsync.rebuild import materialize, newest_version, version_tensors
from searchr1.weightsync.receiver import Receiver
from searchr1.weightsync.safetensors import snapshot_tensors, write_safetensors
from searchr1.weightsync.settings import BroadcastSettings, DeltaSettings, LoadSettings, PublishSettings
from searchr1.weightsync.transport import (
    BroadcastTransport,
    SnapshotTransport,
    WeightTransport,
    build_transport,
)
from searchr1.weightsync.versions import Plan, VersionChain
from searchr1.weightsync.vllm_ext import (
    WORKER_EXTENSION,
    LoadTimes,
    apply_engine_delta,
    base_of,
    receive_broadcast,
    reload_engine,
)

__all__ = [
    # settings sections
    "PublishSettings", "BroadcastSettings", "DeltaSettings", "LoadSettings",
    # the announcement, its record and re-sync requests (Redis)
    "announce", "latest", "latest_fenced", "published", "is_published", "newest_full", "rollback",
    "announced_fence",
    "FencedOff", "request_resync", "take_resync", "resync_key",
    # the learner's end
    "WeightTransport", "SnapshotTransport", "BroadcastTransport", "build_transport", "WeightPublisher",
    "weights_app", "drop_shared", "WEIGHTS_FILE", "VersionChain", "Plan",
    # deltas between versions
    "diff", "Diff", "checksum", "checksums", "Delta", "BaseWeights", "DeltaRefused", "DELTA_FILE",
    "materialize", "newest_version", "version_tensors",
    # the worker's end
    "WeightLoader", "Reloadable", "is_broadcast",
    # the engine's reload protocol (inside vLLM's worker, called through collective_rpc)
    "WORKER_EXTENSION", "reload_engine", "apply_engine_delta", "receive_broadcast", "LoadTimes", "WEIGHTS_KEY_ENV",
    "base_of",
    # the snapshot wire
    "snapshot_digest", "snapshot_files", "snapshot_listing", "fetch_snapshot", "prune_copies", "read_verified",
    "MANIFEST", "manifest_digest",
    "write_safetensors", "snapshot_tensors", "SnapshotError",
    # the broadcast wire and its catch-up
    "Broadcaster", "WireDelta", "Receiver", "parse_group_uri", "BroadcastFailed", "DigestMismatch", "record_snapshot",
    "latest_snapshot", "latest_snapshot_fenced", "acknowledge", "acknowledgements",
]
