"""Every float op that has a kernel, run by the executor and by the reference interpreter on
inputs holding NaN, both infinities, -0.0, denormals and the largest floats: the same NaNs
in the same places and the same bits elsewhere (the sign of a zero included), but for the
ops whose kernels compute an exponential their own way (within a few ulps). Ops are taken
from the registry, so an op added with a kernel is checked here without a line more; those
whose inputs are not one shape of tensor get their call below."""
import numpy as np
import pytest

from eqquant.ir.builder import Builder
from eqquant.ir.interp import run
from eqquant.ir.params import bind_params
from eqquant.ops import registry
from eqquant.runtime.execution.executor import Executor

# numpy warns of the NaNs and overflows the reference computes on these inputs: expected here
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

SHAPE = (1, 4, 12, 12)
# kernels whose exp is Numba's/LLVM's, not numpy's: a few ulps apart on finite values
ULPS = {"sigmoid": 4, "nn.softmax": 8, "nn.log_softmax": 8,
        "nn.silu": 5,       # (x times the sigmoid's: its ulps and the product's rounding)
        "nn.gelu": 1,       # (erfc by polynomials and an exponential of its own)
        # rounded once from float64: numpy's float32 exp and tanh are a few ulps off
        "exp": 4, "tanh": 4}
# sums of products in another order than numpy's matmul (the GEMMs), a layer norm's sums
# in order (numpy's are pairwise): finite values close, NaNs and infinities where the
# reference has them
SUMS = {"nn.conv2d", "fused.conv2d", "fused.conv2d_add", "nn.dense", "fused.dense",
        "nn.layer_norm", "nn.batch_matmul"}
CONV = dict(padding=[1, 1, 1, 1])
# calls of the ops whose inputs or attributes the generic call (every input SHAPE, default
# attributes) does not give
CALLS = {
    "broadcast_to": lambda b, x: b.call("broadcast_to", x, shape=[3, *SHAPE[1:]]),
    "cast": lambda b, x: b.call("cast", x, dtype="float32"),
    "annotation.cast_hint": lambda b, x: b.call("annotation.cast_hint", x, dtype="float32"),
    "concatenate": lambda b, x: b.call("concatenate", b.tuple(x, x), axis=1),
    "nn.conv2d": lambda b, x: b.call("nn.conv2d", x, b.param("w", _weights((6, 4, 3, 3))),
                                     **CONV),
    "fused.conv2d": lambda b, x: b.call(
        "fused.conv2d", x, b.param("w", _weights((6, 4, 3, 3))),
        b.param("b", _weights((6, 1, 1))), activation="relu", **CONV),
    "fused.conv2d_add": lambda b, x: b.call(
        "fused.conv2d_add", x, b.param("w", _weights((6, 4, 3, 3))),
        b.param("b", _weights((6, 1, 1))), b.param("r", _specials(3)[:, :1].repeat(6, axis=1)),
        **CONV),
    "fused.dense": lambda b, x: b.call(
        "fused.dense", _rows(b, x), b.param("w", _weights((5, 36))),
        b.param("b", _weights((5,))), activation="relu"),
    "layout_transform": lambda b, x: b.call("layout_transform", x, src_layout="NCHW",
                                            dst_layout="NHWC"),
    "nn.dense": lambda b, x: b.call("nn.dense", _rows(b, x), b.param("w", _weights((5, 36)))),
    "nn.layer_norm": lambda b, x: b.call("nn.layer_norm", x, b.param("g", _weights((12,))),
                                         b.param("b", _weights((12,))), axis=-1),
    "nn.pad": lambda b, x: b.call("nn.pad", x, b.param("v", np.array(-0.0, np.float32)),
                                  pad_width=[[0, 0], [0, 0], [1, 1], [2, 0]]),
    "reshape": lambda b, x: b.call("reshape", x, newshape=[4, 144]),
    "strided_slice": lambda b, x: b.call("strided_slice", x, begin=[0, 3, 1], end=[1, 0, 5],
                                         strides=[1, -1, 2]),
    "take_at": lambda b, x: b.call("take_at", x, b.param("i", np.array([2, -1, 0, 3])),
                                   axis=1),
    "where": lambda b, x: b.call("where", b.param("c", np.arange(12) % 3 == 0), x,
                                 b.call("negative", x)),
}


def _rows(b, x):
    """the input as 16 rows of 36 (a dense layer's batch: rows without a NaN stay finite)"""
    return b.call("reshape", x, newshape=[16, 36])


def _weights(shape):
    """normal weights with -0.0 and one infinity among them (a NaN weight would make every
    output of its channel NaN)"""
    w = np.random.default_rng(2).normal(size=shape).astype(np.float32)
    w.reshape(-1)[:2] = [-0.0, np.inf][:w.size]
    return w


def _specials(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=SHAPE).astype(np.float32)
    flat = v.reshape(-1)
    at = np.random.default_rng(seed + 1).choice(flat.size, 14, replace=False)
    flat[at] = [np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-45, -1e-45, 3e38, -3e38, np.inf,
                np.nan, -0.0, -np.inf, 1e-40]
    return v


def _float_kernel_ops() -> list[str]:
    names = []
    for name, op in sorted(registry.all_ops().items()):
        if op.kernel is None or name.startswith(("qnn.", "fused.q")) or "quantize" in name:
            continue
        names.append(name)
    return names


def _program(name):
    """(the program of one call of ``name``, its inputs' names)"""
    b = Builder()
    x = b.input("x0", SHAPE)
    if name in CALLS:
        y, names = CALLS[name](b, x), ["x0"]
    else:
        ins = [x] + [b.input(f"x{i}", SHAPE) for i in range(1, len(registry.get_op(name).inputs))]
        y, names = b.call(name, *ins), [f"x{i}" for i in range(len(ins))]
    mod, params = b.finish(y)
    return (bind_params(mod, params) if params else mod), names


def test_the_sweep_covers_the_float_kernels():
    """The registry gives the sweep its ops: these must be among them (a registry that gave
    none would pass every case below vacuously)."""
    names = _float_kernel_ops()
    for must in ("nn.relu", "clip", "add", "divide", "nn.max_pool2d", "nn.avg_pool2d",
                 "fused.conv2d", "nn.dense", "nn.softmax", "sigmoid"):
        assert must in names
    assert len(names) >= 25


@pytest.mark.parametrize("name", _float_kernel_ops())
def test_kernels_answer_as_the_reference_on_non_finite_inputs(name):
    mod, inputs = _program(name)
    ex = Executor(mod)
    assert any(name in s.label for s in ex.steps), [s.label for s in ex.steps]
    xs = {n: _specials(7 + i) for i, n in enumerate(inputs)}
    got, want = np.asarray(ex.run(xs)), np.asarray(run(mod, xs))
    assert got.shape == want.shape and got.dtype == want.dtype
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    if name in SUMS:
        assert (~nan).any()              # the windows away from the NaNs are finite
        finite = np.isfinite(want)
        np.testing.assert_array_equal(got[~finite & ~nan], want[~finite & ~nan])
        np.testing.assert_allclose(got[finite], want[finite], rtol=1e-5, atol=1e-4)
        return
    if name in ULPS:
        # infinities where the reference has them (a log-softmax's -inf), finite values
        # within a few ulps
        inf = np.isinf(want)
        np.testing.assert_array_equal(got[inf], want[inf])
        near = ~nan & ~inf
        spacing = np.abs(np.spacing(np.where(near, want, 1).astype(np.float32)))
        assert (np.abs(np.where(near, got, 0) - np.where(near, want, 0)) <=
                ULPS[name] * spacing).all()
        return
    np.testing.assert_array_equal(np.where(nan, 0, got).view(np.int32),
                                  np.where(nan, 0, want).view(np.int32))
