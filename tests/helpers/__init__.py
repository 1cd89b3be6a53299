"""What several test files share, one module a kind (``from helpers.streams import read_steps``;
pytest puts ``tests/`` on the path):

- ``cli``: the ``cstream`` command in a subprocess, and the rows of its summary tables;
- ``streams``: the input streams the tests open, the readers that take their batches, the
  single-process sequence they compare with, and the Ray actors cstream started;
- ``runs``: recorded runs (what the wafer saw at each step, the loader's states at checkpoints)
  and a training run written as the porting guide's user code;
- ``models``: the small models and their batches (``TinyLM`` is ``cstream_tools.models``');
- ``checkpoint_files``, ``modelzoo_files``: files in formats cstream no longer writes, and in
  the Model Zoo's own.
"""
