"""The rules language: ``.rules`` files (``loader.py``), their compilation to egglog
(``compile.py``) and the rule checker (``check.py``)."""
