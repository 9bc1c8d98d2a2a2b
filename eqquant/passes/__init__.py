"""IR -> IR passes: inlining of function calls, constant folding."""
