"""Named shared-memory segments: files under /dev/shm mapped by the host and the workers.

A segment's pages are reserved when it is created (``posix_fallocate``): on tmpfs, ``ftruncate``
alone claims nothing, so a full /dev/shm would only show when a page is first written — as SIGBUS,
killing whichever process writes (a worker writing a result, or the host, i.e. ComfyUI, writing a
latent). Reserved up front, a full /dev/shm is an ENOSPC at creation. The segment then goes to the
pool's private folder instead (a file in the temp folder, mapped the same way; slower, as the
kernel may write it to disk), with one warning naming /dev/shm and docker's ``--shm-size``; if
that has no room either, :class:`SharedMemoryFull` says what, why and how to fix it.

A segment's name is a file name under /dev/shm, or an absolute path. A pool keeps every segment in
a folder of its own under /dev/shm (:func:`make_segment_dir`: created exclusively with a random name,
mode 0700), so no other user can create, squat or open a name in it, however predictable the names
inside are; removing that folder removes exactly what the pool created. Only a segment's creator
unlinks it.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import mmap
import os
import shutil
import stat
import tempfile
from pathlib import Path

from ..errors import SharedMemoryFull

SHM_DIR = Path("/dev/shm")
SHM_SIZE_FIX = (
    "give the machine more shared memory: in Docker start the container with --shm-size=8g (docker run) or "
    "shm_size: 8gb (compose); elsewhere free space in /dev/shm (ls -la /dev/shm) or make images smaller"
)
_NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)

log = logging.getLogger(__name__)


def segment_path(name: str) -> Path:
    """Where segment ``name`` lives: /dev/shm/<name>, or ``name`` itself when it is absolute."""
    return Path(name) if os.path.isabs(name) else SHM_DIR / name


def free_bytes(folder: str | os.PathLike) -> int | None:
    try:
        st = os.statvfs(folder)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def _mib(n: int | None) -> str:
    return "unknown" if n is None else f"{n / 2**20:.1f} MiB"


def _reserve(fd: int, size: int) -> None:
    """Claim the pages now; filesystems that cannot reserve (EOPNOTSUPP, EINVAL) are left as they are."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno in _NO_ROOM:
            raise
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise


def _create_at(path: Path, size: int) -> mmap.mmap:
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, size)
        _reserve(fd, size)
        return mmap.mmap(fd, size)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    finally:
        os.close(fd)


class Segment:
    """A named shared-memory segment mapped into this process."""

    def __init__(self, name: str, mm: mmap.mmap, size: int, owner: bool):
        self.name, self.mm, self.size, self.owner = name, mm, size, owner

    @classmethod
    def create(cls, name: str, size: int, fallback_dir: str | None = None, what: str = "a message") -> Segment:
        """Create and map ``name`` with ``size`` bytes reserved; in ``fallback_dir`` when /dev/shm
        has no room (``what`` names the content in the warning and the error)."""
        size = max(size, 1)
        try:
            return cls(name, _create_at(segment_path(name), size), size, owner=True)
        except OSError as exc:
            if exc.errno not in _NO_ROOM:
                raise
        shm_free = free_bytes(SHM_DIR)
        if fallback_dir is not None:
            path = Path(fallback_dir) / Path(name).name
            try:
                mm = _create_at(path, size)
            except OSError as exc:
                if exc.errno not in _NO_ROOM:
                    raise
            else:
                log.warning(
                    "/dev/shm is full (%s free, %s needed for %s): using %s instead, which is slower; fix: %s",
                    _mib(shm_free),
                    _mib(size),
                    what,
                    fallback_dir,
                    SHM_SIZE_FIX,
                )
                return cls(str(path), mm, size, owner=True)
        also = "" if fallback_dir is None else f", nor in {fallback_dir} ({_mib(free_bytes(fallback_dir))} free)"
        raise SharedMemoryFull(
            f"shared memory is full: {what} needs {_mib(size)} but /dev/shm has {_mib(shm_free)} free{also}",
            "images, latents and conditionings travel between the host and the workers through /dev/shm, a "
            "RAM-backed folder; Docker gives a container only 64 MB of it by default",
            SHM_SIZE_FIX,
        )

    @classmethod
    def attach(cls, name: str) -> Segment:
        """Map an existing segment (shared, read-write)."""
        fd = os.open(segment_path(name), os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        return cls(name, mm, size, owner=False)

    def close(self) -> None:
        with contextlib.suppress(BufferError, ValueError):
            self.mm.close()

    def unlink(self) -> None:
        """Remove the name (creator only). Mappings stay valid until closed."""
        if self.owner:
            segment_path(self.name).unlink(missing_ok=True)


def map_private(name: str) -> mmap.mmap:
    """Map a segment copy-on-write: reads share the pages, writes stay in this process."""
    fd = os.open(segment_path(name), os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        return mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)


def make_segment_dir(prefix: str, fallback: str) -> str:
    """A new folder for one pool's segments: ``/dev/shm/<prefix>shm-<random>``, mode 0700, created
    exclusively (a name someone else took is retried with another); ``fallback`` (the pool's private
    folder) when /dev/shm cannot hold one."""
    try:
        return tempfile.mkdtemp(prefix=prefix + "shm-", dir=SHM_DIR)
    except OSError as exc:
        log.warning(
            "cannot make a folder in /dev/shm (%s): this pool's messages go through %s instead, which is "
            "slower; fix: %s",
            exc,
            fallback,
            SHM_SIZE_FIX,
        )
        return fallback


def remove_segment_dir(folder: str | None) -> None:
    """Remove a pool's segment folder and everything in it (it is 0700: all of it is the pool's).
    Never raises."""
    if folder:
        shutil.rmtree(folder, ignore_errors=True)


def sweep_segments(folder: str, name_prefix: str = "") -> list[str]:
    """Unlink the segments in ``folder`` whose names start with ``name_prefix`` (used only after
    their creators are dead, e.g. a killed worker). Only regular files of this user are touched and
    nothing raises. Returns the names removed."""
    removed = []
    uid = os.geteuid()
    try:
        entries = list(Path(folder).glob(name_prefix + "*"))
    except OSError:
        return removed
    for path in entries:
        try:
            st = path.lstat()
            if not stat.S_ISREG(st.st_mode) or st.st_uid != uid:
                continue  # not a segment, or not ours
            path.unlink()
        except OSError:
            continue
        removed.append(path.name)
    return removed
