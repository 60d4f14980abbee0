"""The loader's error type and the zero-copy byte stream every format is parsed from.

Everything the loader reads comes from an untrusted file.  Parsing goes through ``ViewStream``,
a read-only stream over a ``memoryview`` whose ``read`` returns *slices* (no copy), so that
parameter arrays can be numpy views over the mapped file, and which never moves past its end:
a short read leaves the position where the read started, so an error can name the offset of the
field that did not fit.
"""

from __future__ import annotations

import io


class LoaderError(ValueError):
    """A library or blob the loader cannot accept.

    The message says where (byte offset, relative to the blob or the file as stated) and what was
    expected there, so a vendor can find the bad bytes with a hex dump.
    """


class ViewStream(io.RawIOBase):
    """A seekable, read-only stream over a memoryview; ``read`` returns memoryview slices.

    ``base`` is added to positions in error messages (the blob's offset inside the file).
    """

    def __init__(self, data, base: int = 0):
        super().__init__()
        self.view = memoryview(data).cast("B") if not isinstance(data, memoryview) else data.cast("B")
        self.pos = 0
        self.base = base

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def remaining(self) -> int:
        return len(self.view) - self.pos

    def read(self, size: int = -1):
        if size is None or size < 0:
            size = self.remaining()
        if size > self.remaining():
            # short read: do not advance, so the caller's error names the field's start
            return self.view[self.pos:]
        out = self.view[self.pos:self.pos + size]
        self.pos += size
        return out

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            pos = offset
        elif whence == io.SEEK_CUR:
            pos = self.pos + offset
        else:
            pos = len(self.view) + offset
        if pos < 0:
            raise ValueError("negative seek position")
        self.pos = min(pos, len(self.view))
        return self.pos


class BytesReader(ViewStream):
    """A read-only file over a memoryview for parsers that expect a file of ``bytes`` (tarfile, gzip,
    pyelftools): reads return bytes, and a short read moves to the end as a file's does (a reader
    that tries again then sees the end, not the same bytes a second time)."""

    def read(self, size: int = -1):
        end = len(self.view) if size is None or size < 0 else min(len(self.view), self.pos + size)
        out = bytes(self.view[self.pos:end])
        self.pos = max(self.pos, end)
        return out

    def readinto(self, b) -> int:
        chunk = self.read(len(b))
        b[:len(chunk)] = chunk
        return len(chunk)
