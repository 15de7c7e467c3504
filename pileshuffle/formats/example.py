"""Features of a serialized ``tf.train.Example``, read from the protobuf wire format without
TensorFlow: what TFRecord users keep a label in.

    Example  { Features features = 1; }
    Features { map<string, Feature> feature = 1; }     (entries: key = 1, value = 2)
    Feature  { BytesList bytes_list = 1; FloatList float_list = 2; Int64List int64_list = 3; }
    *List    { repeated value = 1; }                   (numbers packed or not)
"""

import struct

__all__ = ["feature_values", "NotAnExample"]

_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5


class NotAnExample(ValueError):
    """The bytes are no ``tf.train.Example`` (or a wire-format error inside one)."""


def _varint(buf: bytes, pos: int):
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise NotAnExample("a varint runs past its message")
        byte = buf[pos]
        value |= (byte & 0x7F) << shift
        pos, shift = pos + 1, shift + 7
        if not byte & 0x80:
            return value, pos


def _fields(buf: bytes, start: int, end: int):
    """``(field number, wire type, value)`` of a message ``buf[start:end]``: an int for
    varints and fixed numbers, a ``(begin, end)`` span for length-delimited fields."""
    pos = start
    while pos < end:
        tag, pos = _varint(buf, pos)
        number, kind = tag >> 3, tag & 7
        if kind == _VARINT:
            value, pos = _varint(buf, pos)
        elif kind == _LENGTH:
            length, pos = _varint(buf, pos)
            value, pos = (pos, pos + length), pos + length
        elif kind in (_FIXED32, _FIXED64):
            width = 4 if kind == _FIXED32 else 8
            value, pos = buf[pos : pos + width], pos + width
        else:
            raise NotAnExample(f"wire type {kind} is not used by tf.train.Example")
        if pos > end:
            raise NotAnExample("a field runs past its message")
        yield number, kind, value


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _list_values(buf: bytes, kind_number: int, start: int, end: int) -> list:
    """The values of a BytesList (1), FloatList (2) or Int64List (3) message."""
    values = []
    for number, kind, value in _fields(buf, start, end):
        if number != 1:
            continue
        if kind_number == 1:
            values.append(buf[value[0] : value[1]])
        elif kind_number == 2:
            raw = buf[value[0] : value[1]] if kind == _LENGTH else value
            values += list(struct.unpack(f"<{len(raw) // 4}f", raw))
        elif kind == _LENGTH:  # packed int64s
            pos, stop = value
            while pos < stop:
                number_value, pos = _varint(buf, pos)
                values.append(_signed(number_value))
        else:
            values.append(_signed(value))
    return values


def feature_values(payload: bytes, name: str):
    """The values of feature ``name`` of a serialized ``tf.train.Example`` (a list of
    ``bytes``, floats or ints), or None when it has no such feature; ``NotAnExample`` when
    ``payload`` is not one."""
    wanted = name.encode()
    for number, kind, span in _fields(payload, 0, len(payload)):
        if number != 1 or kind != _LENGTH:
            continue
        for entry_number, entry_kind, entry in _fields(payload, *span):
            if entry_number != 1 or entry_kind != _LENGTH:
                continue
            key, feature = None, None
            for part_number, part_kind, part in _fields(payload, *entry):
                if part_kind != _LENGTH:
                    continue
                if part_number == 1:
                    key = payload[part[0] : part[1]]
                elif part_number == 2:
                    feature = part
            if key != wanted or feature is None:
                continue
            for list_number, list_kind, values in _fields(payload, *feature):
                if list_kind == _LENGTH and list_number in (1, 2, 3):
                    return _list_values(payload, list_number, *values)
            return []
    return None
