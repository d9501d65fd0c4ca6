"""``python -m tests.ledger.creation_child LEDGER STEP [SYSCALL]``: create LEDGER and be killed inside it.

At the creation step STEP (the ``on_creation_step`` hook of
:meth:`ledger.LedgerEnv.open`) the child kills itself with SIGKILL. Given
SYSCALL, it instead has the kernel kill it at its next call of that system
call (a seccomp filter that kills the process), which lands inside LMDB's
own work: its lock file sized, its data file read, its meta pages or a
commit's pages written, a commit's fsync. Prints ``created`` if it was
never killed, which the test takes for a failure.
"""

from __future__ import annotations

import ctypes
import os
import platform
import resource
import signal
import struct
import sys
from pathlib import Path
from typing import Final

from ledger import LedgerEnv

#: The system calls a kill can land on, by machine (the kernel's numbers for each).
SYSCALLS: Final = {
    "x86_64": {"ftruncate": 77, "pread64": 17, "pwrite64": 18, "writev": 20, "fdatasync": 75},
    "aarch64": {"ftruncate": 46, "pread64": 67, "pwrite64": 68, "writev": 66, "fdatasync": 83},
}

_PR_SET_NO_NEW_PRIVS: Final = 38
_PR_SET_SECCOMP: Final = 22
_SECCOMP_MODE_FILTER: Final = 2
_SECCOMP_RET_KILL_PROCESS: Final = 0x80000000
_SECCOMP_RET_ALLOW: Final = 0x7FFF0000
_LOAD_SYSCALL_NUMBER: Final = 0x20  # BPF_LD | BPF_W | BPF_ABS, at offset 0 of seccomp_data
_JUMP_IF_EQUAL: Final = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_RETURN: Final = 0x06  # BPF_RET | BPF_K


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def kill_at_next(syscall: str) -> None:
    """Have the kernel kill this process, at once and for good, when it next calls ``syscall``."""
    number = SYSCALLS[platform.machine()][syscall]
    instructions = [
        (_LOAD_SYSCALL_NUMBER, 0, 0, 0),
        (_JUMP_IF_EQUAL, 0, 1, number),
        (_RETURN, 0, 0, _SECCOMP_RET_KILL_PROCESS),
        (_RETURN, 0, 0, _SECCOMP_RET_ALLOW),
    ]
    code = ctypes.create_string_buffer(b"".join(struct.pack("=HBBI", *i) for i in instructions))
    program = _Program(len(instructions), ctypes.addressof(code))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(program), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")


def main(path: Path, step: str, syscall: str | None) -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a kill by seccomp would dump core

    def on_creation_step(name: str) -> None:
        if name != step:
            return
        if syscall is None:
            os.kill(os.getpid(), signal.SIGKILL)
        else:
            kill_at_next(syscall)

    LedgerEnv.open(path, on_creation_step=on_creation_step).close()
    print("created", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
