"""Kernel dispatch never computes another op's function: a binding takes only the ops it
names, and an op it does not know runs its own reference semantics."""
from __future__ import annotations

import numpy as np
import pytest

from eqquant.ir.parser import parse
from eqquant.ops.registry import ELEMWISE, UNARY, OpDef, all_ops, get_op, has_op, register
from eqquant.ops.typerel import same_as_input
from eqquant.runtime.execution.executor import Executor


def _new_unary(name: str, kernel: str) -> OpDef:
    """A unary op registered from this file alone, bound to an existing binding class."""
    if not has_op(name):
        register(OpDef(name, inputs=("data",), props=frozenset({ELEMWISE, UNARY}),
                       kernel=kernel, type_rel=same_as_input,
                       semantics=lambda x: (np.float32(3) * x - 1).astype(x.dtype),
                       doc="3x - 1 (a test op)"))
    return get_op(name)


@pytest.mark.parametrize("binding", ["Activation", "Binary", "View"])
def test_a_new_op_bound_to_a_generic_binding_runs_its_own_semantics(binding):
    name = f"test.affine_{binding.lower()}"
    _new_unary(name, binding)
    mod = parse(f"def @main(%x: Tensor[(2, 5), float32]) {{ {name}(%x) }}")
    x = np.random.default_rng(0).normal(size=(2, 5)).astype(np.float32)
    ex = Executor(mod)
    np.testing.assert_allclose(ex.run({"x": x}), 3 * x - 1, rtol=1e-6)
    kinds = [s.kind for s in ex.steps if s.label.startswith(name)]
    assert kinds == ["reference"], [(s.label, s.kind) for s in ex.steps]


def test_every_registered_op_with_a_kernel_gives_what_its_binding_reads():
    """Each activation or binary op names its kernel code in its own registry entry, and no
    two ops of one binding share a code (one would compute the other's function)."""
    codes: dict[tuple[str, int], str] = {}
    for op in all_ops().values():
        if op.name.startswith("test."):
            continue          # this file's own ops, bound on purpose without a code
        if op.kernel in ("Activation",
                         "Binary"):
            code = op.kernel_params.get("code")
            assert isinstance(code, int), op.name
            assert codes.setdefault((op.kernel, code), op.name) == op.name, op.name


def test_every_kernel_an_op_names_is_a_registered_binding():
    """An op's entry names its binding by name (``kernel="Conv2D"``); each name is a class
    registered in ``runtime/lowering/``, and a name that is not is an error saying so."""
    from eqquant.errors import EqquantError
    from eqquant.ops.registry import all_ops
    from eqquant.runtime.lowering import binding_class
    from eqquant.runtime.lowering.fp32 import Binding
    named = {op.name: op.kernel for op in all_ops().values() if op.kernel}
    assert len(named) > 40
    for name, kernel in named.items():
        assert issubclass(binding_class(kernel), Binding), name
    with pytest.raises(EqquantError, match="no kernel binding 'Conv3D'"):
        binding_class("Conv3D")
