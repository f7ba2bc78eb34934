"""Files of the holder's local storage: crash-safe writes, hole punching, and the storage key file.

Kept apart from `disk` (the encrypted tier) because these are plain POSIX file operations: a new file
replaces the old only once it is on disk (write, fsync, rename, fsync the directory), and layers that
move to a faster tier free their disk space in place where the file system can.
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Final

from control.holder.tiers import TierError

if TYPE_CHECKING:
    from typing_extensions import Buffer

log = logging.getLogger("kvsp.holder.disk")
KEY_OCTETS: Final = 32


def load_or_create_key(path: Path) -> bytes:
    """The 32-octet storage key from ``path`` (raw or hex), generating it with mode 0600 if absent."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return _create_key(path)
    except OSError as exc:
        raise TierError(f"cannot read encryption_key_file {path}: {exc.strerror}") from exc
    if path.stat().st_mode & 0o077:
        log.warning("encryption_key_file %s is readable by group or others; use mode 0600", path)
    if len(data) == KEY_OCTETS:
        return data
    text = data.strip()
    if len(text) == 2 * KEY_OCTETS and re.fullmatch(rb"[0-9a-fA-F]+", text):
        return bytes.fromhex(text.decode("ascii"))
    raise TierError(f"encryption_key_file {path} must hold 32 raw octets or 64 hex digits")


def _create_key(path: Path) -> bytes:
    key = os.urandom(KEY_OCTETS)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process made it first: use theirs
        return load_or_create_key(path)
    with os.fdopen(fd, "wb") as f:
        f.write(key.hex().encode("ascii") + b"\n")
    log.info("generated a new storage encryption key in %s", path)
    return key


def write_new(path: Path, pieces: Iterable[tuple[Buffer, int]]) -> None:
    """Write ``pieces`` (data, offset) to a new file that replaces ``path`` only once it is on disk."""
    temp = path.with_name(f"{path.name}.tmp{os.urandom(8).hex()}")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        try:
            for data, offset in pieces:
                pwrite_all(fd, data, offset)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _libc_fallocate() -> Callable[[int, int, int, int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).fallocate
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
    fn.restype = ctypes.c_int
    found: Callable[[int, int, int, int], int] = fn
    return found


_FALLOCATE: Final = _libc_fallocate()
_PUNCH_HOLE: Final = 0x02 | 0x01  # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE (linux/falloc.h)


def punch_holes(path: Path, ranges: Iterable[tuple[int, int]]) -> bool:
    """Deallocate ``ranges`` of the file in place; False where the platform or file system cannot."""
    if _FALLOCATE is None:
        return False
    fd = os.open(path, os.O_RDWR)
    try:
        return all(_FALLOCATE(fd, _PUNCH_HOLE, start, end - start) == 0 for start, end in ranges)
    finally:
        os.close(fd)


def pwrite_all(fd: int, data: Buffer, offset: int) -> None:
    view = memoryview(data).cast("B")
    while view.nbytes:
        n = os.pwrite(fd, view, offset)
        view = view[n:]
        offset += n
