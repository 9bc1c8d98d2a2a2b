"""Small random programs for the soundness property test: text IR plus weights, built from a
few choices (layer kinds, activations, pooling, a residual add), so that hypothesis can
shrink a failing program to a short one."""
from __future__ import annotations

import numpy as np


def conv_program(rng: np.random.Generator, channels: int, layers: list[str], residual: bool,
                 pool: bool) -> tuple[str, dict[str, np.ndarray]]:
    """conv2d layers on a (1, channels, 6, 6) input, each with a bias and an activation
    ("none", "relu", "clip"), an optional max pool after the first, and an optional residual
    add of the first layer's output to the last's."""
    params: dict[str, np.ndarray] = {}
    sig = [f"%x: Tensor[(1, {channels}, 6, 6), float32]"]
    lines, cur, first = [], "%x", None
    n = 0

    def let(expr: str) -> str:
        nonlocal n
        lines.append(f"  %{n} = {expr};")
        n += 1
        return f"%{n - 1}"

    for i, act in enumerate(layers):
        w, b = f"%w{i}", f"%b{i}"
        sig += [f"{w}: Tensor[({channels}, {channels}, 3, 3), float32]",
                f"{b}: Tensor[({channels}, 1, 1), float32]"]
        params[w[1:]] = rng.normal(0, 0.4, (channels, channels, 3, 3)).astype(np.float32)
        params[b[1:]] = rng.normal(0, 0.3, (channels, 1, 1)).astype(np.float32)
        cur = let(f"add(nn.conv2d({cur}, {w}, padding=[1, 1, 1, 1]), {b})")
        if act == "relu":
            cur = let(f"nn.relu({cur})")
        elif act == "clip":
            cur = let(f"clip({cur}, a_min=0f, a_max=2f)")
        if i == 0:
            if pool:
                cur = let(f"nn.max_pool2d({cur}, pool_size=[3, 3], padding=[1, 1, 1, 1])")
            first = cur
    if residual and len(layers) > 1:
        cur = let(f"add({cur}, {first})")
    body = "\n".join(lines[:-1] + [lines[-1].split(" = ", 1)[1].rstrip(";")])
    text = f"def @main({', '.join(sig)}) {{\n{body}\n}}\n"
    return text, params


def dense_program(rng: np.random.Generator, units: int, layers: list[str]
                  ) -> tuple[str, dict[str, np.ndarray]]:
    """dense layers on a (1, units) input, each with an optional bias and an activation."""
    params: dict[str, np.ndarray] = {}
    sig = [f"%x: Tensor[(1, {units}), float32]"]
    cur = "%x"
    for i, act in enumerate(layers):
        sig.append(f"%w{i}: Tensor[({units}, {units}), float32]")
        params[f"w{i}"] = rng.normal(0, 0.5, (units, units)).astype(np.float32)
        cur = f"nn.dense({cur}, %w{i})"
        if i % 2:
            sig.append(f"%b{i}: Tensor[({units}), float32]")
            params[f"b{i}"] = rng.normal(0, 0.3, (units,)).astype(np.float32)
            cur = f"add({cur}, %b{i})"
        if act == "relu":
            cur = f"nn.relu({cur})"
        elif act == "clip":
            cur = f"clip({cur}, a_min=0f, a_max=2f)"
    return f"def @main({', '.join(sig)}) {{\n  {cur}\n}}\n", params
