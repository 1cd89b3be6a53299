"""The simulated wafer, in three parts: the resident state (:mod:`.state`), the input feed that
fills one bounded buffer per CS-X from its input stream (:mod:`.feed`), and the loop that runs
steps back to back as a small state machine (:mod:`.loop`). :mod:`executor.driver` puts them
together behind the interface the client calls."""
