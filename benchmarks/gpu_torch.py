"""PyTorch `neuraloperator`'s FNO configured as parop's `FNO`, and the time of one of its
training steps: the baseline of the GPU benchmark.

No JAX here, and torch and `neuralop` are imported inside the functions, so this module
imports without them. `from neuralop.models import FNO` needs, beside torch, numpy,
scipy, opt-einsum, pyyaml, requests, tqdm and packaging: neuraloperator 2.0.0,
tensorly 0.10.0 and tensorly-torch 0.5.0 (not wandb, ruamel.yaml, zencfg or
configmypy, which its metadata lists). On a machine without a network they travel as
wheels, installed with `pip install --no-index --no-deps --target DIR *.whl`.

The network (`neuralop_fno`) is parop's (`parop/nn/fno.py`, `benchmarks/plain_fno.py`):

- input: the field (1 channel) plus `len(grid)` coordinate channels. neuraloperator's
  `positional_embedding="grid"` gives axis `k` the points `linspace(0, 1, n + 1)[:-1]`
  (`i / n`, 1 excluded: a periodic grid), parop `linspace(0, 1, n)` (`i / (n - 1)`,
  both ends). A `GridEmbeddingND` with boundaries `[0, n / (n - 1)]` per axis gives
  exactly parop's points (`i / (n - 1)`), so that is what is passed;
- lifting: one 1x1 linear layer, `1 + d -> width`, with bias (`lifting_channel_ratio=0`
  makes neuraloperator's lifting `ChannelMLP` a single layer);
- `layers` Fourier layers: a dense complex `SpectralConv` (`factorization=None`: a
  tltorch `DenseTensor`, shape `(width, width, *kept)`) plus a 1x1 linear skip
  (`fno_skip="linear"`), no channel MLP, no norm, no domain padding, GELU (exact)
  after every layer but the last. `n_modes=modes` keeps the same frequencies as
  parop's `modes`: `m` on each full-FFT axis (`(m+1)//2` non-negative, `m//2`
  negative) and `m//2 + 1` on the real-FFT (last) axis;
- projection: `width -> projection` (1x1, bias), GELU, `projection -> 1` (1x1, bias).

Differences, none of which changes the function the network can compute or its
parameter count:

- biases: parop's skip `Matrix` carries the layer's bias (`skip{k}.bias`) and its
  spectral convolution has none; neuraloperator's skip has none (`bias=False`) and its
  `SpectralConv` has one (`(width, 1, ..., 1)`), added after the inverse FFT. Both add
  one `width` bias to the sum of the two paths. Lifting and projections: biases in both;
- FFT normalisation: parop's `backward` (inverse divides by `N`), neuraloperator's
  `forward` (forward divides): the same `1/N` over the round trip;
- initial values: neuraloperator draws spectral weights normal with std
  `sqrt(2 / (2 width))` (and the spectral bias likewise), parop uniform in `[0, 1/width²)`;
- the double GELU: neuraloperator 2.0.0's `FNOBlocks.forward_with_postactivation`
  applies its non-linearity twice (once after the sum, once at the end of the block)
  when `use_channel_mlp=False`, i.e. `gelu(gelu(x))`. With `single_gelu=True` (the
  default) this module binds to the model's `FNOBlocks` a forward that does what
  neuraloperator's does for this configuration (skip, `SpectralConv`, sum) with one
  GELU; `single_gelu=False` keeps neuraloperator's own forward (one extra pointwise
  GELU per layer but the last).
"""

from __future__ import annotations

import math
import statistics
import time


def parop_param_count(grid: tuple[int, ...], width: int, modes: tuple[int, ...], layers: int,
                      projection: int = 128, in_channels: int = 1, out_channels: int = 1) -> int:
    """The number of real parameters of parop's `FNO(grid, width=, modes=, layers=,
    projection=)` (`FNO.init`), a complex spectral weight counting 2.

    From `parop/nn/fno.py`: every `Matrix(c_out, c_in)` (lift, skips, projections) has a
    bias of `c_out`; each Fourier layer's `PerModeMatrix(width, width, kept)` is complex,
    without a bias, `kept` being `m` on a full-FFT axis and `m // 2 + 1` on the real-FFT
    (last) axis: `modes=(12, 12)` on a 2-D grid keeps `(12, 7)`."""
    d = len(grid)
    *full, last = modes
    kept = math.prod(full) * (last // 2 + 1)
    lift = width * (in_channels + d) + width
    layer = 2 * width * width * kept + width * width + width
    proj = projection * width + projection + out_channels * projection + out_channels
    return lift + layers * layer + proj


def _single_gelu_forward(self, x, index=0, output_shape=None):
    """`FNOBlocks.forward_with_postactivation` of neuraloperator 2.0.0 for
    `use_channel_mlp=False`, `norm=None`, `stabilizer=None`, with its non-linearity once
    (not twice) after every layer but the last."""
    x_skip = self.convs[index].transform(self.fno_skips[index](x), output_shape=output_shape)
    x = self.convs[index](x, output_shape=output_shape) + x_skip
    if index < self.n_layers - 1:
        x = self.non_linearity(x)
    return x


def neuralop_fno(grid: tuple[int, ...], width: int, modes: tuple[int, ...], layers: int, projection: int = 128,
                 *, single_gelu: bool = True, device: str | None = None):
    """neuraloperator's FNO configured as parop's network (see the module's docstring):

    ```python
    FNO(n_modes=modes, in_channels=1, out_channels=1, hidden_channels=width, n_layers=layers,
        lifting_channel_ratio=0, projection_channel_ratio=projection / width,
        positional_embedding=GridEmbeddingND(1, dim=len(grid),
                                             grid_boundaries=[[0.0, n / (n - 1)] for n in grid]),
        non_linearity=F.gelu, norm=None, use_channel_mlp=False, fno_skip="linear",
        domain_padding=None, factorization=None, fno_block_precision="full",
        preactivation=False, separable=False)
    ```

    plus, with `single_gelu` (default), one GELU per layer instead of neuraloperator's
    two. Returns the torch module on `device` (default: cuda if available, else cpu)."""
    import types

    import torch
    import torch.nn.functional as F
    from neuralop.layers.embeddings import GridEmbeddingND
    from neuralop.models import FNO

    grid, modes = tuple(grid), tuple(modes)
    if len(modes) != len(grid):
        raise ValueError(f"modes {modes} must give one count per axis of grid {grid}")
    ratio = projection / width
    if int(ratio * width) != projection:  # neuraloperator: int(projection_channel_ratio * hidden_channels)
        ratio = math.nextafter(ratio, math.inf)
    boundaries = [[0.0, n / (n - 1)] if n > 1 else [0.0, 1.0] for n in grid]
    model = FNO(
        n_modes=modes, in_channels=1, out_channels=1, hidden_channels=width, n_layers=layers,
        lifting_channel_ratio=0, projection_channel_ratio=ratio,
        positional_embedding=GridEmbeddingND(in_channels=1, dim=len(grid), grid_boundaries=boundaries),
        non_linearity=F.gelu, norm=None, use_channel_mlp=False, fno_skip="linear", domain_padding=None,
        factorization=None, fno_block_precision="full", preactivation=False, separable=False,
    )
    assert model.projection_channels == projection, (model.projection_channels, projection)
    assert len(model.lifting.fcs) == 1, "lifting must be one linear layer"
    blocks = model.fno_blocks
    if single_gelu:
        assert not blocks.use_channel_mlp and blocks.norm is None and blocks.stabilizer is None
        assert blocks.fno_skips is not None and not blocks.preactivation
        blocks.forward_with_postactivation = types.MethodType(_single_gelu_forward, blocks)
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return model.to(device)


def torch_param_count(model) -> int:
    """Real parameters of a torch module, a complex one counting 2."""
    return sum(p.numel() * (2 if p.is_complex() else 1) for p in model.parameters())


def neuralop_step_ms(grid, width, modes, layers, batch, *, rounds: int = 20, warmup: int = 3, device: str = "cuda",
                     projection: int = 128, single_gelu: bool = True, seed: int = 0) -> dict:
    """Median ms of one Adam training step (lr 1e-3: forward, per-sample relative-L2
    loss averaged over the batch, backward, `optimizer.step`, `zero_grad`) of
    `neuralop_fno(grid, width, modes, layers, projection)`, float32, input and target
    `(batch, 1, *grid)` random normal; `warmup` untimed steps, then `rounds` steps each
    timed with `time.perf_counter` between two `torch.cuda.synchronize()` (on cuda).

    Returns `{"median_ms", "min_ms", "params" (real numbers: a complex one counts 2),
    "parop_params" (`parop_param_count` of the same network), "params_agree",
    "peak_bytes" (`torch.cuda.max_memory_allocated()`, None off cuda), "torch",
    "neuralop", "device", "single_gelu"}`; a count mismatch is reported
    (`params_agree=False`), not raised."""
    import neuralop
    import torch

    torch.manual_seed(seed)
    cuda = device.startswith("cuda")
    model = neuralop_fno(grid, width, modes, layers, projection, single_gelu=single_gelu, device=device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn((batch, 1, *grid), generator=gen, device=device, dtype=torch.float32)
    y = torch.randn((batch, 1, *grid), generator=gen, device=device, dtype=torch.float32)

    def step():
        pred = model(x)
        diff = (pred - y).flatten(1).norm(dim=1)
        loss = (diff / y.flatten(1).norm(dim=1)).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    for _ in range(warmup):
        step()
    sync()
    times = []
    for _ in range(rounds):
        sync()
        t0 = time.perf_counter()
        step()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    params = torch_param_count(model)
    parop = parop_param_count(tuple(grid), width, tuple(modes), layers, projection)
    return {
        "median_ms": statistics.median(times),
        "min_ms": min(times),
        "params": params,
        "parop_params": parop,
        "params_agree": params == parop,
        "peak_bytes": torch.cuda.max_memory_allocated() if cuda else None,
        "torch": torch.__version__,
        "neuralop": neuralop.__version__,
        "device": device,
        "single_gelu": single_gelu,
        "tf32": {"matmul": torch.backends.cuda.matmul.allow_tf32, "cudnn": torch.backends.cudnn.allow_tf32},
    }


if __name__ == "__main__":
    import json
    import sys

    dev = sys.argv[1] if len(sys.argv) > 1 else "cuda"
    print(json.dumps(neuralop_step_ms((32, 32), 32, (12, 12), 4, 20, device=dev)))
