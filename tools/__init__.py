"""Checks of the code itself, run by the tests: ``import_graph`` (layers and import circles),
``code_figures`` (size figures), ``reply_path`` (the one-way path of a reply)."""
