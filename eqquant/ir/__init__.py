"""The text IR: types, nodes, parser, printer, type checker, params and the reference
interpreter."""
