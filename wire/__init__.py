"""What the trainer-side client and the server share: the wire protocol (docs/protocol.md)
and the root of Keel's errors. Standard library only, so it goes on a GPU node with the
hooks and into the server alike, and neither of them imports the other.

Where each message lives: what a client sends on the ingest socket (hello, points, finish)
and the rows' encoding in `wire.messages`; what the server answers (welcome, ack, reject,
bye, error) in `wire.replies` (error in `wire.errors`, beside ProtocolError); the signals
(listen, alerts, alert, hazard, command, command_result) and the alert in `wire.signals`;
what the server pushes to browsers on the live socket (points, status; alert is the signal's)
in `wire.live`.

    from wire import Hello, Row, RunInfo, parse_rows, ProtocolError
"""

from __future__ import annotations

from wire.errors import (
    CLOSE_AUTH,
    CLOSE_CONFLICT,
    CLOSE_FORBIDDEN,
    CLOSE_IDLE,
    CLOSE_MALFORMED,
    CLOSE_OVERLOADED,
    CLOSE_SERVER_FAULT,
    CLOSE_TOO_LARGE,
    ErrorMessage,
    KeelError,
    ProtocolError,
)
from wire.live import LIVE_TYPES, Live, LivePoints, LiveStatus, read_live
from wire.messages import (
    ACCEPTS,
    FINISH_STATUSES,
    MAX_CONFIG_DEPTH,
    MAX_SEQ,
    MAX_STEP,
    PROTOCOL_VERSION,
    SAMPLE_FIELDS,
    Finish,
    Hello,
    Histogram,
    Limits,
    Points,
    Row,
    RunInfo,
    Sequences,
    decode_value,
    encode_details,
    encode_rows,
    encode_samples,
    encode_value,
    parse_config,
    parse_rows,
    parse_seq,
    points_frame,
    read_value,
)
from wire.replies import REPLY_TYPES, Ack, Bye, Reject, Reply, Welcome, read_reply

__all__ = [
    "ACCEPTS",
    "CLOSE_AUTH",
    "CLOSE_CONFLICT",
    "CLOSE_FORBIDDEN",
    "CLOSE_IDLE",
    "CLOSE_MALFORMED",
    "CLOSE_OVERLOADED",
    "CLOSE_SERVER_FAULT",
    "CLOSE_TOO_LARGE",
    "FINISH_STATUSES",
    "LIVE_TYPES",
    "Finish",
    "Hello",
    "MAX_CONFIG_DEPTH",
    "MAX_SEQ",
    "MAX_STEP",
    "PROTOCOL_VERSION",
    "REPLY_TYPES",
    "SAMPLE_FIELDS",
    "Ack",
    "Bye",
    "ErrorMessage",
    "Histogram",
    "Points",
    "KeelError",
    "Limits",
    "Live",
    "LivePoints",
    "LiveStatus",
    "ProtocolError",
    "Reject",
    "Reply",
    "Row",
    "RunInfo",
    "Sequences",
    "Welcome",
    "decode_value",
    "encode_details",
    "encode_rows",
    "encode_samples",
    "encode_value",
    "parse_config",
    "parse_rows",
    "parse_seq",
    "points_frame",
    "read_live",
    "read_reply",
    "read_value",
]
