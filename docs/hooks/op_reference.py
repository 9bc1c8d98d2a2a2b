"""MkDocs hook: the op reference page (docs/ops.md) written from the op registry as the
manual builds, so that it lists every registered op as this eqquant defines it: inputs,
attributes with their defaults, type relation, properties, kernel binding, ONNX forms."""
from __future__ import annotations

PLACEHOLDER = "<!-- the registry's ops -->"


def _default(attr) -> str:
    from eqquant.ops.attrs import REQUIRED
    return "required" if attr.default is REQUIRED else f"`{attr.default!r}`"


def _first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0] if (text or "").strip() else ""


def op_reference() -> str:
    from eqquant.ops.registry import all_ops
    out = []
    for name, op in sorted(all_ops().items()):
        out.append(f"## `{name}`\n")
        if op.doc:
            out.append(f"{op.doc}\n")
        rows = [f"- inputs: {', '.join(f'`{i}`' for i in op.inputs) or 'none'}"]
        if op.attrs:
            rows.append("- attributes: " + ", ".join(
                f"`{a.name}` ({type(a.kind).__name__.removesuffix('Kind').lower()}, "
                f"{_default(a)})" for a in op.attrs))
        rel = getattr(op.type_rel, "__qualname__", str(op.type_rel))
        doc = _first_line(getattr(op.type_rel, "__doc__", ""))
        rows.append(f"- type relation: `{rel}`" + (f": {doc}" if doc else ""))
        if op.props:
            rows.append(f"- properties: {', '.join(sorted(op.props))}")
        if op.kernel:
            rows.append(f"- kernel binding: `{op.kernel}`")
        if op.onnx:
            rows.append("- ONNX: " + ", ".join(
                f"`{f.op_type}`" + ("" if getattr(f, "reads", True) else " (written only)")
                for f in op.onnx))
        if op.bounds is not None:
            rows.append(f"- every output within {list(op.bounds)}")
        if op.subtracts:
            rows.append(f"- subtracts: {', '.join(f'`{s}`' for s in op.subtracts)}")
        out.append("\n".join(rows) + "\n")
    return "\n".join(out)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if PLACEHOLDER in markdown:
        return markdown.replace(PLACEHOLDER, op_reference())
    return markdown
