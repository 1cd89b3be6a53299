"""Reading HDF5 datasets compressed with the LZ4 filter (HDF5 filter 32004), without a plugin.

``cerebras.pytorch`` writes every non-scalar tensor through that filter (its ``hdf5plugin.LZ4()``
default). HDF5 itself has no LZ4 decoder, so cstream reads such a dataset's chunks raw
(``read_direct_chunk``) and decodes them here. A chunk is the filter's frame: the uncompressed size
(8 bytes, big-endian), the block size (4 bytes), then per block its compressed size (4 bytes) and
bytes; a block whose compressed size equals its uncompressed size is stored as is. Each block is
an LZ4 *block* (sequences of literals and back-references, https://github.com/lz4/lz4/blob/dev/doc/
lz4_Block_format.md). Literal runs and matches are copied as slices, so data that compresses little
(trained weights) decodes at memory speed and runs of repeated bytes (zeros) need one copy each.
"""

from __future__ import annotations

import struct

import numpy as np

FILTER_ID = 32004


class LZ4Error(ValueError):
    """Compressed bytes that are not a valid LZ4 frame of the HDF5 filter."""


def _length(src: bytes, pos: int, n: int, what: str) -> tuple[int, int]:
    """The length whose 4 bits in the token are ``n``; 15 means it goes on in the bytes from
    ``pos``, each added to it, up to the first below 255. Returns the length and the position
    after it."""
    if n != 15:
        return n, pos
    while True:
        if pos >= len(src):
            raise LZ4Error(f"a {what} length runs past the end of the block")
        b = src[pos]
        pos += 1
        n += b
        if b != 255:
            return n, pos


def _decode_block(src: bytes, size: int) -> bytearray:
    out = bytearray()
    pos, end = 0, len(src)
    while pos < end:
        token = src[pos]
        pos += 1
        n, pos = _length(src, pos, token >> 4, "literal")
        if pos + n > end:
            raise LZ4Error("literals run past the end of the block")
        out += src[pos:pos + n]
        pos += n
        if pos == end:  # the last sequence has literals only
            break
        if pos + 2 > end:
            raise LZ4Error("a match offset is cut off")
        offset = src[pos] | (src[pos + 1] << 8)
        pos += 2
        length, pos = _length(src, pos, token & 15, "match")
        length += 4
        if offset == 0 or offset > len(out):
            raise LZ4Error(f"a match points {offset} bytes back, before the start of the block")
        start = len(out) - offset
        if length <= offset:
            out += out[start:start + length]
        else:  # overlapping copy: the last `offset` bytes repeat
            pattern = bytes(out[start:])
            out += (pattern * (length // offset + 1))[:length]
        if len(out) > size:
            raise LZ4Error(f"a block decodes to more than its {size} bytes")
    if len(out) != size:
        raise LZ4Error(f"a block decodes to {len(out)} bytes instead of {size}")
    return out


def decode_chunk(data: bytes) -> bytes:
    """The uncompressed bytes of one chunk written through the HDF5 LZ4 filter."""
    if len(data) < 12:
        raise LZ4Error(f"the chunk is {len(data)} bytes, shorter than the 12-byte LZ4 header")
    total, block = struct.unpack(">QI", data[:12])
    if block == 0 and total:
        raise LZ4Error("the LZ4 header gives a block size of 0")
    out = bytearray()
    pos = 12
    while len(out) < total:
        want = min(block, total - len(out))
        if pos + 4 > len(data):
            raise LZ4Error("a block header runs past the end of the chunk")
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        pos += 4
        if pos + n > len(data):
            raise LZ4Error("a block runs past the end of the chunk")
        raw = data[pos:pos + n]
        pos += n
        out += raw if n == want else _decode_block(raw, want)
    return bytes(out)


def read_dataset(ds) -> np.ndarray:
    """The values of an h5py dataset whose only filter is LZ4, read chunk by chunk."""
    array = np.zeros(ds.shape, dtype=ds.dtype)  # chunks never written hold the fill value, 0
    chunks = ds.chunks
    dsid = ds.id
    for i in range(dsid.get_num_chunks()):
        info = dsid.get_chunk_info(i)
        mask, data = dsid.read_direct_chunk(info.chunk_offset)
        origin = info.chunk_offset
        if mask & 1:  # the filter was skipped for this chunk: stored as is
            raw = data
        else:
            raw = decode_chunk(data)
        chunk = np.frombuffer(raw, dtype=ds.dtype)
        if chunk.size != int(np.prod(chunks)):
            raise LZ4Error(f"a chunk holds {chunk.size} values instead of {int(np.prod(chunks))}")
        chunk = chunk.reshape(chunks)
        region = tuple(slice(o, min(o + c, s)) for o, c, s in zip(origin, chunks, ds.shape))
        array[region] = chunk[tuple(slice(0, r.stop - r.start) for r in region)]
    return array
