"""How operators show themselves: a one-line `repr`, a tree with shapes and dtypes
(`po.tree`), and an HTML table for Jupyter."""

from __future__ import annotations

import html as _html

from .algebra import Compose, Kron, Scale, Sum, Transpose
from .operator import Operator
from .operators import Leaf


def fmt_bytes(n: float) -> str:
    """`512 B`, `5.9 KiB`, `1.2 GiB`."""
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _leaf(op: Operator) -> str | None:
    """A leaf's label (each leaf says how it shows: `Leaf.describe`); None for a combinator."""
    return op.describe() if isinstance(op, Leaf) else None


def short(op: Operator) -> str:
    """One line: `DFT(30) ⊗ DFT(20) ⊗ rDFT(10)`, `R(32→12) @ DFT(32)`, ..."""
    label = _leaf(op)
    if label is not None:
        return label

    def wrap(child, *inner):
        text = short(child)
        return f"({text})" if isinstance(child, inner) else text

    if isinstance(op, Kron):
        return " ⊗ ".join(wrap(f, Compose, Sum, Scale) for f in op.factors)
    if isinstance(op, Compose):
        return " @ ".join(wrap(o, Kron, Sum) for o in op.ops)
    if isinstance(op, Sum):
        text = wrap(op.terms[0], Sum)
        for t in op.terms[1:]:
            negative = isinstance(t, Scale) and not t.first and isinstance(t.c, float) and t.c < 0
            text += f" - {short(Scale(-t.c, t.op))}" if negative else f" + {wrap(t, Sum)}"
        return text
    if isinstance(op, Scale):
        inner = wrap(op.op, Kron, Compose, Sum)
        if isinstance(op.c, (int, float)) and op.c == 1:
            return inner
        return f"{inner}·{scalar(op.c)}" if op.first else f"{scalar(op.c)}·{inner}"
    if isinstance(op, Transpose):
        return f"{wrap(op.op, Kron, Compose, Sum, Scale)}ᵀ"
    return op.describe() if hasattr(op, "describe") else type(op).__name__


def scalar(c) -> str:
    """A scalar as an operator's repr shows it (`c` for a traced one)."""
    return f"{c:g}" if isinstance(c, (int, float, complex)) else "c"


def _child_dtypes(op: Operator, dtype) -> list:
    """The dtype each child of `op` really sees on `dtype` input (a structural leaf
    such as `Restriction` carries whatever flows through it)."""
    children = op.children()
    if isinstance(op, Kron):
        seen, order = {}, op.schedule(dtype)[0]
        for i in order:
            seen[i] = dtype
            dtype = children[i].out_dtype(dtype)
        return [seen[i] for i in range(len(children))]
    if isinstance(op, Compose):
        seen = []
        for child in reversed(children):
            seen.append(dtype)
            dtype = child.out_dtype(dtype)
        return seen[::-1]
    return [dtype] * len(children)


def _rows(op: Operator, depth: int = 0, dtype=None):
    """`(depth, label, operator, input dtype, output dtype)` for each node (of a named
    operator: see `Operator.named`)."""
    dtype = op.dtype if dtype is None else dtype
    name = _leaf(op) or {Kron: "⊗ kron", Compose: "@ compose", Sum: "+ sum", Transpose: "ᵀ transpose"}.get(type(op))
    if name is None:
        name = short(op) if not isinstance(op, Scale) else f"{scalar(op.c)}· scale"
    yield depth, name, op, dtype, op.out_dtype(dtype)
    if _leaf(op) is None:
        for child, d in zip(op.children(), _child_dtypes(op, dtype)):
            yield from _rows(child, depth + 1, d)


def tree(op: Operator) -> str:
    """The operator tree, one node a line, with shapes, the dtypes that flow there and
    the names of the weights (`op.named`).

    ```python
    >>> print(po.tree(po.kron(po.DFT(30), po.DFT(10, dtype=jnp.float32))))
    ⊗ kron          (30, 10) float32 → (30, 6) complex64
      DFT(30)       (30,) complex64 → (30,) complex64
      rDFT(10)      (10,) float32 → (6,) complex64
    ```
    """
    rows = [("  " * d + name, f"{o.domain_shape} {i} → {o.range_shape} {out}") for d, name, o, i, out in _rows(op.named)]
    width = max(len(r[0]) for r in rows) + 2
    return "\n".join(f"{a:<{width}}{b}" for a, b in rows)


def html(op: Operator) -> str:
    """The tree as an HTML table, for Jupyter."""
    body = "".join(
        f"<tr><td style='text-align:left;padding-left:{1.2 * d + 0.3:.1f}em'>{_html.escape(name)}</td>"
        f"<td>{_html.escape(str(o.domain_shape))}</td><td>{i}</td>"
        f"<td>{_html.escape(str(o.range_shape))}</td><td>{out}</td>"
        f"<td>{_html.escape(', '.join(sorted(o.parameters))) if _leaf(o) else ''}</td></tr>"
        for d, name, o, i, out in _rows(op.named)
    )
    return (
        f"<div><code>{_html.escape(short(op.named))}</code><table>"
        "<tr><th>operator</th><th>domain</th><th>dtype</th><th>range</th><th>dtype</th>"
        f"<th>parameters</th></tr>{body}</table></div>"
    )
