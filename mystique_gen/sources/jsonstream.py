"""Incremental JSON reading of an execution trace: one ``nodes`` element at a time.

``json.load`` of a trace builds the whole document (about 6.5 bytes of Python objects
per byte of JSON) before the loader can turn it into compact records. This reader
walks the top-level object by hand and decodes each value, and each element of the
``nodes`` array, with :meth:`json.JSONDecoder.raw_decode` (the same C scanner
``json.load`` uses), so only one node's dicts exist at a time. No dependency is
needed: ijson's C backend yields events, not whole nodes, and rebuilding each
node's dicts from events in Python is slower than decoding it in C here.

Every failure (corrupt gzip, invalid UTF-8, truncated or invalid JSON, nesting too
deep for the decoder) becomes one :class:`TraceError`.
"""

from __future__ import annotations

import codecs
import gzip
import hashlib
import json
import re
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from mystique_gen.errors import TraceError

CHUNK = 1 << 20  # bytes read at a time
_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


class TruncatedJSON(TraceError):
    """The data ended inside the document."""


class HashingReader:
    """A binary file wrapper that hashes every byte read through it (the trace's sha256)."""

    def __init__(self, raw: IO[bytes]):
        self.raw = raw
        self.sha256 = hashlib.sha256()
        self.bytes_read = 0

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(size)
        self.sha256.update(data)
        self.bytes_read += len(data)
        return data

    def drain(self) -> None:
        """Hash whatever the consumer left unread (gzip trailers, trailing bytes)."""
        while self.read(CHUNK):
            pass


class JsonStream:
    """A text buffer over a byte source, refilled as values are decoded from it."""

    def __init__(self, source: HashingReader, name: str,
                 progress: Callable[[int], None] | None = None):
        self.name = name
        self.source = source
        head = source.read(2)
        self._gzip: _Gunzip | None = None
        self._pending = head
        if head == b"\x1f\x8b":
            self._gzip = _Gunzip(_Prefixed(head, source))
            self._pending = b""
        self._text = codecs.getincrementaldecoder("utf-8-sig")()
        self.buf = ""
        self.pos = 0
        self.eof = False
        self.line_base = 1  # line number of buf[0]
        self.progress = progress
        self.where = ""  # " in nodes[i]" while reading the node list
        # Where the data ended inside the node list: how many nodes were read whole
        # (the file of a process that ended before its observer was unregistered).
        self.cut: int | None = None
        self.gzip_cut = False  # the compressed stream ended before its end marker

    # -- buffer ---------------------------------------------------------------------
    def _read_bytes(self, size: int) -> bytes:
        if self._gzip is None:
            data, self._pending = self._pending + self.source.read(size), b""
            return data
        try:
            data = self._gzip.read(size)
        except zlib.error as exc:
            raise TraceError(f"{self.name}: corrupt gzip data ({exc})") from None
        self.gzip_cut = self._gzip.cut
        return data

    def fill(self, size: int | None = None) -> bool:
        """Append up to ``size`` (default CHUNK) more bytes' text; False at the end."""
        if self.eof:
            return False
        data = self._read_bytes(size or CHUNK)
        try:
            text = self._text.decode(data, final=not data)
        except UnicodeDecodeError:
            self._gzip_error_first()
            raise TraceError(f"{self.name}: not UTF-8 text") from None
        if not data:
            self.eof = True
        if self.pos:
            self.line_base += self.buf.count("\n", 0, self.pos)
            self.buf = self.buf[self.pos:]
            self.pos = 0
        self.buf += text
        if self.progress is not None:
            self.progress(self.source.bytes_read)
        return bool(data) or bool(text)

    def skip_ws(self) -> str:
        """The next non-blank character ('' at the end), without consuming it."""
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self.fill():
                return ""

    def expect(self, chars: str, what: str) -> str:
        ch = self.skip_ws()
        if ch == "" or ch not in chars:
            self._fail(what, truncated=ch == "")
        self.pos += 1
        return ch

    def value(self) -> Any:
        """Decode one JSON value at the current position, reading more as needed."""
        self.skip_ws()
        grow = CHUNK
        while True:
            try:
                obj, end = _DECODER.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as exc:
                # The value may simply continue past the buffer: read more and retry
                # (doubling, so a huge value costs O(its size) rescans in total).
                if self.fill(grow):
                    grow *= 2
                    continue
                truncated = (exc.pos >= len(self.buf.rstrip()) - 1
                             or exc.msg.startswith("Unterminated"))
                self._fail(f"{exc.msg}", truncated=truncated, at=exc.pos)
            except RecursionError:
                raise TraceError(f"{self.name}: JSON nested too deeply{self.where}") from None
            except ValueError as exc:  # e.g. an integer of more than 4300 digits
                raise TraceError(f"{self.name}: unreadable value{self.where}: "
                                 f"{str(exc)[:80]}") from None
            if end == len(self.buf) and self.fill(grow):
                continue  # a number or literal cut by the buffer's end: decode it whole
            self.pos = end
            return obj

    def _gzip_error_first(self) -> None:
        """Corrupt compressed data decodes to garbage before its checksum is read: name
        the gzip fault, not the JSON it garbled."""
        if self._gzip is not None:
            while self._read_bytes(CHUNK):
                pass

    def _fail(self, what: str, *, truncated: bool, at: int | None = None):
        self._gzip_error_first()
        at = self.pos if at is None else at
        line = self.line_base + self.buf.count("\n", 0, min(at, len(self.buf)))
        if truncated:
            what = "gzip data" if self.gzip_cut else "JSON"
            raise TruncatedJSON(f"{self.name}: truncated {what} (ends at line {line})")
        raise TraceError(f"{self.name}: not valid JSON: {what} at line {line}")

    # -- document ---------------------------------------------------------------------
    def document(self, on_node: Callable[[Any, int], None]) -> tuple[Any, bool]:
        """Read the whole document, handing each ``nodes`` element to ``on_node``.

        Returns (the document without its node list, whether ``nodes`` was a list
        that was streamed). A top level that is not an object is returned whole.
        """
        if self.skip_ws() != "{":
            doc = self.value()
            self._end()
            return doc, False
        self.pos += 1
        doc: dict[str, Any] = {}
        streamed = False
        if self.skip_ws() == "}":
            self.pos += 1
            self._end()
            return doc, False
        while True:
            if self.skip_ws() != '"':
                self._fail("expecting a property name", truncated=self.skip_ws() == "")
            key = self.value()
            self.expect(":", "expecting ':'")
            if key == "nodes" and "nodes" in doc:
                raise TraceError(f"{self.name}: 'nodes' is given twice")
            if key == "nodes" and self.skip_ws() == "[":
                read = self._array(on_node)
                doc["nodes"] = None
                streamed = True
                if self.cut is not None:
                    return doc, streamed
                try:
                    ended = self.expect(",}", "expecting ',' or '}'") == "}"
                except TruncatedJSON:  # the node list whole, what follows it cut
                    self.cut = read
                    return doc, streamed
            else:
                doc[key] = self.value()
                if key == "nodes":
                    streamed = False
                ended = self.expect(",}", "expecting ',' or '}'") == "}"
            if ended:
                break
        self._end()
        return doc, streamed

    def _array(self, on_node: Callable[[Any, int], None]) -> int:
        """Hand each element of the array at the current position to ``on_node``;
        how many. Where the data ends after one or more whole elements, ``cut`` says
        how many were read, and the rest of the document is not."""
        self.pos += 1  # "["
        if self.skip_ws() == "]":
            self.pos += 1
            return 0
        index = 0
        while True:
            self.where = f" in nodes[{index}]"
            try:
                node = self.value()
            except TruncatedJSON:
                if not index:
                    raise
                self.cut = index  # the nodes before are whole: the loader keeps them
                return index
            on_node(node, index)
            index += 1
            try:
                if self.expect(",]", "expecting ',' or ']'") == "]":
                    self.where = ""
                    return index
            except TruncatedJSON:
                self.cut = index
                return index

    def _end(self) -> None:
        if self.skip_ws() != "":
            self._fail("extra data after the document", truncated=False)


class _Gunzip:
    """Gzip data decompressed as it is read, members one after another. A stream cut
    short (a file copied or written only in part) gives what it held, and ``cut``
    says so: ``gzip.GzipFile`` raises at the missing end marker and drops what that
    read had decompressed, all of a small file."""

    def __init__(self, source: _Prefixed):
        self.source = source
        self._member = zlib.decompressobj(wbits=31)  # a gzip header and trailer
        self._out = b""
        self._done = False
        self.cut = False

    def read(self, size: int) -> bytes:
        while len(self._out) < size and not self._done:
            chunk = self.source.read(CHUNK)
            if not chunk:
                self._done = True
                self.cut = not self._member.eof
                self._out += self._member.flush()
                break
            self._out += self._member.decompress(chunk)
            while self._member.eof and self._member.unused_data.strip(b"\x00"):
                rest = self._member.unused_data  # the next member
                self._member = zlib.decompressobj(wbits=31)
                self._out += self._member.decompress(rest)
        data, self._out = self._out[:size], self._out[size:]
        return data


class _Prefixed:
    """A reader that first returns bytes already read (the gzip magic) then the rest."""

    def __init__(self, head: bytes, source: HashingReader):
        self.head = head
        self.source = source

    def read(self, size: int = -1) -> bytes:
        if self.head:
            if size is None or size < 0:
                data, self.head = self.head + self.source.read(-1), b""
                return data
            data, self.head = self.head[:size], self.head[size:]
            if len(data) < size:
                data += self.source.read(size - len(data))
            return data
        return self.source.read(size)


# What a trace file holds, from its first bytes: an execution trace's node list (the
# observer writes ``schema``, ``pid``, ``time`` and ``start_ts`` before it), or a
# Kineto trace (``schemaVersion`` first, ``traceEvents`` after the device and
# distributed facts).
SNIFF_BYTES = 1 << 16
_ET_KEY = re.compile(r'"nodes"\s*:\s*\[')
_KINETO_KEY = re.compile(r'^\s*\{\s*"schemaVersion"\s*:|"traceEvents"\s*:\s*\[')


def document_kind(path: str | Path) -> str | None:
    """``"et"`` or ``"kineto"`` for a JSON file (gzipped or not) whose first
    :data:`SNIFF_BYTES` say which, else None (unreadable, or neither: the loader says
    what is wrong with it). For a folder of traces named by no convention (PARAM's
    and HTA's recipes write ``et_rank0.json`` beside ``kineto_rank0.json``)."""
    try:
        with open(path, "rb") as raw:
            data = raw.read(SNIFF_BYTES)
            if data[:2] == b"\x1f\x8b":
                raw.seek(0)
                data = gzip.GzipFile(fileobj=raw, mode="rb").read(SNIFF_BYTES)
    except (OSError, EOFError, zlib.error):
        return None
    text = data.decode("utf-8", errors="replace").lstrip("\ufeff")
    et, kineto = _ET_KEY.search(text), _KINETO_KEY.search(text)
    if et and (kineto is None or et.start() < kineto.start()):
        return "et"
    return "kineto" if kineto else None
