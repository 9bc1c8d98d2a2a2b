"""The ``eqquant`` command line."""
