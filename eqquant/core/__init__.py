"""The program as data, at the bottom of the package: IR types and nodes. Nothing here reads
the op registry or parses text (``ops`` builds on this; the text IR in ``ir`` on both)."""
