"""Tar's member headers and the walk of tar bytes member by member.

A header is one 512-byte block whose checksum field matches its bytes; a member's data follows,
padded to whole blocks. The walk reads the name each file member has (its header's, or the PAX
or GNU long-name entry before it), carries the entries with no data of their own along with the
file member after them, and refuses links and devices. It stops, never guesses, where the bytes
do not hold a whole entry or a header fails its checksum.
"""

from zlib import adler32

from pileshuffle.errors import InputError

__all__ = ["number", "is_header", "header_name", "Walk"]

BLOCK = 512  # tar's unit: a header is one block, data is padded to whole blocks
FILES = (b"0", b"\0", b"7")  # regular files (7, contiguous, reads as regular everywhere)
_ZERO_BLOCK = bytes(BLOCK)
_NAMING = (b"x", b"L")  # PAX per-file and GNU long-name headers: the next member's name
# no data of a sample's own: travel with the next member
_CARRIED = (b"x", b"L", b"K", b"g", b"5")


def number(field: bytes) -> int:
    """A numeric header field: octal text ended by NUL or space, or base-256 when its first
    byte has the high bit set (GNU's form for sizes of 8 GiB and more)."""
    if field[0] & 0x80:
        return int.from_bytes(bytes([field[0] & 0x7F]) + field[1:], "big")
    end = field.find(b"\0")
    text = field if end < 0 else field[:end]
    return int(text, 8) if text.strip() else 0


def _byte_sum(block: bytes) -> int:
    """The sum of a 512-byte block's bytes, in C: Adler-32's first half is 1 + the sum of
    the bytes mod 65521, exact for 256 bytes (at most 65,280)."""
    return (adler32(block[:256]) & 0xFFFF) + (adler32(block[256:]) & 0xFFFF) - 2


def is_header(block: bytes) -> bool:
    """Whether ``block`` is a tar header: its checksum field matches its bytes (the field
    itself counted as spaces)."""
    try:
        stored = number(block[148:156])
    except ValueError:
        return False
    return stored == _byte_sum(block) - sum(block[148:156]) + 8 * ord(" ")


def header_name(block: bytes) -> str:
    """A ustar header block's member name: its prefix field and name field joined."""
    name = block[:100].split(b"\0", 1)[0]
    prefix = block[345:500].split(b"\0", 1)[0] if block[257:262] == b"ustar" else b""
    return (prefix + b"/" + name if prefix else name).decode("utf-8", "surrogateescape")


def _extended_name(kind: bytes, data: bytes):
    """The member name a PAX (``path=``) or GNU long-name header gives, or None."""
    if kind == b"L":
        return data.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
    pos = 0
    while pos < len(data):
        space = data.find(b" ", pos)
        if space < 0 or not data[pos:space].isdigit():
            return None
        length = int(data[pos:space])
        key, _, value = data[space + 1 : pos + length - 1].partition(b"=")
        if key == b"path":
            return value.decode("utf-8", "surrogateescape")
        pos += length
    return None


class Walk:
    """The file members of tar bytes ``buf`` (bytes or a memoryview), header by header.

    ``members``: ``(begin, data, size, end, name)`` per file member: ``begin`` is where the
    entries carried with it start, ``data``/``size`` its data, ``end`` the end of its padding.
    ``stop``: where the walk stopped: the end-of-archive marker (``ended``), else the ``begin``
    of an entry ``buf`` does not hold whole, or of the entry with a corrupt header (then
    ``problem`` is the InputError to raise once the members before it are used). ``tail``:
    the end of the entries carried after the last member. Errors name ``path`` and the
    offset ``base`` + position in the file."""

    def __init__(self, buf, path: str, base: int = 0):
        self.members, self.ended, self.path, self.base, self.problem = [], False, path, base, None
        self.stop = self.tail = self._walk(buf)

    def _walk(self, buf) -> int:
        pos = begin = 0
        name = None
        while pos + BLOCK <= len(buf):
            block = bytes(buf[pos : pos + BLOCK])
            if block == _ZERO_BLOCK:
                if name is not None:
                    raise InputError(
                        self.path,
                        "has a long-name header with no member after it",
                        self.base + begin,
                    )
                self.ended = True
                self.tail = pos
                return pos
            if not is_header(block):
                if self.base + pos == 0:
                    raise InputError(
                        self.path, "is not a tar file: its first 512 bytes are no tar header", 0
                    )
                self.problem = InputError(
                    self.path,
                    "has a corrupt tar header (its checksum does not match)",
                    self.base + pos,
                )
                return begin
            kind, size = block[156:157], number(block[124:136])
            end = pos + BLOCK + -(-size // BLOCK) * BLOCK
            if end > len(buf):
                return begin
            if kind in _NAMING:
                name = _extended_name(kind, bytes(buf[pos + BLOCK : pos + BLOCK + size])) or name
            if kind in _CARRIED:
                pos = end
                continue
            member = name if name is not None else header_name(block)
            if kind not in FILES:
                raise InputError(
                    self.path,
                    f"member {member!r} is not a file (tar type {kind.decode('latin-1')!r}): "
                    "WebDataset samples hold files",
                    self.base + begin,
                )
            self.members.append((begin, pos + BLOCK, size, end, member))
            pos = begin = end
            name = None
        return begin
