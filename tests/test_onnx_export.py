"""ONNX export of fp32 programs: ONNX Runtime computes what the reference interpreter does."""
import numpy as np
import pytest

from eqquant.errors import EqquantError
from eqquant.ir.interp import run
from eqquant.ir.params import bind_params
from eqquant.ir.parser import parse
from eqquant.optimizer import optimize
from eqquant.zoo import build

onnx = pytest.importorskip("onnx", reason="the onnx extra is not installed")
ort = pytest.importorskip("onnxruntime", reason="the onnx extra is not installed")
from eqquant.interop.onnx_export import to_onnx  # noqa: E402


def _ort(model, inputs):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, inputs)[0]


@pytest.mark.parametrize("name", ["resnet18_stem", "resnet18", "mobilenet_v2"])
def test_export_original_and_fused(name):
    m = build(name, image_size=64)
    bound = bind_params(m.module, m.params)
    ref = run(bound, m.inputs)
    for mod in (bound, optimize(m.module, m.params, ["simplify", "bn_fold", "fusion"],
                                "simplify; bn_fold; simplify; fusion").module):
        out = _ort(to_onnx(mod), m.inputs)
        assert np.max(np.abs(out - ref)) <= 1e-4 * np.max(np.abs(ref))


def test_unsupported_op_is_located():
    mod = parse("def @main(%x: Tensor[(2, 3), float32]) {\n  rsqrt(%x)\n}\n", "t.ir")
    with pytest.raises(EqquantError, match="rsqrt") as info:
        to_onnx(mod)
    assert info.value.loc is not None and info.value.loc.line == 2
