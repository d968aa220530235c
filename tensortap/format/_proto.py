"""A minimal protobuf wire-format codec for the few messages smdebug and TensorBoard event files use.

Written by hand on purpose: the `protobuf` package can only parse messages through classes generated from
.proto files (smdebug ships its own generated `*_pb2` modules), and a reader of a handful of fields does
not justify that dependency. Covered (spec 2.2): Event, Summary, Summary.Value, SummaryMetadata, PluginData,
TensorProto, TensorShapeProto, and an encoder for the same messages (tests, TensorBoard export).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# wire types
VARINT = 0
FIXED64 = 1
LEN = 2
FIXED32 = 5

# TensorFlow DataType enum (spec 2.2)
DT_INVALID = 0
DT_FLOAT = 1
DT_DOUBLE = 2
DT_INT32 = 3
DT_UINT8 = 4
DT_INT16 = 5
DT_INT8 = 6
DT_STRING = 7
DT_COMPLEX64 = 8
DT_INT64 = 9
DT_BOOL = 10
DT_QINT8 = 11
DT_QUINT8 = 12
DT_QINT32 = 13
DT_BFLOAT16 = 14
DT_QINT16 = 15
DT_QUINT16 = 16
DT_UINT16 = 17
DT_COMPLEX128 = 18
DT_HALF = 19
DT_RESOURCE = 20
DT_VARIANT = 21
DT_UINT32 = 22
DT_UINT64 = 23

# Little-endian numpy dtypes of the numeric DataTypes (BFLOAT16 is resolved lazily through ml_dtypes).
_NUMPY_OF_DT: dict[int, str] = {
    DT_FLOAT: "<f4",
    DT_DOUBLE: "<f8",
    DT_INT32: "<i4",
    DT_UINT8: "u1",
    DT_INT16: "<i2",
    DT_INT8: "i1",
    DT_COMPLEX64: "<c8",
    DT_INT64: "<i8",
    DT_BOOL: "?",
    DT_QINT8: "i1",
    DT_QUINT8: "u1",
    DT_QINT32: "<i4",
    DT_QINT16: "<i2",
    DT_QUINT16: "<u2",
    DT_UINT16: "<u2",
    DT_COMPLEX128: "<c16",
    DT_HALF: "<f2",
    DT_UINT32: "<u4",
    DT_UINT64: "<u8",
}

_DT_OF_NUMPY: dict[str, int] = {
    "float16": DT_HALF,
    "float32": DT_FLOAT,
    "float64": DT_DOUBLE,
    "int8": DT_INT8,
    "int16": DT_INT16,
    "int32": DT_INT32,
    "int64": DT_INT64,
    "uint8": DT_UINT8,
    "uint16": DT_UINT16,
    "uint32": DT_UINT32,
    "uint64": DT_UINT64,
    "complex64": DT_COMPLEX64,
    "complex128": DT_COMPLEX128,
    "bool": DT_BOOL,
    "bfloat16": DT_BFLOAT16,
}


class ProtoError(ValueError):
    """The bytes are not a valid encoding of the expected message."""


# ----------------------------------------------------------------------------------------------- decoding
def read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    """(value, new position) of the varint at `pos`."""
    result = 0
    shift = 0
    n = len(buf)
    while True:
        if pos >= n:
            raise ProtoError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise ProtoError("varint too long")


def iter_fields(buf: bytes) -> list[tuple[int, int, Any]]:
    """(field number, wire type, value) of every field: ints for VARINT/FIXED*, bytes for LEN."""
    out: list[tuple[int, int, Any]] = []
    pos, n = 0, len(buf)
    while pos < n:
        key, pos = read_varint(buf, pos)
        num, wt = key >> 3, key & 7
        if num == 0:
            raise ProtoError("field number 0")
        if wt == VARINT:
            val, pos = read_varint(buf, pos)
        elif wt == FIXED64:
            if pos + 8 > n:
                raise ProtoError("truncated fixed64")
            val = buf[pos : pos + 8]
            pos += 8
        elif wt == LEN:
            ln, pos = read_varint(buf, pos)
            if pos + ln > n:
                raise ProtoError(f"length-delimited field {num} runs past the end")
            val = buf[pos : pos + ln]
            pos += ln
        elif wt == FIXED32:
            if pos + 4 > n:
                raise ProtoError("truncated fixed32")
            val = buf[pos : pos + 4]
            pos += 4
        else:
            raise ProtoError(f"unsupported wire type {wt} (field {num})")
        out.append((num, wt, val))
    return out


def _signed64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _packed_varints(data: bytes) -> list[int]:
    vals, pos = [], 0
    while pos < len(data):
        v, pos = read_varint(data, pos)
        vals.append(v)
    return vals


def _str(v: Any) -> str:
    if not isinstance(v, bytes):
        raise ProtoError("expected a string field")
    return v.decode("utf-8", errors="replace")


@dataclass
class TensorShape:
    dims: list[int] = field(default_factory=list)
    unknown_rank: bool = False


@dataclass
class TensorProto:
    dtype: int = DT_INVALID
    shape: TensorShape = field(default_factory=TensorShape)
    tensor_content: bytes = b""
    string_val: list[bytes] = field(default_factory=list)
    # repeated typed values (used when tensor_content is empty): field number -> raw pieces
    typed: dict[int, list[tuple[int, Any]]] = field(default_factory=dict)


@dataclass
class SummaryValue:
    tag: str = ""
    node_name: str = ""
    plugins: dict[str, str] = field(default_factory=dict)  # plugin_name -> content
    simple_value: float | None = None
    tensor: TensorProto | None = None
    histo: bytes | None = None  # the raw HistogramProto


@dataclass
class Event:
    wall_time: float = 0.0
    step: int = 0
    values: list[SummaryValue] = field(default_factory=list)
    file_version: str | None = None


def decode_shape(buf: bytes) -> TensorShape:
    shape = TensorShape()
    for num, wt, val in iter_fields(buf):
        if num == 2 and wt == LEN:
            size = 0
            for dnum, dwt, dval in iter_fields(val):
                if dnum == 1 and dwt == VARINT:
                    size = _signed64(dval)
            shape.dims.append(size)
        elif num == 3 and wt == VARINT:
            shape.unknown_rank = bool(val)
    return shape


def decode_tensor(buf: bytes) -> TensorProto:
    t = TensorProto()
    for num, wt, val in iter_fields(buf):
        if num == 1 and wt == VARINT:
            t.dtype = val
        elif num == 2 and wt == LEN:
            t.shape = decode_shape(val)
        elif num == 4 and wt == LEN:
            t.tensor_content = bytes(val)
        elif num == 8 and wt == LEN:
            t.string_val.append(bytes(val))
        elif num in (5, 6, 7, 9, 10, 11, 12, 13, 16, 17):
            t.typed.setdefault(num, []).append((wt, val))
    return t


def decode_plugin(buf: bytes) -> tuple[str, str]:
    name = content = ""
    for num, wt, val in iter_fields(buf):
        if num == 1 and wt == LEN:
            name = _str(val)
        elif num == 2 and wt == LEN:
            content = _str(val)
    return name, content


def decode_value(buf: bytes) -> SummaryValue:
    v = SummaryValue()
    for num, wt, val in iter_fields(buf):
        if num == 1 and wt == LEN:
            v.tag = _str(val)
        elif num == 7 and wt == LEN:
            v.node_name = _str(val)
        elif num == 9 and wt == LEN:
            for mnum, mwt, mval in iter_fields(val):
                if mnum == 1 and mwt == LEN:
                    name, content = decode_plugin(mval)
                    v.plugins[name] = content
        elif num == 2 and wt == FIXED32:
            v.simple_value = struct.unpack("<f", val)[0]
        elif num == 8 and wt == LEN:
            v.tensor = decode_tensor(val)
        elif num == 5 and wt == LEN:
            v.histo = bytes(val)
    return v


def decode_event(buf: bytes) -> Event:
    """Parse a serialized Event (only the fields smdebug and TensorBoard scalars/tensors use)."""
    ev = Event()
    for num, wt, val in iter_fields(buf):
        if num == 1 and wt == FIXED64:
            ev.wall_time = struct.unpack("<d", val)[0]
        elif num == 2 and wt == VARINT:
            ev.step = _signed64(val)
        elif num == 3 and wt == LEN:
            ev.file_version = _str(val)
        elif num == 5 and wt == LEN:
            for snum, swt, sval in iter_fields(val):
                if snum == 1 and swt == LEN:
                    ev.values.append(decode_value(sval))
    return ev


# ---------------------------------------------------------------------------------- TensorProto -> numpy
class UnsupportedDtype(ValueError):
    """A DataType this installation cannot represent (e.g. BFLOAT16 without ml_dtypes)."""


def numpy_dtype(dt: int) -> np.dtype:
    """The numpy dtype of a numeric DataType; UnsupportedDtype otherwise."""
    if dt == DT_BFLOAT16:
        try:
            import ml_dtypes
        except ImportError as e:
            raise UnsupportedDtype("a BFLOAT16 tensor needs the ml_dtypes package (pip install ml_dtypes)") from e
        return np.dtype(ml_dtypes.bfloat16)
    try:
        return np.dtype(_NUMPY_OF_DT[dt])
    except KeyError:
        raise UnsupportedDtype(f"unsupported tensor DataType {dt}") from None


def _typed_values(t: TensorProto, dtype: np.dtype) -> np.ndarray:
    """The repeated *_val fields of a TensorProto without tensor_content, as a flat array."""
    dt = t.dtype
    if dt in (DT_HALF, DT_BFLOAT16):
        fields, kind = (13,), "varint"
    elif dt == DT_FLOAT:
        fields, kind = (5,), "f4"
    elif dt == DT_DOUBLE:
        fields, kind = (6,), "f8"
    elif dt == DT_COMPLEX64:
        fields, kind = (9,), "f4"
    elif dt == DT_COMPLEX128:
        fields, kind = (12,), "f8"
    elif dt == DT_INT64:
        fields, kind = (10,), "varint"
    elif dt == DT_BOOL:
        fields, kind = (11,), "varint"
    elif dt == DT_UINT32:
        fields, kind = (16,), "varint"
    elif dt == DT_UINT64:
        fields, kind = (17,), "varint"
    else:  # int8/16/32, uint8/16, quantized
        fields, kind = (7,), "varint"
    vals: list[Any] = []
    for f in fields:
        for wt, raw in t.typed.get(f, []):
            if kind == "varint":
                if wt == LEN:
                    vals.extend(_packed_varints(raw))
                elif wt == VARINT:
                    vals.append(raw)
            else:
                width = 4 if kind == "f4" else 8
                if wt == LEN:
                    vals.extend(np.frombuffer(raw, dtype=f"<{kind}").tolist())
                elif wt == (FIXED32 if width == 4 else FIXED64):
                    vals.append(struct.unpack("<f" if width == 4 else "<d", raw)[0])
    if kind == "varint":
        if dt in (DT_HALF, DT_BFLOAT16):
            return np.array(vals, dtype="<u2").view(dtype)
        if dt in (DT_UINT32, DT_UINT64, DT_BOOL):
            return np.array(vals, dtype="<u8").astype(dtype)
        return np.array([_signed64(v) for v in vals], dtype="<i8").astype(dtype)
    arr = np.array(vals, dtype=f"<{kind}")
    if dtype.kind == "c":
        if len(arr) % 2:
            raise ProtoError("odd number of values in a complex tensor")
        arr = arr[0::2] + 1j * arr[1::2]
    return arr.astype(dtype)


def tensor_to_numpy(t: TensorProto) -> np.ndarray:
    """Decode a TensorProto into a numpy array of its shape; every numeric DataType and strings."""
    shape = tuple(t.shape.dims)
    if any(d < 0 for d in shape):
        raise ProtoError(f"tensor shape {shape} has unknown dimensions")
    size = int(np.prod(shape, dtype=np.int64))
    if t.dtype in (DT_INVALID, DT_STRING):
        # smdebug leaves dtype at 0 for strings (spec 2.4); TensorFlow uses DT_STRING.
        if len(t.string_val) != size and not (size == 0 and not t.string_val):
            raise ProtoError(f"{len(t.string_val)} strings for shape {shape}")
        try:
            items: list[Any] = [s.decode("utf-8") for s in t.string_val]
            arr = np.array(items, dtype=str) if items else np.zeros(0, dtype="<U1")
        except UnicodeDecodeError:
            arr = np.array(t.string_val, dtype=bytes)
        return arr.reshape(shape)
    dtype = numpy_dtype(t.dtype)
    if t.tensor_content:
        if len(t.tensor_content) != size * dtype.itemsize:
            raise ProtoError(
                f"tensor_content has {len(t.tensor_content)} bytes, shape {shape} of {dtype} needs "
                f"{size * dtype.itemsize}"
            )
        return np.frombuffer(t.tensor_content, dtype=dtype).reshape(shape).copy()
    flat = _typed_values(t, dtype)
    if len(flat) == size:
        return flat.reshape(shape)
    if len(flat) == 0:
        return np.zeros(shape, dtype=dtype)
    if len(flat) < size:  # TensorFlow semantics: the last value is repeated
        return np.concatenate([flat, np.full(size - len(flat), flat[-1], dtype=dtype)]).reshape(shape)
    raise ProtoError(f"{len(flat)} values for shape {shape}")


# ----------------------------------------------------------------------------------------------- encoding
def encode_varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _key(num: int, wt: int) -> bytes:
    return encode_varint((num << 3) | wt)


def field_varint(num: int, value: int) -> bytes:
    return _key(num, VARINT) + encode_varint(value)


def field_bytes(num: int, data: bytes | str) -> bytes:
    if isinstance(data, str):
        data = data.encode("utf-8")
    return _key(num, LEN) + encode_varint(len(data)) + data


def field_double(num: int, value: float) -> bytes:
    return _key(num, FIXED64) + struct.pack("<d", value)


def field_float(num: int, value: float) -> bytes:
    return _key(num, FIXED32) + struct.pack("<f", value)


def encode_shape(shape: tuple[int, ...], tag: str | None = None) -> bytes:
    """TensorShapeProto; with `tag`, dims get smdebug's redundant names f"{tag}_{size}"."""
    out = b""
    for d in shape:
        dim = field_varint(1, d) if d else b""
        if tag is not None:
            dim += field_bytes(2, f"{tag}_{d}")
        out += field_bytes(2, dim)
    return out


def encode_tensor(arr: np.ndarray, tag: str | None = None) -> bytes:
    """TensorProto the way smdebug writes it: dtype + tensor_content, or string_val for strings."""
    arr = np.asarray(arr)
    shape = encode_shape(arr.shape, tag)
    if arr.dtype.kind in "USO":
        out = field_bytes(2, shape) if shape else b""
        for s in arr.reshape(-1):
            out += field_bytes(8, s if isinstance(s, bytes) else str(s).encode("utf-8"))
        return out
    dt = _DT_OF_NUMPY.get(arr.dtype.name)
    if dt is None:
        raise UnsupportedDtype(f"cannot encode numpy dtype {arr.dtype}")
    content = np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
    out = field_varint(1, dt)
    if shape:
        out += field_bytes(2, shape)
    if content:
        out += field_bytes(4, content)
    return out


def encode_value(
    tag: str,
    *,
    tensor: np.ndarray | None = None,
    simple_value: float | None = None,
    histo: bytes | None = None,
    plugins: dict[str, str] | None = None,
) -> bytes:
    """One Summary.Value."""
    out = field_bytes(1, tag)
    if simple_value is not None:
        out += field_float(2, simple_value)
    if histo is not None:
        out += field_bytes(5, histo)
    if tensor is not None:
        out += field_bytes(8, encode_tensor(tensor, tag))
    if plugins:
        meta = b"".join(field_bytes(1, field_bytes(1, k) + field_bytes(2, v)) for k, v in plugins.items())
        out += field_bytes(9, meta)
    return out


def encode_event(
    wall_time: float, step: int, values: list[bytes] | None = None, file_version: str | None = None
) -> bytes:
    """An Event holding a Summary of already-encoded values (or a file_version header)."""
    out = field_double(1, wall_time)
    if step:
        out += field_varint(2, step)
    if file_version is not None:
        out += field_bytes(3, file_version)
    if values is not None:
        out += field_bytes(5, b"".join(field_bytes(1, v) for v in values))
    return out
