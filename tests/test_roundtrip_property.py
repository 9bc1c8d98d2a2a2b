"""Property: generated well-typed programs print, parse back to the same graph, and print the
same text again."""
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eqquant.core.nodes import Call, Constant, Function, Var
from eqquant.ir.parser import parse
from eqquant.ir.printer import print_module
from eqquant.errors import TypeCheckError
from eqquant.ir.typecheck import check_module, infer_expr
from eqquant.core.types import TensorType
from eqquant.ir.builder import Builder
from eqquant.core.nodes import freeze_attrs

FLOAT32 = st.floats(width=32, allow_nan=True, allow_infinity=True)
PARAM_NAME = st.from_regex(r"\A[a-z_][a-z0-9_]{0,5}((::|\.)[a-z_][a-z0-9_]{0,4}|\.[0-9]{1,2}"
                           r"\.[a-z][a-z0-9]{0,3}){0,2}\Z")
SCALAR_DTYPES = ["float32", "float64", "float16", "int8", "int32", "int64", "uint8"]


class Gen:
    def __init__(self, draw):
        self.draw = draw
        self.b = Builder()
        self.values = []
        self.meta = 0
        self.names = set()

    def new_name(self, prefix):
        name = f"{prefix}{len(self.names)}_{self.draw(PARAM_NAME)}"
        self.names.add(name)
        return name

    def param(self, shape, dtype="float32"):
        v = self.b.input(self.new_name("p"), shape, dtype)
        self.values.append(v)
        return v

    def constant(self, shape, dtype="float32"):
        c = Constant(index=self.meta, type=TensorType(tuple(shape), dtype))
        self.meta += 1
        return c

    def scalar(self, dtype):
        d = self.draw
        if dtype.startswith("float"):
            v = d(FLOAT32) if dtype != "float64" else d(st.floats())
            return self.b.scalar(v, dtype) if dtype != "float64" else \
                self.b.scalar(float(v), "float64")
        info = np.iinfo(dtype)
        return self.b.scalar(d(st.integers(int(info.min), int(info.max))), dtype)

    def pick(self, pred=lambda t: True):
        cands = [v for v in self.values if pred(infer_expr(v))]
        return self.draw(st.sampled_from(cands)) if cands else None

    def named(self, node):
        if self.draw(st.booleans()):
            import dataclasses
            return dataclasses.replace(node, name=self.new_name("v"))
        return node

    def step(self):
        d = self.draw
        kind = d(st.sampled_from(["unary", "clip", "binary", "conv", "pool", "reshape", "tuple",
                                  "bn", "cast", "fn", "scalar_op"]))
        is_f32 = lambda t: isinstance(t, TensorType) and t.dtype == "float32"
        x = self.pick(is_f32)
        if x is None:
            return
        t = infer_expr(x)
        b = self.b
        if kind == "unary":
            out = b.call(d(st.sampled_from(["nn.relu", "negative", "abs", "round", "sqrt",
                                             "annotation.stop_fusion"])), x)
        elif kind == "clip":
            lo, hi = sorted([d(st.floats(-1e6, 1e6)), d(st.floats(-1e6, 1e6))])
            out = b.call("clip", x, a_min=lo, a_max=hi)
        elif kind == "binary":
            other = self.pick(lambda u: u == t) if d(st.booleans()) else self.constant(
                d(st.sampled_from([t.shape, t.shape[-1:], ()])))
            out = b.call(d(st.sampled_from(["add", "subtract", "multiply", "divide"])), x, other)
        elif kind == "scalar_op":
            out = b.call("multiply", x, self.scalar("float32"))
        elif kind == "conv" and t.rank == 4:
            c = t.shape[1]
            groups = d(st.sampled_from([1, c]))
            o = d(st.integers(1, 3)) * groups
            k = d(st.integers(1, 3))
            w = self.constant((o, c // groups, k, k)) if d(st.booleans()) else \
                self.param((o, c // groups, k, k))
            out = b.call("nn.conv2d", x, w, groups=groups, padding=[d(st.integers(0, 2))] * 2,
                         strides=[d(st.integers(1, 2))] * 2,
                         channels=o if d(st.booleans()) else None)
        elif kind == "pool" and t.rank == 4:
            out = b.call(d(st.sampled_from(["nn.max_pool2d", "nn.avg_pool2d"])), x,
                         pool_size=[2, 2], strides=[d(st.integers(1, 2))] * 2,
                         padding=[d(st.integers(0, 1))] * 4, ceil_mode=d(st.booleans()))
        elif kind == "reshape":
            out = b.call("reshape", x, newshape=[-1]) if d(st.booleans()) else \
                b.call("expand_dims", x, axis=0)
        elif kind == "tuple":
            y = self.pick(is_f32)
            out = b.get(b.tuple(x, y), d(st.integers(0, 1)))
        elif kind == "bn" and t.rank >= 2:
            c = t.shape[1]
            stats = [self.param((c,)) for _ in range(4)]
            out = b.get(b.call("nn.batch_norm", x, *stats, epsilon=d(st.floats(1e-8, 1e-2))), 0)
        elif kind == "cast":
            dt = d(st.sampled_from(SCALAR_DTYPES))
            out = b.call("cast", b.call("add", b.call("cast", x, dtype=dt), self.scalar(dt)),
                         dtype="float32")
        elif kind == "fn":
            p = Var(name=self.new_name("FunctionVar_"), type=t)
            fn = Function(params=(p,), body=b.call("nn.relu", p), ret_type=t if d(st.booleans())
                          else None, attrs=freeze_attrs({"Composite": "ccompiler.relu",
                                                         "PartitionedFromPattern": "nn.relu_"}))
            out = Call(op=fn, args=(x,))
        else:
            return
        self.values.append(self.named(out))


@st.composite
def programs(draw):
    g = Gen(draw)
    rank = draw(st.sampled_from([1, 2, 4]))
    shape = {1: (draw(st.integers(1, 4)),), 2: (2, draw(st.integers(1, 4))),
             4: (1, draw(st.integers(1, 3)), draw(st.integers(3, 6)), draw(st.integers(3, 6)))}
    g.param(shape[rank])
    for _ in range(draw(st.integers(1, 12))):
        try:
            g.step()
        except TypeCheckError:  # e.g. a kernel larger than the image: not a program
            pass
    outs = g.values[-draw(st.integers(1, min(3, len(g.values)))):]
    body = outs[0] if len(outs) == 1 else g.b.tuple(*outs)
    mod, _ = g.b.finish(body)
    return mod


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_generated_programs_round_trip(mod):
    types = check_module(mod)
    text = print_module(mod)
    again = parse(text)
    assert again == mod, text
    assert print_module(again) == text
    assert check_module(again)[id(again.main.body)] == types[id(mod.main.body)]
