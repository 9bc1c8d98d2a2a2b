"""Execution: running a planned program.

- ``executor.py``: the executor, which interprets the plan: one binding per call site, a
  memory plan of value slots, launches run in program order;
- ``timing.py``: ``--profile``'s per-op times;
- ``measured_cost.py``: the cost model measured on this CPU (``--cost measured``), timing
  each op as the executor runs it."""
