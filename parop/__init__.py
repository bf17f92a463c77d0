"""parop: parametric linear operators in JAX that compose like matrices and run
distributed.

```python
import jax, jax.numpy as jnp, parop as po

F = po.kron(po.DFT(30), po.DFT(20), po.DFT(10, dtype=jnp.float32))
y = F @ x                                   # x: (30, 20, 10) float32 -> (30, 20, 6) complex64
D = po.distribute(F, partition=(2, 1, 1))   # the same map, one shard_map program
```
"""

from . import checkpoint, testing
from .algebra import Compose, Kron, Scale, Sum, kron
from .display import tree
from .distributed import CostModel, DistributedOperator, Plan, calibrate, distribute, distribute_chain
from .distributed.operator import plan
from .operator import Bound, Operator
from .operators import (
    DFT, Adjoint, Convolution, Diagonal, Identity, InverseDFT, Leaf, Matrix, PerModeMatrix,
    Reduce, Restriction, Role, Stencil,
)
from .params import init
from .testing import to_dense

__all__ = [
    "Adjoint", "Bound", "Compose", "Convolution", "CostModel", "DFT", "Diagonal", "DistributedOperator",
    "Identity", "InverseDFT", "Kron", "Leaf", "Matrix", "Operator", "PerModeMatrix", "Plan", "Reduce",
    "Restriction", "Role", "Scale", "Stencil", "Sum", "calibrate", "checkpoint", "distribute", "distribute_chain", "init", "kron", "plan", "testing",
    "to_dense", "tree",
]
