"""streamledger's engine: typed keys, graphs of nodes, managed stream endpoints, per-message transactions.

Storage is behind the :class:`StreamHooks` protocol; :class:`MemoryStore` is
the in-process reference store and ``ledger`` supplies the durable one.
"""

from ._aspects import Aspect as Aspect
from ._aspects import Proceed as Proceed
from ._aspects import Retry as Retry
from ._aspects import Timeout as Timeout
from ._aspects import describe_aspect as describe_aspect
from ._backoff import Backoff as Backoff
from ._checkpoint import ExecCheckpoint as ExecCheckpoint
from ._codec import CODEC_ID as CODEC_ID
from ._codec import CODEC_VERSION as CODEC_VERSION
from ._context import NodeContext as NodeContext
from ._context import RetryBoundary as RetryBoundary
from ._dead_letter import DeadLetter as DeadLetter
from ._errors import CheckpointError as CheckpointError
from ._errors import CheckpointScopeFailure as CheckpointScopeFailure
from ._errors import CompactedHistoryError as CompactedHistoryError
from ._errors import ConfirmedFailureError as ConfirmedFailureError
from ._errors import ExecutionCancelledError as ExecutionCancelledError
from ._errors import GraphError as GraphError
from ._errors import GroupBusyError as GroupBusyError
from ._errors import HandlerContractError as HandlerContractError
from ._errors import KeyedStateError as KeyedStateError
from ._errors import MessageExhaustedError as MessageExhaustedError
from ._errors import OutputError as OutputError
from ._errors import OutputLimitError as OutputLimitError
from ._errors import PartitionError as PartitionError
from ._errors import PayloadTypeError as PayloadTypeError
from ._errors import RecordDecodeError as RecordDecodeError
from ._errors import RestorePlanError as RestorePlanError
from ._errors import ScopeInUseError as ScopeInUseError
from ._errors import SequenceError as SequenceError
from ._errors import SkippedInputError as SkippedInputError
from ._errors import SourceNotResumableError as SourceNotResumableError
from ._errors import StaleGenerationError as StaleGenerationError
from ._errors import StoreDamagedError as StoreDamagedError
from ._errors import StrayCancellationError as StrayCancellationError
from ._errors import StreamClosedError as StreamClosedError
from ._errors import StreamFailedError as StreamFailedError
from ._errors import StreamFinishedError as StreamFinishedError
from ._errors import StreamsError as StreamsError
from ._errors import StreamStateError as StreamStateError
from ._errors import UnknownStreamError as UnknownStreamError
from ._events import Child as Child
from ._events import ExecutionEvent as ExecutionEvent
from ._events import ExecutionResult as ExecutionResult
from ._events import ExecutionSnapshot as ExecutionSnapshot
from ._events import Finished as Finished
from ._events import GraphStarted as GraphStarted
from ._events import NodeSnapshot as NodeSnapshot
from ._events import NodeStatus as NodeStatus
from ._events import Running as Running
from ._events import Waiting as Waiting
from ._execution import Execution as Execution
from ._execution import run_graph as run_graph
from ._follow import Wakeups as Wakeups
from ._follow import follow_stream as follow_stream
from ._graph import Graph as Graph
from ._graph import NodeSpec as NodeSpec
from ._graph import PortSpec as PortSpec
from ._graph import Topology as Topology
from ._graph import TopologyNode as TopologyNode
from ._groups import move_group as move_group
from ._groups import remove_group as remove_group
from ._handle import HandleResult as HandleResult
from ._handle import MessageTx as MessageTx
from ._handle import PartitionedResult as PartitionedResult
from ._handle import handle_messages as handle_messages
from ._keyed import KeyedState as KeyedState
from ._keyed import KeyedTx as KeyedTx
from ._keys import Key as Key
from ._keys import NoValue as NoValue
from ._keys import NoValueType as NoValueType
from ._keys import Stream as Stream
from ._partition_rules import MAX_PARTITIONS as MAX_PARTITIONS
from ._partitions import PartitionedReader as PartitionedReader
from ._partitions import PartitionedStream as PartitionedStream
from ._partitions import PartitionedWriter as PartitionedWriter
from ._public import publish as _publish
from ._scope import StreamScope as StreamScope
from ._scope import open_scope as open_scope
from ._store._hooks import StreamHooks as StreamHooks
from ._store._memory import MemoryStore as MemoryStore
from ._store._records import GroupFrontier as GroupFrontier
from ._store._records import StreamRef as StreamRef
from ._stream import GroupSnapshot as GroupSnapshot
from ._stream import ManagedStream as ManagedStream
from ._stream import Message as Message
from ._stream import StreamReader as StreamReader
from ._stream import StreamSnapshot as StreamSnapshot
from ._stream import StreamWriter as StreamWriter
from ._version import __version__ as __version__

__all__ = [
    "Backoff",
    "DeadLetter",
    "CODEC_ID",
    "CODEC_VERSION",
    "Aspect",
    "CheckpointError",
    "CheckpointScopeFailure",
    "Child",
    "ConfirmedFailureError",
    "ExecCheckpoint",
    "Execution",
    "ExecutionCancelledError",
    "ExecutionEvent",
    "ExecutionResult",
    "ExecutionSnapshot",
    "Finished",
    "Graph",
    "GraphError",
    "GraphStarted",
    "CompactedHistoryError",
    "GroupBusyError",
    "HandlerContractError",
    "GroupFrontier",
    "GroupSnapshot",
    "HandleResult",
    "KeyedState",
    "MAX_PARTITIONS",
    "PartitionedReader",
    "PartitionedResult",
    "PartitionedStream",
    "PartitionedWriter",
    "KeyedTx",
    "Key",
    "ManagedStream",
    "MemoryStore",
    "Message",
    "MessageExhaustedError",
    "MessageTx",
    "NoValue",
    "NoValueType",
    "NodeContext",
    "NodeSnapshot",
    "NodeSpec",
    "NodeStatus",
    "OutputError",
    "OutputLimitError",
    "PayloadTypeError",
    "PortSpec",
    "Proceed",
    "RecordDecodeError",
    "RestorePlanError",
    "Retry",
    "RetryBoundary",
    "Running",
    "SequenceError",
    "SkippedInputError",
    "SourceNotResumableError",
    "StaleGenerationError",
    "KeyedStateError",
    "PartitionError",
    "StoreDamagedError",
    "StrayCancellationError",
    "Stream",
    "StreamClosedError",
    "StreamFailedError",
    "StreamFinishedError",
    "StreamHooks",
    "StreamReader",
    "StreamRef",
    "StreamScope",
    "StreamSnapshot",
    "ScopeInUseError",
    "StreamStateError",
    "StreamWriter",
    "StreamsError",
    "Timeout",
    "Topology",
    "TopologyNode",
    "UnknownStreamError",
    "Waiting",
    "Wakeups",
    "describe_aspect",
    "handle_messages",
    "move_group",
    "follow_stream",
    "open_scope",
    "remove_group",
    "run_graph",
]

_publish(globals(), __all__)  # tracebacks and docs name the public module
