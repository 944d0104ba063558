"""What the trainer-side client and the server share: the wire protocol (docs/protocol.md)
and the root of Keel's errors. Standard library only, so it goes on a GPU node with the
hooks and into the server alike, and neither of them imports the other.

    from wire import Row, RunInfo, hello_message, parse_rows, ProtocolError
"""

from __future__ import annotations

from wire.errors import (
    CLOSE_AUTH,
    CLOSE_CONFLICT,
    CLOSE_IDLE,
    CLOSE_MALFORMED,
    CLOSE_OVERLOADED,
    CLOSE_SERVER_FAULT,
    CLOSE_TOO_LARGE,
    KeelError,
    ProtocolError,
)
from wire.messages import (
    FINISH_STATUSES,
    MAX_CONFIG_DEPTH,
    MAX_SEQ,
    MAX_STEP,
    PROTOCOL_VERSION,
    Limits,
    Row,
    RunInfo,
    decode_value,
    encode_rows,
    encode_value,
    finish_message,
    hello_message,
    parse_finish,
    parse_hello,
    parse_points,
    parse_rows,
    parse_seq,
    parse_writer,
    points_frame,
    points_message,
    reject_message,
)

__all__ = [
    "CLOSE_AUTH",
    "CLOSE_CONFLICT",
    "CLOSE_IDLE",
    "CLOSE_MALFORMED",
    "CLOSE_OVERLOADED",
    "CLOSE_SERVER_FAULT",
    "CLOSE_TOO_LARGE",
    "FINISH_STATUSES",
    "MAX_CONFIG_DEPTH",
    "MAX_SEQ",
    "MAX_STEP",
    "PROTOCOL_VERSION",
    "KeelError",
    "Limits",
    "ProtocolError",
    "Row",
    "RunInfo",
    "decode_value",
    "encode_rows",
    "encode_value",
    "finish_message",
    "hello_message",
    "parse_finish",
    "parse_hello",
    "parse_points",
    "parse_rows",
    "parse_seq",
    "parse_writer",
    "points_frame",
    "points_message",
    "reject_message",
]
