"""A request body as the API reads it: one JSON object, UTF-8, reasonably shaped; anything else a 4xx.

Python's ``json`` module alone would answer several bodies with a 500 or accept what no field can
use: JSON nested a thousand levels deep exhausts the parser's recursion (``RecursionError``);
UTF-16 is silently transcoded; ``\\ud800`` becomes a lone surrogate that the tokenizer and the
response encoder cannot handle; a key given twice silently keeps its last value. Each is checked
here, before any field is read, with a message that names the fault and the fix.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

from infer_core.server.errors import OpenAIError, bad_request

MAX_DEPTH = 64  # nesting of objects and arrays; the API's own fields nest a few levels, JSON schemas a few dozen
JSON_TYPES = ("application/json",)  # and any application/*+json

_BOMS = ((b"\x00\x00\xfe\xff", "UTF-32"), (b"\xff\xfe\x00\x00", "UTF-32"), (b"\xfe\xff", "UTF-16"),
         (b"\xff\xfe", "UTF-16"))
_UTF8_BOM = b"\xef\xbb\xbf"
_BRACKETS = np.frombuffer(b"[]{}", dtype=np.uint8)
# a JSON string, for blanking strings out before counting brackets (unrolled so long strings match at C speed)
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
# an escaped backslash (skipped), a surrogate pair (fine), or a surrogate escape on its own (refused)
_SURROGATE = re.compile(r"\\\\|\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}|\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


class _DuplicateKey(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def check_content_type(content_type: str | None) -> None:
    """415 unless the body is declared JSON (or not declared at all, as curl's ``--data-raw`` may leave it)."""
    if not content_type:
        return
    media_type, _, params = content_type.partition(";")
    media_type = media_type.strip().lower()
    if media_type not in JSON_TYPES and not (media_type.startswith("application/") and media_type.endswith("+json")):
        raise OpenAIError(415, f"the body is declared as {media_type or 'nothing'!r}, but this endpoint reads JSON: "
                               f"send it with 'Content-Type: application/json'", code="unsupported_media_type")
    for param in params.split(";"):
        name, _, value = param.partition("=")
        charset = value.strip().strip('"').lower()
        if name.strip().lower() == "charset" and charset not in ("utf-8", "utf8"):
            raise OpenAIError(415, f"the body is declared as charset={charset}, but JSON bodies must be UTF-8 "
                                   f"(RFC 8259): send UTF-8 with 'Content-Type: application/json'",
                              code="unsupported_media_type")


def decode_object(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object; 400 saying what is wrong and how to fix it."""
    text = _utf8_text(raw)
    _check_depth(raw)
    _check_surrogates(text)
    try:
        data = json.loads(text, object_pairs_hook=_object, parse_constant=_reject_constant)
    except _DuplicateKey as e:
        raise bad_request(f"the key {e.key!r} appears twice in one object of the body; JSON parsers disagree on "
                          f"which value wins, so send it once", param=e.key) from None
    except RecursionError:  # _check_depth keeps the parser far from the limit; this is a last guard
        raise bad_request(f"the body nests objects and arrays too deeply; the limit is {MAX_DEPTH} levels") from None
    except ValueError as e:
        raise bad_request(_json_error(e)) from None
    if not isinstance(data, dict):
        kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(data), "a number")
        raise bad_request(f"the body must be a JSON object of the request's fields, got {kind}")
    return data


def _utf8_text(raw: bytes) -> str:
    for bom, name in _BOMS:
        if raw.startswith(bom):
            raise bad_request(f"the body is {name} (it starts with the byte order mark {bom.hex(' ').upper()}); "
                              f"JSON bodies must be UTF-8 (RFC 8259): re-encode it as UTF-8")
    raw = raw.removeprefix(_UTF8_BOM)  # RFC 8259 lets a parser ignore it
    if raw[:4].count(0) >= 2:
        raise bad_request("the body starts with NUL bytes, as UTF-16 or UTF-32 text does; JSON bodies must be "
                          "UTF-8 (RFC 8259): re-encode it as UTF-8")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        bad = raw[e.start:e.end].hex(" ").upper()
        raise bad_request(f"the body is not valid UTF-8: byte{'s' if e.end - e.start > 1 else ''} {bad} at offset "
                          f"{e.start} ({e.reason}); JSON bodies must be UTF-8 (RFC 8259)") from None


def _check_depth(raw: bytes) -> None:
    """400 when objects and arrays nest deeper than MAX_DEPTH; a body with few brackets is not even scanned."""
    if raw.count(b"[") + raw.count(b"{") <= MAX_DEPTH:
        return
    depth = nesting_depth(raw)
    if depth > MAX_DEPTH:
        raise bad_request(f"the body nests objects and arrays {depth} levels deep; this server reads at most "
                          f"{MAX_DEPTH} (no field of the API nests more than a few): flatten it or leave the "
                          f"deep part out")


def nesting_depth(raw: bytes) -> int:
    """How deep brackets nest outside strings (strings blanked out first, then a running sum)."""
    blanked = _STRING.sub(b'""', raw)
    codes = np.frombuffer(blanked, dtype=np.uint8)
    brackets = codes[np.isin(codes, _BRACKETS)]
    steps = np.where((brackets == ord("[")) | (brackets == ord("{")), 1, -1).astype(np.int32)
    return int(np.cumsum(steps).max(initial=0))


def _check_surrogates(text: str) -> None:
    if "\\u" not in text:
        return
    for match in _SURROGATE.finditer(text):
        escape = match.group()
        if len(escape) == 6:  # neither an escaped backslash nor a pair
            raise bad_request(f"the body has the escape {escape} at character {match.start()}: a lone UTF-16 "
                              f"surrogate, which is no character; write characters beyond U+FFFF as a surrogate "
                              f"pair (\\ud83d\\ude00) or as plain UTF-8")


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return obj


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number (JSON has no NaN or infinities)")


def _json_error(error: ValueError) -> str:
    message = str(error)
    if "integer string conversion" in message:  # Python's guard against quadratic int parsing
        return "the body has an integer of more than 4300 digits; no field of the API takes numbers that large"
    if isinstance(error, json.JSONDecodeError):
        return f"the body is not valid JSON: {error.msg} at line {error.lineno}, column {error.colno}"
    return f"the body is not valid JSON: {message}"
