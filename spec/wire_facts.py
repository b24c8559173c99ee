"""The byte-level choices of vLLM's msgpack writer (msgspec) that a byte-exact peer needs,
and the tagged JSON of the suite's line protocol, as data for ``enginewire spec export``.

Everything here is what msgspec 0.19 writes for vLLM 0.33.0's ``MsgpackEncoder``; a reader
accepts every valid msgpack form, a writer that wants vLLM's bytes writes exactly these.
"""

from __future__ import annotations

from typing import Any

MSGPACK: dict[str, Any] = {
    "writer": "msgspec.msgpack (vLLM's MsgpackEncoder)",
    "integers": "the shortest form for the value: positive fixint (00-7f), uint8/16/32/64 "
                "(cc/cd/ce/cf) for other non-negative values, negative fixint (e0-ff), "
                "int8/16/32/64 (d0/d1/d2/d3) for other negative values; 2**40 is "
                "cf 00 00 01 00 00 00 00 00",
    "floats": "always float64 (cb + 8 bytes big-endian), never float32; 1.0 is "
              "cb 3f f0 00 00 00 00 00 00",
    "strings": "text as str in UTF-8 with the shortest header (fixstr a0-bf, str8 d9, "
               "str16 da, str32 db)",
    "bytes": "bytes and bytearray as bin (c4/c5/c6), never str",
    "nil_and_bool": "None is c0, False c2, True c3",
    "arrays": "lists, tuples, sets and array-encoded structs: the shortest header for the "
              "element count (fixarray 90-9f, array16 dc, array32 dd)",
    "maps": "dicts: the shortest header for the key count (fixmap 80-8f, map16 de, map32 df), "
            "keys in insertion order",
    "map_structs": "a map-encoded struct writes its fields in declaration order (the spec's "
                   "field order). With omit_defaults a field equal to its default is left out, "
                   "but the header's width follows the struct's total field count, not the "
                   "keys written: fixmap (80 + n) for a struct of at most 15 fields, map16 "
                   "(de, two-byte count n) for more; SamplingParams (more than 15 fields) with "
                   "5 keys written starts de 00 05",
    "array_structs": "an array-encoded struct writes every field, in declaration order "
                     "(no omission), header by its field count",
    "enums": "an enum travels as its value (int or str), never its name",
    "ext": {
        "header": "fixext1/2/4/8/16 (d4-d8) when the data is exactly 1, 2, 4, 8 or 16 bytes, "
                  "else ext8/16/32 (c7/c8/c9); the type code follows the length",
        "codes": {"1": "pickle (only with insecure serialization)",
                  "2": "cloudpickle (only with insecure serialization)",
                  "3": "raw view: tensor or ndarray data inline, the bytes in C order"},
    },
    "tensors": "[dtype name, shape array, data]: data is ext 3 when the byte size is below "
               "the inline threshold (bytes, not elements), else an int, the 1-based index of "
               "the out-of-band frame that follows frame 0",
}

TAGGED_JSON: dict[str, Any] = {
    "numbers": "a JSON number with a fraction or exponent (1.0, 1e-3) is a float, one "
               "without is an int; a float that is integral is still written with '.0'; "
               "non-finite floats are {\"$float\": \"nan\"|\"inf\"|\"-inf\"}",
    "big_integers": "integers are written with every digit, up to 2**64 - 1 and down to "
                    "-2**63: a reader must parse them exactly (in JavaScript, not as a "
                    "double above 2**53: keep the digits, e.g. as BigInt)",
    "tags": {"$tensor": "{dtype, shape, hex}: a torch tensor, dtype a torch name",
             "$ndarray": "{dtype, shape, hex}: a numpy array, dtype a numpy str",
             "$set": "a set, its items in any order",
             "$bytes": "hex of bytes",
             "$map": "[[key, value], ...]: a dict whose keys are not all strings (or a key "
                     "starts with '$')",
             "$slice": "[start, stop, step]",
             "$float": "a non-finite float"},
    "key_order": "object keys carry no meaning: a struct's fields may come in any order; the "
                 "suite writes them in declaration order",
    "structs": "a struct is an object by field name, whatever its wire encoding (array "
               "structs too)",
    "decoded_values": "a decoded struct lists every field of the struct, defaults included "
                      "(a field left out is a difference); an encoder's input may leave out "
                      "fields at their default",
    "frames": "frames and buffers are lists of lowercase hex strings",
}


def wire_facts() -> dict[str, Any]:
    """The facts above as one JSON-ready mapping."""
    return {"msgpack": MSGPACK, "tagged_json": TAGGED_JSON}
