"""Mutators for the fuzz suite: text mutations drawn with hypothesis (so a failure shrinks to
a short input), and the tally of how many inputs each fuzzer ran (printed in pytest's
summary)."""
from __future__ import annotations

from collections import Counter

from hypothesis import strategies as st

RAN: Counter = Counter()

IR_TOKENS = ["(", ")", "[", "]", "{", "}", ",", ";", "=", "%0", "%1", "%x", "%data", ".0", ".1",
             "nn.relu", "add", "nn.conv2d", "qnn.quantize", "reshape", "nn.softmax", "clip",
             "meta[relay.Constant][0]", "meta[relay.Constant][99]", "/* ty=Tensor[(1, 2), "
             "float32] */", "/* ty=", "*/", "/*", "//", "fn (%p: Tensor[(2), float32]) { %p }",
             "True", "False", "()", "None", '"s"', '"a\\nb"', "1e39f", "1e999", "-1", "0",
             "2147483648", "9223372036854775808", "-0.0f", "nanf", "inff", "3i8", "300u8",
             "float32", "int8", "uint8", "bool", "Tensor[(1, 2), int8]", "Tensor[(0), float32]",
             "Tensor[(4611686018427387904), float32]", "\n", '#[version = "0.0.5"]',
             "@main", "def", "%1 = ", "padding=[1, 1]", "axis=-9", "newshape=[-1, -1]",
             "pool_size=[0, 0]", "strides=[0, 0]", "groups=0", "out_dtype=\"int4\"", "\\"]

RULE_TOKENS = ["(", ")", "{", "}", ",", "?x", "?y", "?w", "=>", "<=>", "rule r:", "approx",
               "(rtol=0.1)", "(atol=1e999)", "if", "where ?k = ", "assuming positive(?s)",
               "dtype(?x) == int8", "dtype(?x) in {int8, uint8}", "rank(?x) == 4",
               "shape(?x) == shape(?y)", "const(?w)", "{nn.relu, clip}", "{identity}",
               "..?rest", "include \"simplify\"", "include \"nope.rules\"", "ruleset z",
               "nn.relu", "add", "qnn.quantize", "0.0", "1f", "99999999999999999999", "-1i8",
               "axis=?a", "axis=1", "newshape=[-1]", "#", "\n", ".0", "\"s\""]


@st.composite
def mutated(draw, corpus: list[str], tokens: list[str], max_edits: int = 4) -> str:
    """One text of ``corpus`` with up to ``max_edits`` edits: a span deleted, duplicated or
    replaced by a token, a token inserted, two characters swapped."""
    text = draw(st.sampled_from(corpus))
    for _ in range(draw(st.integers(1, max_edits))):
        n = len(text)
        i = draw(st.integers(0, n))
        kind = draw(st.sampled_from(["delete", "insert", "replace", "duplicate", "swap"]))
        j = min(n, i + draw(st.integers(1, 24)))
        if kind == "delete":
            text = text[:i] + text[j:]
        elif kind == "insert":
            text = text[:i] + draw(st.sampled_from(tokens)) + text[i:]
        elif kind == "replace":
            text = text[:i] + draw(st.sampled_from(tokens)) + text[j:]
        elif kind == "duplicate":
            text = text[:j] + text[i:j] + text[j:]
        elif n >= 2 and i < n - 1:
            text = text[:i] + text[i + 1] + text[i] + text[i + 2:]
    return text


@st.composite
def mutated_bytes(draw, corpus: list[bytes], max_edits: int = 4) -> bytes:
    data = bytearray(draw(st.sampled_from(corpus)))
    for _ in range(draw(st.integers(1, max_edits))):
        n = len(data)
        i = draw(st.integers(0, max(n - 1, 0)))
        kind = draw(st.sampled_from(["flip", "truncate", "insert", "zero", "max"]))
        if kind == "flip" and n:
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif kind == "truncate":
            del data[i:]
        elif kind == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "zero" and n:
            data[i:i + 4] = b"\0" * len(data[i:i + 4])
        elif kind == "max" and n:
            data[i:i + 8] = b"\xff" * len(data[i:i + 8])
    return bytes(data)
