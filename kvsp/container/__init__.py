"""KV Block Container codec (spec section 4.3): sans-I/O and zero-copy.

Why it looks like this:

* A container can be hundreds of MiB, so decoding never copies layer data.  `decode_container` parses
  the header and returns `memoryview` slices of the caller's buffer; its cost grows with the number of
  layers, not with the number of octets.  Encoding offers `encode_parts` (the header plus the caller's
  buffers, for ``writelines``/``sendmsg``) and `encode_container` (one allocation, one copy).
* Every malformed input raises `ContainerError` with a message naming the broken rule, and nothing else:
  a container comes from the network, so the decoder is the trust boundary.
* The package: `header` (constants, geometry, the checked header), `codecs` (the registry), `decode`
  (zero-copy views and digests), `encode`.
* No sockets, no clock: the same code serves HTTP bodies, MOQT objects and files on disk.
  `kvsp.container_stream.ContainerReader` is the incremental (push-fed) form of the same parser.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvsp.container.codecs import (
    DEFAULT_CODECS,
    RAW,
    STANDARD_CODECS,
    CodecRegistry,
    CodecSpec,
    SectionCheck,
    check_raw_sections,
    register_codec,
)
from kvsp.container.decode import (
    Container,
    DecodeRules,
    LayerView,
    decode_container,
    parse_header,
    replica_digest,
    verify_layers,
)
from kvsp.container.encode import (
    encode_container,
    encode_header,
    encode_into,
    encode_parts,
)
from kvsp.container.header import (
    DEFAULT_MAX_LAYERS,
    FIXED_HEADER_LENGTH,
    MAGIC,
    MEDIA_TYPE,
    TABLE_ENTRY_LENGTH,
    U32_MAX,
    U64_MAX,
    VERSION,
    ContainerHeader,
    Geometry,
    LayerDigestMismatchError,
    LayerRange,
    LayersUnavailableError,
    as_octets,
)

if TYPE_CHECKING:
    from kvsp.container.header import BufferLike as BufferLike
    from kvsp.container.header import Sections as Sections

__all__ = [
    "DEFAULT_CODECS",
    "DEFAULT_MAX_LAYERS",
    "FIXED_HEADER_LENGTH",
    "MAGIC",
    "MEDIA_TYPE",
    "RAW",
    "STANDARD_CODECS",
    "TABLE_ENTRY_LENGTH",
    "U32_MAX",
    "U64_MAX",
    "VERSION",
    "CodecRegistry",
    "CodecSpec",
    "Container",
    "ContainerHeader",
    "DecodeRules",
    "Geometry",
    "LayerDigestMismatchError",
    "LayerRange",
    "LayerView",
    "LayersUnavailableError",
    "SectionCheck",
    "as_octets",
    "check_raw_sections",
    "decode_container",
    "encode_container",
    "encode_header",
    "encode_into",
    "encode_parts",
    "parse_header",
    "register_codec",
    "replica_digest",
    "verify_layers",
]
