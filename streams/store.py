"""For authors of stores: everything a :class:`~streams.StreamHooks` implementation is built from.

A store answers the seven calls of :class:`~streams.StreamHooks`, each one atomic
record, or (``describe``) a read (see the protocol's docstrings). The rules
every store must apply (contiguous sequences, generation fencing, frontiers that never move back,
budgets that only advance on confirmed failures, terminals that do not
regress, compaction) are written once here, as operations over a
:class:`RecordView`: a store opens one transaction per call, wraps it in a
view of its records, runs the operation of that call, and commits only if
it returned. :class:`~streams.MemoryStore`, the in-process reference
store, does so over dicts, the LMDB ledger over an LMDB write transaction
and the PostgreSQL ledger over a server transaction, so they cannot drift;
a new store that does the same keeps the same ledger.
Prove it with the conformance suite: :func:`streams.testing.check_stream_store`.

The pieces:

* the records of the hook protocol (:class:`~streams.StreamHooks`, whose
  :class:`~streams.StreamRef` and :class:`~streams.GroupFrontier` are
  :mod:`streams`'s, as programs use them too): :class:`StreamOpen`,
  :class:`StreamOpened`, :class:`AppendBatch`, :class:`StoredMessage`,
  :class:`MessageRef`, :class:`MessageOpen`, :class:`MessageAttempt`,
  :class:`MessageFail`, :class:`MessageCommit`, :class:`OutputBatch`,
  :class:`StreamFinish`;
* the records a store keeps besides those: :class:`StreamDescriptor`,
  :class:`AttemptRecord`, keyed by :class:`AttemptKey`;
* the record view a store supplies: :class:`RecordView` (its isolation:
  one writer at a time, or serializable transactions), and its shared base
  :class:`CachedView`, which caches every record, reads them in batches
  (:meth:`CachedView.load`) and writes each changed one once;
* the operations, one per hook call: :func:`open_stream`, :func:`append`,
  :func:`open_message`, :func:`fail_message`, :func:`commit`,
  :func:`finish`, :func:`describe`; and, for stores that let operators
  repair consumer groups (:class:`GroupHooks`), :func:`change_group` over
  a :class:`GroupChange`; for stores that keep state per key
  (:class:`KeyedHooks`), :func:`read_keyed` over a :class:`KeyedRead` and
  :func:`list_keyed` over a :class:`KeyedRange`, whose writes
  (:class:`KeyedWrite`, keys of at most :data:`MAX_KEY_BYTES`) a
  :class:`MessageCommit` carries, and the listing's :class:`KeyedEntry`;
* the node hooks, the same way: :class:`CheckpointHooks` and its records
  (:class:`CheckpointAttemptRequest`, :class:`CheckpointAttempt`, :class:`AttemptFailure`,
  :class:`CheckpointOutput`, :class:`NodeCheckpoint`,
  :class:`CheckpointChild`, :class:`CheckpointChildOpened`,
  :class:`CheckpointCommit`; :data:`COMPLETE_CHAIN`), the records a store
  keeps (:class:`NodeAttemptRecord`, :class:`ScopeRecord`), the view it supplies
  (:class:`NodeView`), the operations :func:`open_attempt`,
  :func:`fail_attempt`, :func:`open_child`, :func:`commit_node`, and the
  shape of the scopes they give (:func:`child_scope`,
  :func:`enclosing_scope`, which the engine checks a restored Sub alias's
  stream against), and :func:`check_confirmed`, which a store runs on the
  records a resume reads;
* the integrity rules a store applies to its decoded records when it opens
  and in its check: :func:`stream_id_problems`, :func:`group_problems`,
  :func:`tail_floor`, :func:`tail_problems`, :func:`min_frontier`,
  :func:`node_problems`, :func:`checkpoint_problems`.

This module also gives packages built on streams the library's tracing
vocabulary (:class:`SPAN`, :class:`EVENT`, :class:`METRIC`, :class:`ATTR`,
:func:`span`, :func:`tracer`, :func:`failed`) and its metric instruments
(:data:`INSTRUMENTS`), :func:`single_error` (a task group's lone
error raised as itself), :func:`type_name` (a type named by its shape, as
descriptors and fingerprints name it), :func:`qualified_type_name` (the
module-qualified name they may hold too) and
:func:`type_differences` (what differs inside two such names), :func:`to_plain` (a stored value as plain data,
for inspection), :func:`key_to_plain` (a stored keyed-state key, the same
way), :func:`live_payload` and :func:`expires_at` (a stored keyed value's
MessagePack while it lives, and when it is gone), :func:`codec_for` (the codec of a type) and
:func:`publish` (name exported objects after their package).
"""

from ._codec import codec_for as codec_for
from ._codec import to_plain as to_plain
from ._expiry import expires_at as expires_at
from ._expiry import live_payload as live_payload
from ._keyed import key_to_plain as key_to_plain
from ._metrics import INSTRUMENTS as INSTRUMENTS
from ._metrics import destination_attributes as destination_attributes
from ._partitions import partition_for as partition_for
from ._partitions import partition_name as partition_name
from ._public import publish as publish
from ._store._hooks import CheckpointHooks as CheckpointHooks
from ._store._hooks import FollowHooks as FollowHooks
from ._store._hooks import GroupHooks as GroupHooks
from ._store._hooks import KeyedHooks as KeyedHooks
from ._store._integrity import checkpoint_problems as checkpoint_problems
from ._store._integrity import group_problems as group_problems
from ._store._integrity import node_problems as node_problems
from ._store._integrity import stream_id_problems as stream_id_problems
from ._store._integrity import tail_floor as tail_floor
from ._store._integrity import tail_problems as tail_problems
from ._store._layouts import AttemptRecord as AttemptRecord
from ._store._layouts import StreamDescriptor as StreamDescriptor
from ._store._marks import appended_at as appended_at
from ._store._node_records import COMPLETE_CHAIN as COMPLETE_CHAIN
from ._store._node_records import AttemptFailure as AttemptFailure
from ._store._node_records import CheckpointAttempt as CheckpointAttempt
from ._store._node_records import CheckpointAttemptRequest as CheckpointAttemptRequest
from ._store._node_records import CheckpointChild as CheckpointChild
from ._store._node_records import CheckpointChildOpened as CheckpointChildOpened
from ._store._node_records import CheckpointCommit as CheckpointCommit
from ._store._node_records import CheckpointOutput as CheckpointOutput
from ._store._node_records import Conclusion as Conclusion
from ._store._node_records import NodeCheckpoint as NodeCheckpoint
from ._store._node_records import Terminal as Terminal
from ._store._nodes import NodeAttemptRecord as NodeAttemptRecord
from ._store._nodes import NodeView as NodeView
from ._store._nodes import ScopeRecord as ScopeRecord
from ._store._nodes import check_confirmed as check_confirmed
from ._store._nodes import child_scope as child_scope
from ._store._nodes import commit_node as commit_node
from ._store._nodes import destination_template as destination_template
from ._store._nodes import enclosing_scope as enclosing_scope
from ._store._nodes import fail_attempt as fail_attempt
from ._store._nodes import open_attempt as open_attempt
from ._store._nodes import open_child as open_child
from ._store._nodes import parse_attempt_scope as parse_attempt_scope
from ._store._operations import append as append
from ._store._operations import change_group as change_group
from ._store._operations import commit as commit
from ._store._operations import describe as describe
from ._store._operations import fail_message as fail_message
from ._store._operations import finish as finish
from ._store._operations import list_keyed as list_keyed
from ._store._operations import open_message as open_message
from ._store._operations import open_stream as open_stream
from ._store._operations import read_keyed as read_keyed
from ._store._operations import read_stream as read_stream
from ._store._records import MAX_KEY_BYTES as MAX_KEY_BYTES
from ._store._records import AppendBatch as AppendBatch
from ._store._records import GroupChange as GroupChange
from ._store._records import KeyedEntry as KeyedEntry
from ._store._records import KeyedRange as KeyedRange
from ._store._records import KeyedRead as KeyedRead
from ._store._records import KeyedWrite as KeyedWrite
from ._store._records import MessageAttempt as MessageAttempt
from ._store._records import MessageCommit as MessageCommit
from ._store._records import MessageFail as MessageFail
from ._store._records import MessageOpen as MessageOpen
from ._store._records import MessageRef as MessageRef
from ._store._records import OutputBatch as OutputBatch
from ._store._records import StoredMessage as StoredMessage
from ._store._records import StreamFinish as StreamFinish
from ._store._records import StreamOpen as StreamOpen
from ._store._records import StreamOpened as StreamOpened
from ._store._records import StreamRead as StreamRead
from ._store._rules import min_frontier as min_frontier
from ._store._view import AttemptKey as AttemptKey
from ._store._view import CachedView as CachedView
from ._store._view import GroupKey as GroupKey
from ._store._view import RecordView as RecordView
from ._tracing import ATTR as ATTR
from ._tracing import EVENT as EVENT
from ._tracing import METRIC as METRIC
from ._tracing import SPAN as SPAN
from ._tracing import failed as failed
from ._tracing import span as span
from ._tracing import tracer as tracer
from ._type_names import qualified_type_name as qualified_type_name
from ._type_names import type_differences as type_differences
from ._type_names import type_name as type_name
from ._unwrap import single_error as single_error

__all__ = [
    "ATTR",
    "INSTRUMENTS",
    "METRIC",
    "COMPLETE_CHAIN",
    "EVENT",
    "SPAN",
    "AppendBatch",
    "AttemptKey",
    "AttemptRecord",
    "CachedView",
    "CheckpointAttempt",
    "CheckpointAttemptRequest",
    "CheckpointChild",
    "CheckpointChildOpened",
    "AttemptFailure",
    "CheckpointCommit",
    "CheckpointHooks",
    "CheckpointOutput",
    "Conclusion",
    "GroupChange",
    "GroupHooks",
    "GroupKey",
    "KeyedEntry",
    "FollowHooks",
    "KeyedHooks",
    "KeyedRange",
    "KeyedRead",
    "KeyedWrite",
    "MAX_KEY_BYTES",
    "MessageAttempt",
    "MessageCommit",
    "MessageFail",
    "MessageOpen",
    "MessageRef",
    "NodeAttemptRecord",
    "NodeCheckpoint",
    "NodeView",
    "OutputBatch",
    "RecordView",
    "ScopeRecord",
    "StoredMessage",
    "StreamDescriptor",
    "appended_at",
    "StreamFinish",
    "StreamOpen",
    "StreamOpened",
    "StreamRead",
    "Terminal",
    "append",
    "change_group",
    "check_confirmed",
    "child_scope",
    "codec_for",
    "commit",
    "commit_node",
    "describe",
    "destination_attributes",
    "destination_template",
    "enclosing_scope",
    "fail_attempt",
    "fail_message",
    "failed",
    "finish",
    "list_keyed",
    "min_frontier",
    "checkpoint_problems",
    "group_problems",
    "node_problems",
    "stream_id_problems",
    "tail_floor",
    "tail_problems",
    "open_attempt",
    "open_child",
    "parse_attempt_scope",
    "open_message",
    "open_stream",
    "key_to_plain",
    "expires_at",
    "live_payload",
    "publish",
    "read_keyed",
    "read_stream",
    "single_error",
    "partition_for",
    "partition_name",
    "qualified_type_name",
    "type_differences",
    "type_name",
    "span",
    "to_plain",
    "tracer",
]
