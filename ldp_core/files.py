"""Durable, atomic file writes: the project's one way of replacing a file (standard library only).

:func:`write_atomic` writes the new content to a temporary file in the same
folder, flushes and fsyncs it, renames it over the target (``os.replace``,
atomic on POSIX) and fsyncs the folder, so that after it returns the new
file survives a power cut, and at any moment a reader sees either the whole
old file or the whole new one, never a torn one. If anything fails before the
rename, the temporary file is removed and the target is untouched. With
``replace=False`` it creates a file that must never be replaced (the SDK's
device secret): the first writer wins, the others learn that the file exists.

It lives in ``ldp_core`` because that is the lowest layer: the SDK, the
pipeline, the collector, the estimator and the CLI all use this one helper
instead of each writing its own variant (with its own idea of durability).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

__all__ = ["write_atomic", "fsync_dir", "makedirs_durable", "temp_name", "read_private", "load_or_create_private"]

#: What :func:`write_atomic` writes: the bytes themselves, or a function that writes them to the open file.
Content = bytes | bytearray | memoryview | Callable[[BinaryIO], object]


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a folder, so that entries created or renamed in it survive a power cut."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def makedirs_durable(path: str | os.PathLike[str]) -> None:
    """Create ``path`` and any missing parents, fsyncing each new folder's parent so the folders survive a
    power cut (an existing ``path`` costs one ``stat``)."""
    missing = []
    p = Path(path)
    while not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):
            d.mkdir()
        fsync_dir(d.parent)


def temp_name(path: str | os.PathLike[str]) -> Path:
    """A fresh temporary name beside ``path``: hidden (a leading dot), unique across processes and threads,
    ending in ``.tmp`` so that globs for the real files never match it."""
    p = Path(path)
    return p.parent / f".{p.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"


def write_atomic(path: str | os.PathLike[str], content: Content, *, mode: int = 0o666, replace: bool = True) -> None:
    """Replace ``path`` with ``content`` atomically and durably (see the module docstring).

    ``content`` is the bytes to write, or a function called with the open binary file that writes them
    (for writers that stream, such as Parquet or ``np.savez``). ``mode`` is the new file's permission bits
    (less the umask; ``0o600`` for a secret). ``replace=False`` creates the file only if ``path`` does not
    exist yet -- the temporary file is hard-linked into place, so of several writers racing exactly one wins
    and the others get :class:`FileExistsError` -- with the same durability. The folder must exist (see
    :func:`makedirs_durable`). Raises what the file system raises (:class:`OSError`) or what the writer
    raises; the temporary file is removed in every case."""
    target = Path(path)
    tmp = temp_name(target)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        with os.fdopen(fd, "wb") as f:
            if callable(content):
                content(f)
            else:
                f.write(content)
            f.flush()
            os.fsync(f.fileno())
        if replace:
            os.replace(tmp, target)
        else:
            os.link(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    if not replace:
        with contextlib.suppress(OSError):
            tmp.unlink()
    fsync_dir(target.parent)


def read_private(path: str | os.PathLike[str]) -> bytes:
    """The bytes of a secret's file; :class:`PermissionError` if other users may read it (POSIX), what the file
    system raises (:class:`OSError`) if it cannot be read. The one check of every key file the project keeps."""
    p = Path(path)
    mode = stat.S_IMODE(p.stat().st_mode)
    if os.name == "posix" and mode & 0o077:
        raise PermissionError(f"{p} is readable by other users (mode {mode:o}); run chmod 600 on it")
    return p.read_bytes()


def load_or_create_private(path: str | os.PathLike[str], size: int) -> bytes:
    """A ``size``-byte secret in ``path``, created from the OS CSPRNG on first use (0600, with
    :func:`write_atomic`'s ``replace=False``: of several processes starting together exactly one creates it,
    the others read it). :class:`PermissionError` if others may read it, :class:`ValueError` if it holds
    another size (a damaged file)."""
    p = Path(path)
    if not p.exists():
        makedirs_durable(p.parent)
        with contextlib.suppress(FileExistsError):
            write_atomic(p, secrets.token_bytes(size), mode=0o600, replace=False)
    data = read_private(p)
    if len(data) != size:
        raise ValueError(f"{p} holds {len(data)} bytes, expected {size}; it is damaged")
    return data
