"""Collectives and the bytes they move, read from compiled HLO text.

`collectives(hlo_text)` counts the all-to-all / all-gather / all-reduce /
reduce-scatter / collective-permute instructions of a compiled module (an async
`-start`/`-done` pair counts once), and the program's collectives (`operations`: as
`counts`, but each operand of an all-reduce counts: XLA combines independent
all-reduces into one instruction of several operands, each one of the program's
`psum`s), and sums, per device and per call:

- `operand_bytes`: the bytes of each collective's operands (looked up by name in
  the module: compiled HLO prints operands by name only);
- `sent_bytes`: what each device sends, by the usual algorithms: all-to-all
  `S (g-1)/g`, all-gather `S (g-1)`, all-reduce `2 S (g-1)/g` (ring),
  reduce-scatter `S (g-1)/g`, collective-permute `S`, with `S` the operand bytes and
  `g` the replica-group size. This is the quantity `parop`'s `Plan.bytes` predicts.
"""

from __future__ import annotations

import math
import re

KINDS = ("all-to-all", "all-gather", "all-reduce", "reduce-scatter", "collective-permute")

_ITEMSIZE = {
    "pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
    "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
}
_ARRAY = re.compile(r"\b([a-z]+\d*)\[([\d,]*)\]")
_COMMENT = re.compile(r"/\*.*?\*/")
_DEF = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*")


def shape_bytes(shape: str) -> int:
    """Bytes of an HLO shape string (an array or a tuple of arrays)."""
    total = 0
    for dtype, dims in _ARRAY.findall(shape):
        if dtype in _ITEMSIZE:
            total += _ITEMSIZE[dtype] * math.prod(int(d) for d in dims.split(",") if d)
    return total


def _split_top(s: str) -> list[str]:
    """`s` split at the commas outside any brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(s):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(s[start:i].strip())
            start = i + 1
    if s[start:].strip():
        parts.append(s[start:].strip())
    return parts


def _closing(s: str, i: int) -> int:
    """The index of the bracket closing the one at `s[i]`."""
    depth = 0
    for j in range(i, len(s)):
        if s[j] in "([{":
            depth += 1
        elif s[j] in ")]}":
            depth -= 1
            if depth == 0:
                return j
    return len(s) - 1


def _instructions(text: str):
    """(name, shape, opcode, operands, attributes) for each instruction line."""
    for line in text.splitlines():
        line = _COMMENT.sub("", line)
        m = _DEF.match(line)
        if not m:
            continue
        rest = line[m.end():]
        if rest.startswith("("):
            end = _closing(rest, 0)
            shape, rest = rest[: end + 1], rest[end + 1:].lstrip()
        else:
            shape, _, rest = rest.partition(" ")
        op_m = re.match(r"([\w\-]+)\(", rest)
        if not op_m:
            continue
        open_ = op_m.end() - 1
        close = _closing(rest, open_)
        yield m.group(1), shape, op_m.group(1), _split_top(rest[open_ + 1: close]), rest[close + 1:]


def _group_size(attrs: str, default: int) -> int:
    m = re.search(r"replica_groups=\{\{([\d,]*)\}", attrs)
    if m:
        return len([d for d in m.group(1).split(",") if d])
    m = re.search(r"replica_groups=\[([\d,]+)\]<=", attrs)  # iota form [groups, size]<=[n]
    if m:
        return int(m.group(1).split(",")[-1])
    m = re.search(r"source_target_pairs=", attrs)
    return 2 if m else default


def collectives(text: str, n_devices: int = 8) -> dict:
    """`{"counts": {kind: n}, "operations": {kind: n}, "operand_bytes": int,
    "sent_bytes": float, "sent_by_kind": {kind: float}}` for one compiled HLO module
    (bytes per device, per call)."""
    shapes: dict[str, str] = {}
    found = []
    for name, shape, opcode, operands, attrs in _instructions(text):
        shapes[name] = shape
        base = opcode[: -len("-start")] if opcode.endswith("-start") else opcode
        if base in KINDS:
            found.append((base, shape, operands, attrs))
    counts = {k: 0 for k in KINDS}
    operations = {k: 0 for k in KINDS}
    by_kind = {k: 0.0 for k in KINDS}
    operand_total = 0
    for kind, shape, operands, attrs in found:
        counts[kind] += 1
        operations[kind] += max(len(operands), 1) if kind == "all-reduce" else 1
        nbytes = 0
        for operand in operands:
            ref = operand.split()[-1].lstrip("%")
            nbytes += shape_bytes(shapes[ref]) if ref in shapes else shape_bytes(operand)
        if not nbytes:  # operands not resolvable: fall back on the result shape
            nbytes = shape_bytes(shape)
        g = max(_group_size(attrs, n_devices), 1)
        operand_total += nbytes
        by_kind[kind] += {
            "all-to-all": nbytes * (g - 1) / g,
            "all-gather": nbytes * (g - 1),
            "all-reduce": 2 * nbytes * (g - 1) / g,
            "reduce-scatter": nbytes * (g - 1) / g,
            "collective-permute": nbytes,
        }[kind]
    return {"counts": counts, "operations": operations, "operand_bytes": operand_total,
            "sent_bytes": sum(by_kind.values()), "sent_by_kind": by_kind}
