"""Every IR listing of seed 004 parses, type-checks against its own annotations, round-trips,
and runs; the listings that TVM derived from one another compute the same function."""
import numpy as np
import pytest

from eqquant.ir.interp import run
from eqquant.core.nodes import Call, Constant, iter_functions, post_order
from eqquant.ir.parser import parse
from eqquant.ir.printer import print_module
from eqquant.ir.typecheck import check_module

from conftest import seed_file
from seed_listings import listings

LISTINGS = listings(seed_file("004"))


def test_ten_listings_found():
    assert len(LISTINGS) == 10
    assert all(text.startswith("def @main") for _, text in LISTINGS)


@pytest.mark.parametrize("line,text", LISTINGS, ids=[f"line{l}" for l, _ in LISTINGS])
def test_parse_check_roundtrip(line, text):
    mod = parse(text, f"seed004:{line}")
    types = check_module(mod)  # raises on any /* ty= */ that disagrees with inference
    assert types[id(mod.main.body)].shape == (1, 64, 56, 56)
    if "ty=" in text:
        assert mod.annotations, "annotations were read and checked"
    printed = print_module(mod)
    again = parse(printed)
    assert again == mod
    assert print_module(again) == printed
    shown = print_module(mod, show_types=True)  # TVM's show(): every value annotated
    reread = parse(shown)
    check_module(reread)
    assert len(reread.annotations) >= len(post_order(mod.main.body)) - len(mod.main.params)
    assert print_module(reread, show_types=True) == shown


def _ops(mod):
    names = set()
    for fn in [mod.main, *iter_functions(mod.main.body)]:
        names |= {n.op_name for n in post_order(fn.body) if isinstance(n, Call) and n.op_name}
    return names


def test_listing_ops_cover_the_seed():
    used = set().union(*(_ops(parse(t)) for _, t in LISTINGS))
    assert {"nn.conv2d", "nn.batch_norm", "relay.op.annotation.simulated_quantize",
            "fixed_point_multiply", "annotation.cast_hint", "annotation.stop_fusion",
            "nn.max_pool2d", "clip", "cast", "round", "multiply", "add",
            "nn.relu"} <= used


def _constants(mod, rng):
    """Random data for the listing's meta constants, keyed by index, drawn once per index."""
    out = {}
    for fn in [mod.main, *iter_functions(mod.main.body)]:
        for n in post_order(fn.body):
            if isinstance(n, Constant) and n.index not in out:
                out[n.index] = n.type
    return out


def _float_constants(types, seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    for i, t in types.items():
        if len(t.shape) == 4:  # conv weights, He-scaled
            fan_in = np.prod(t.shape[1:])
            out[i] = rng.normal(0, np.sqrt(2 / fan_in), t.shape).astype("float32")
        else:  # folded biases
            out[i] = rng.normal(0, 0.1, t.shape).astype("float32")
    return out


def _run_listing(index, constants, inputs):
    line, text = LISTINGS[index]
    mod = parse(text, constants=constants)
    return run(mod, inputs)


def test_tvm_stages_agree():
    """prerequisite_optimize, MergeComposite, PartitionGraph, QPartition and DefuseOps
    (listings 2-6) are the same function of the same constants."""
    mod = parse(LISTINGS[1][1])
    consts = _float_constants(_constants(mod, None))
    x = np.random.default_rng(1).normal(size=(1, 3, 224, 224)).astype("float32")
    ref = _run_listing(1, consts, {"data": x})
    for i in range(2, 6):
        out = _run_listing(i, consts, {"data": x})
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5, err_msg=f"listing {i + 1}")


def test_calibrated_and_realized_agree():
    """The calibrated program (simulated_quantize, listing 8) and TVM's realized integer
    program (listing 9) use the same constants; the integer program reproduces the simulated
    one to within a few quantization steps of the output scale (0.0319)."""
    mod = parse(LISTINGS[7][1])
    consts = _float_constants(_constants(mod, None), seed=3)
    x = np.random.default_rng(2).normal(size=(1, 3, 224, 224)).astype("float32")
    sim = _run_listing(7, consts, {"data": x})
    real = _run_listing(8, consts, {"data": x})
    assert real.dtype == np.float32 and real.shape == sim.shape
    step = 0.0319001
    err = np.abs(real - sim)
    assert np.median(err) <= step + 1e-6
    assert np.mean(err <= 4 * step) > 0.99


def test_annotated_listing_runs_with_scalar_params():
    line, text = LISTINGS[6]
    mod = parse(text)
    consts = _float_constants(_constants(mod, None))
    mod = parse(text, constants=consts)
    scalars = {p.name: np.float32(0.05 if p.name.startswith("dom_scale") else
                                  (-127 if p.name.startswith("clip_min") else 127))
               for p in mod.main.params if p.name != "data"}
    assert len(scalars) == 36
    x = np.random.default_rng(0).normal(size=(1, 3, 224, 224)).astype("float32")
    out = run(mod, {"data": x, **scalars})
    # every simulated_quantize output is a multiple of its scale: so is the last one
    q = out / 0.05
    np.testing.assert_allclose(q, np.round(q), atol=1e-3)


def test_the_copied_seed_documents_are_the_shared_ones():
    """tests/data/seeds/ holds copies so that the tests stand alone; where the shared seeds
    are beside the repository, the copies must equal them."""
    from conftest import SEEDS, SHARED_SEEDS
    ours = sorted(p.name for p in SEEDS.glob("*.txt"))
    assert ours, "the seed copies are missing"
    if not SHARED_SEEDS.is_dir():
        pytest.skip("../shared/seeds/ is not beside this checkout: nothing to compare with")
    for name in ours:
        assert (SEEDS / name).read_bytes() == (SHARED_SEEDS / name).read_bytes(), name
