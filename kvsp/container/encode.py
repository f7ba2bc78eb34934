"""Encoding a KV Block Container (section 4.3).

`encode_parts` gives the header plus the caller's buffers (for ``writelines``/``sendmsg``),
`encode_container` one allocation and one copy, `encode_into` writes into a caller's buffer.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

from kvsp.container.codecs import _STANDARD_VALUES
from kvsp.container.decode import _check_whole
from kvsp.container.header import _CAST, ContainerHeader, Geometry, as_octets
from kvsp.errors import ContainerError

if TYPE_CHECKING:
    from kvsp.container.header import BufferLike, Sections


# Checked headers of recent encodes (see `_checked_header`), by codec, first layer, tokens, geometry and
# section lengths.
_HEADERS: Final[dict[tuple[object, ...], tuple[ContainerHeader, bytes]]] = {}
_MAX_HEADERS: Final = 256

# -- encoding ----------------------------------------------------------------------------------------


def encode_header(codec: int, first_layer: int, token_count: int,
                  lengths: Sequence[tuple[int, int]]) -> bytes:
    """The header of a container whose layers have the given (K, V) section lengths."""
    return ContainerHeader(codec, first_layer, token_count, tuple((k, v) for k, v in lengths)).encode()


def _section_views(layers: Sections) -> list[memoryview]:
    """K0, V0, K1, V1... as flat octet views.

    ``memoryview.cast("B")`` is what `as_octets` does to a C-contiguous buffer, and mapped over every
    section it runs in C: the common inputs (memoryview slices of a cache, then any buffer) take no
    Python step per section.  A buffer it refuses (not C-contiguous, an odd format) sends all sections
    through `as_octets`, which raises the precise error or views it the long way.
    """
    if not isinstance(layers, list | tuple):
        layers = list(layers)
    if set(map(len, layers)) == {2}:
        try:  # the unbound method refuses anything but a memoryview (TypeError), so it is never misapplied
            return list(map(_CAST, itertools.chain.from_iterable(layers), itertools.repeat("B")))
        except TypeError:
            pass
        try:
            return list(map(_CAST, map(memoryview, itertools.chain.from_iterable(layers)),  # type: ignore[arg-type]
                            itertools.repeat("B")))
        except TypeError:  # not a buffer, or a buffer that cannot be cast (not C-contiguous, odd format)
            pass
    return [octets for k, v in layers for octets in (as_octets(k), as_octets(v))]


def _checked_header(codec: int, first_layer: int, token_count: int, views: list[memoryview],
                    geometry: Geometry | None) -> tuple[ContainerHeader, bytes]:
    """The checked header of these sections and its octets, remembered for standard codecs.

    Every block of a model has the same layout, so an engine exporting blocks asks for a few headers
    over and over; a standard codec's rules cannot change at run time (only private codecs can be
    registered), which makes a header checked once valid for good.
    """
    lengths = tuple(map(len, views))  # a 1-D octet view's len() is its octet count
    key = (codec, first_layer, token_count, geometry, lengths)
    found = _HEADERS.get(key)
    if found is None:
        header = ContainerHeader(codec, first_layer, token_count, tuple(zip(lengths[0::2], lengths[1::2], strict=True)))
        _check_whole(header, geometry)
        found = (header, header.encode())
        if codec in _STANDARD_VALUES:
            if len(_HEADERS) >= _MAX_HEADERS:
                _HEADERS.clear()
            _HEADERS[key] = found
    return found


def encode_parts(codec: int, first_layer: int, token_count: int, layers: Sections,
                 *, geometry: Geometry | None = None) -> list[bytes | memoryview]:
    """The header followed by views of the given K and V buffers: a container without copying them.

    The codec's section rule (and ``geometry`` when given) is checked, so nothing is encoded that a
    peer's decoder would reject.
    """
    views = _section_views(layers)
    parts: list[bytes | memoryview] = [_checked_header(codec, first_layer, token_count, views, geometry)[1]]
    parts += views
    return parts


def encode_container(codec: int, first_layer: int, token_count: int, layers: Sections,
                     *, geometry: Geometry | None = None) -> bytes:
    """The container as one bytes object: one allocation and one copy of each section (a single join)."""
    return b"".join(encode_parts(codec, first_layer, token_count, layers, geometry=geometry))


def encode_into(buffer: BufferLike, codec: int, first_layer: int, token_count: int, layers: Sections,
                *, geometry: Geometry | None = None) -> int:
    """Write the container at the start of a writable ``buffer`` and return its length in octets.

    For a destination the caller already has (a reused or pinned buffer, an mmap of a file), this is
    the floor of encoding: one memcpy per section and no allocation.  ``buffer`` may be longer.
    Per section the only Python work is one slice assignment (K and V of a cache are not adjacent, so
    there is nothing to merge); the views, lengths and checks are made for all sections at once.
    """
    out = as_octets(buffer)
    if out.readonly:
        raise ContainerError("the destination buffer is read-only")
    views = _section_views(layers)
    header, octets = _checked_header(codec, first_layer, token_count, views, geometry)
    total = header.container_length
    if out.nbytes < total:
        raise ContainerError(f"the container needs {total} octets, the buffer has {out.nbytes}")
    position = len(octets)
    out[:position] = octets
    for view in views:
        end = position + len(view)
        out[position:end] = view
        position = end
    return position
