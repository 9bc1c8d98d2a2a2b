"""A program whose sizes are known only at run time (``?n``), on the CPU executor.

    ex = executor_for(module)          # an Executor, or a SizedExecutor where sizes are open
    ex.run({"data": batch_of_8})       # the program at ?N = 8: made once, then reused

The executor's kernels, buffers and plan are made for one shape: a SizedExecutor keeps one
:class:`Executor` per set of sizes it meets (the ``keep`` most recent), each made from the
program with those sizes bound (``passes.sizes.bind_sizes``) the first time they come.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Mapping

from ...core.nodes import Module
from ...core.types import size_label
from ...errors import EvalError
from ...passes.sizes import bind_sizes, input_sizes, is_symbolic, open_sizes


class SizedExecutor:
    def __init__(self, module: Module, target=None, keep: int = 4):
        from ..target import current
        self.module = module
        self.target = target or current()
        self.keep = keep
        self.sizes = open_sizes(module)
        self._made: OrderedDict[tuple, Any] = OrderedDict()

    def at(self, sizes: Mapping[str, int]):
        """The executor of the program at ``sizes`` (name -> size)."""
        from .executor import Executor
        key = tuple(int(sizes[n]) for n in self.sizes)
        ex = self._made.get(key)
        if ex is None:
            # (its kernels were planned at the sizes it was priced at: a site one cannot run
            # at these gets the target's choice here, the decision saying so)
            ex = Executor(bind_sizes(self.module, sizes), self.target, refit=True)
            self._made[key] = ex
            while len(self._made) > self.keep:
                self._made.popitem(last=False)
        self._made.move_to_end(key)
        return ex

    def for_inputs(self, inputs: Mapping[str, Any]):
        return self.at(input_sizes(self.module.main, inputs))

    def run(self, inputs: Mapping[str, Any], profile: bool = False, observe=None) -> Any:
        return self.for_inputs(inputs).run(inputs, profile=profile, observe=observe)

    @property
    def inputs(self) -> dict:
        """Input name -> (None, its type, sizes open): as ``Executor.inputs`` gives them."""
        return {p.name: (None, p.type) for p in self.module.main.params}

    @property
    def bounds(self) -> dict:
        """What a kernel needs of an integer input's values (``Executor.bounds``): the same
        at every size."""
        return self.at(dict.fromkeys(self.sizes, 1)).bounds

    @property
    def compiled(self):
        return self._last().compiled if self._made else None

    def _last(self):
        if not self._made:
            raise EvalError("the program has not run yet: its kernels are planned per size")
        return next(reversed(self._made.values()))

    def kernel_plan(self, *args):
        """The kernel plan of the executor of the sizes last run (``Executor.kernel_plan``)."""
        return self._last().kernel_plan(*args)

    def profile_table(self) -> str:
        return self._last().profile_table()

    def describe_sizes(self) -> str:
        made = ", ".join("(" + ", ".join(f"{size_label(n)}={v}" for n, v in zip(self.sizes, k))
                         + ")" for k in self._made)
        return f"sizes known at run time: {', '.join(map(size_label, self.sizes))}; " \
               f"made for {made or 'none yet'}"


def executor_for(module: Module, target=None):
    """The executor of ``module``: an :class:`Executor`, or a :class:`SizedExecutor` where its
    entry takes sizes known only at run time."""
    from .executor import Executor
    return SizedExecutor(module, target) if is_symbolic(module) else Executor(module, target)
