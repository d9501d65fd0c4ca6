"""What a stream's partitions may be: the bound on their number and the check of a declaration.

Below both :mod:`streams._keys`, which checks a key's partitions when it is
declared, and :mod:`streams._partitions`, which opens them.
"""

from __future__ import annotations

from typing import Final

from ._errors import PartitionError

__all__ = ["MAX_PARTITIONS", "check_partitions"]

#: The most partitions a stream may have.
MAX_PARTITIONS: Final = 4096


def check_partitions(partitions: object, partition_key: object) -> int:
    """The number of partitions asked for, refused unless it is 1 to MAX_PARTITIONS with a key function."""
    if (
        not isinstance(partitions, int)
        or isinstance(partitions, bool)
        or not 1 <= partitions <= MAX_PARTITIONS
    ):
        raise PartitionError(f"a stream has 1 to {MAX_PARTITIONS} partitions, not {partitions!r}")
    if not callable(partition_key):
        raise PartitionError(
            "a partitioned stream takes partition_key, a function of a message giving its key, "
            f"not {partition_key!r}"
        )
    return partitions
