"""Shared by the benchmarks: ONNX Runtime sessions and static quantization configured as the
peers are measured (2 intra-op threads, no spinning), and alternating timing."""
from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np


def peak_rss_mb() -> float:
    """This process's peak resident memory (VmHWM: ``ru_maxrss`` would carry a forking
    parent's peak across exec, which Linux keeps)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def torchvision_models():
    """torchvision's model zoo without its C extension (which does not load with this
    PyTorch): its fake-kernel registrations are skipped while it imports."""
    import torch
    real = torch.library.register_fake
    torch.library.register_fake = lambda *a, **k: (lambda fn: fn)
    try:
        import torchvision.models as models
    finally:
        torch.library.register_fake = real
    return models


def torch_int8(name: str, samples: Sequence[np.ndarray]):
    """PyTorch's own int8 flow for the torchvision model ``name`` (random weights): FX graph
    mode with the x86 default qconfig (per-channel int8 weights, uint8 activations, the
    fbgemm/onednn kernels), calibrated on ``samples``."""
    import torch
    from torch.ao.quantization import get_default_qconfig_mapping
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx
    torch.manual_seed(0)
    net = getattr(torchvision_models(), name)(weights=None).eval()
    example = (torch.from_numpy(samples[0]),)
    prepared = prepare_fx(net, get_default_qconfig_mapping("x86"), example)
    with torch.inference_mode():
        for s in samples:
            prepared(torch.from_numpy(s))
    return convert_fx(prepared)


def ort_session(model: bytes | str, *, threads: int = 2, spinning: bool = False,
                exact: bool = False):
    """An ONNX Runtime CPU session on ``threads`` threads (the model as bytes or a path).
    ``spinning``: its workers spin while a run waits for work (ONNX Runtime's default).
    ``exact``: ``session.x64quantprecision`` set: on x86-64 CPUs without VNNI, its u8s8
    kernels add pairs of products in int16 with saturation (``vpmaddubsw``), and this option
    makes them exact."""
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    if not spinning:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if exact:
        so.add_session_config_entry("session.x64quantprecision", "1")
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def ort_quantize_dynamic(fp32_bytes: bytes, per_channel: bool = True,
                         pre_process: bool = True) -> bytes:
    """ONNX Runtime's quantize_dynamic: activations' parameters computed at run time (uint8,
    DynamicQuantizeLinear), int8 weights; no calibration data. With ``pre_process`` (the
    default), after ONNX Runtime's recommended quant_pre_process: PyTorch exports a weight
    through a Transpose, and quantize_dynamic takes only a MatMul whose weight is an
    initializer (without it, 4 of a 4-layer encoder's 24 products)."""
    import logging

    import onnxruntime as ort
    logging.getLogger().setLevel(logging.ERROR)
    from onnxruntime.quantization import QuantType, quantize_dynamic
    ort.set_default_logger_severity(3)
    with tempfile.TemporaryDirectory() as d:
        src, dst = Path(d) / "fp32.onnx", Path(d) / "int8.onnx"
        src.write_bytes(fp32_bytes)
        if pre_process:
            from onnxruntime.quantization.shape_inference import quant_pre_process
            pre = Path(d) / "pre.onnx"
            # (its symbolic shape inference fails on PyTorch's attention reshapes; the
            # graph optimisation that folds the weights' transposes is what is wanted)
            quant_pre_process(str(src), str(pre), skip_symbolic_shape=True)
            src = pre
        quantize_dynamic(str(src), str(dst), per_channel=per_channel,
                         weight_type=QuantType.QInt8)
        return dst.read_bytes()


def ort_integer_products(model_bytes: bytes) -> tuple[int, int]:
    """(integer matrix products, all matrix products) of an ONNX Runtime int8 model:
    MatMulInteger, ConvInteger and the QLinear/DynamicQuantize forms, and (QDQ) a MatMul,
    Gemm or Conv whose two operands are DequantizeLinear outputs (ONNX Runtime runs those
    in integers), against every MatMul, Gemm and Conv."""
    import onnx
    nodes = onnx.load_from_string(model_bytes).graph.node
    dequantized = {o for n in nodes if n.op_type == "DequantizeLinear" for o in n.output}
    integer = total = 0
    for n in nodes:
        fused = n.op_type in ("MatMulInteger", "ConvInteger", "QLinearMatMul", "QLinearConv",
                              "DynamicQuantizeMatMul")
        qdq = n.op_type in ("MatMul", "Gemm", "Conv") and \
            all(i in dequantized for i in n.input[:2])
        integer += fused or qdq
        total += fused or n.op_type in ("MatMul", "Gemm", "Conv")
    return integer, total


def ort_quantize_static(fp32_bytes: bytes, samples: Sequence[Mapping[str, np.ndarray]],
                        per_channel: bool = True, pre_process: bool = False,
                        method: str = "MinMax") -> bytes:
    """ONNX Runtime's quantize_static: QDQ, uint8 activations, int8 weights, calibrated by
    ``method`` (a CalibrationMethod's name: MinMax, Entropy, Percentile); with
    ``pre_process``, after ONNX Runtime's recommended quant_pre_process (which folds batch
    norms into convolutions)."""
    import logging

    import onnxruntime as ort
    logging.getLogger().setLevel(logging.ERROR)   # the quantizer's notes go to the root logger
    from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod,
                                          QuantFormat, QuantType, quantize_static)
    ort.set_default_logger_severity(3)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(samples)

        def get_next(self):
            return next(self.it, None)

    with tempfile.TemporaryDirectory() as d:
        src, dst = Path(d) / "fp32.onnx", Path(d) / "int8.onnx"
        src.write_bytes(fp32_bytes)
        if pre_process:
            from onnxruntime.quantization.shape_inference import quant_pre_process
            pre = Path(d) / "pre.onnx"
            try:
                quant_pre_process(str(src), str(pre))
            except AssertionError:  # (its symbolic shape inference fails on ViT's reshapes)
                quant_pre_process(str(src), str(pre), skip_symbolic_shape=True)
            src = pre
        quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ,
                        per_channel=per_channel, activation_type=QuantType.QUInt8,
                        weight_type=QuantType.QInt8,
                        calibrate_method=getattr(CalibrationMethod, method))
        return dst.read_bytes()


def timed(run: Callable[[], object], n: int) -> list[float]:
    """Seconds of each of ``n`` calls of ``run`` (a bench worker's timed runs)."""
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return times


def time_alternating(runners: Mapping[str, Callable[[], object]], runs: int) -> dict[str, float]:
    """Median milliseconds of each runner, the runners taking turns (after one warm-up each)
    so that a change in the machine's load hits them all alike."""
    for f in runners.values():
        f()
    times: dict[str, list[float]] = {k: [] for k in runners}
    for _ in range(runs):
        for k, f in runners.items():
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) * 1e3 for k, v in times.items()}


def latencies_alternating(runners: Mapping[str, Callable[[], object]], runs: int = 20,
                          rounds: int = 5, pause: float = 0.5) -> dict[str, float]:
    """Seconds per run of each runner on a quiet machine: in each round (``pause`` seconds
    apart) every runner in turn gives the median of ``runs`` warm runs; each keeps the least of
    its rounds' medians. Programs compared with each other are timed this way, never one after
    the other (a neighbour's load moved one program's median by 5% between minutes)."""
    best = {k: float("inf") for k in runners}
    for f in runners.values():
        f()
    for r in range(rounds):
        if r:
            time.sleep(pause)
        for k, f in runners.items():
            f()
            times = []
            for _ in range(runs):
                t = time.perf_counter()
                f()
                times.append(time.perf_counter() - t)
            best[k] = min(best[k], float(np.median(times)))
    return best


def executor_latency(ex, x, runs: int = 20, rounds: int = 1, pause: float = 1.0) -> float:
    """Seconds per run of an eqquant Executor on ``x``: the median of ``runs`` warm runs; with
    several ``rounds`` (``pause`` seconds apart) the least of their medians, the latency on
    a quiet machine (this one is shared: a neighbour's load doubled one round's median at
    times)."""
    for _ in range(3):
        ex.run(x)
    medians = []
    for r in range(rounds):
        if r:
            time.sleep(pause)
            ex.run(x)
        times = []
        for _ in range(runs):
            t = time.perf_counter()
            ex.run(x)
            times.append(time.perf_counter() - t)
        medians.append(float(np.median(times)))
    return min(medians)
