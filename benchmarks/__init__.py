"""The performance harness: each module is a script (``python benchmarks/NAME.py``) and importable
as ``benchmarks.NAME`` (the tests run the short soak that way)."""
