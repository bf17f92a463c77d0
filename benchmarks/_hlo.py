"""Collectives and the bytes they move, read from compiled HLO text: the library's
`parop.distributed.hlo` (the dry run reads its collectives there too), and `HloLog`,
one row of them per program a benchmark run compiles."""

from __future__ import annotations

from dataclasses import dataclass, field

from parop.distributed.hlo import KINDS, collectives, shape_bytes

__all__ = ["KINDS", "HloLog", "collectives", "shape_bytes"]


@dataclass
class HloLog:
    """The collectives of every compiled program a benchmark run looked at, one row per
    program (case f's table), next to parop's own count and bytes where a plan is given.

    ```python
    log = HloLog()
    log.add("c2c 32³", "parop", jax.jit(lambda x: D @ x).lower(xs).compile(), plan=D.plan)
    ```
    """

    n_devices: int = 8
    rows: list[dict] = field(default_factory=list)

    def add(self, problem: str, program: str, compiled, plan=None) -> dict:
        """Adds the row of the collectives of `compiled` (a `jax.stages.Compiled`, e.g.
        `jax.jit(f).lower(x).compile()`)."""
        info = collectives(compiled.as_text(), self.n_devices)
        row = {"problem": problem, "program": program, **info["counts"],
               "operand_bytes": info["operand_bytes"], "sent_bytes": info["sent_bytes"]}
        if plan is not None:
            counts = plan.collectives()
            row |= {"plan_all_to_all": counts["all_to_all"], "plan_psum": counts["psum"], "plan_bytes": plan.bytes}
        self.rows.append(row)
        return row
