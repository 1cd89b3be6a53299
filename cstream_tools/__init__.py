"""The tools that stand on cstream: the ``cstream`` command (``cli.py`` and one ``cli_<name>.py``
per command), the experiment files (``experiment.py``), the workers-per-CS-X sweep and its
answer (``sweep.py``, ``sweep_answer.py``), the Model Zoo input adapter (``modelzoo_input.py``),
the synthetic input function (``synthetic.py``) and the small models the tests and the
benchmarks train (``models.py``). ``cstream``, ``executor`` and ``workers`` never import this
package."""
