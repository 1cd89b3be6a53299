"""``appliance_environ``: environment variables that the user's process sets for the input workers.

On a Cerebras cluster the input pipeline runs in other processes on other nodes, so a variable a
program sets with ``os.environ`` is not seen there; one set through ``appliance_environ`` is. In
cstream the input workers are Ray actors (and their DataLoader worker processes): the variables
set here are sent with each input worker's set-up and put into its ``os.environ`` before the
user's ``input_fn`` runs, so DataLoader worker processes that it starts inherit them too.

>>> from cstream.appliance.environment import appliance_environ
>>> appliance_environ["CSTREAM_DOCTEST_VAR"] = "1"
>>> import os; os.environ["CSTREAM_DOCTEST_VAR"], dict(appliance_environ)["CSTREAM_DOCTEST_VAR"]
('1', '1')
>>> del appliance_environ["CSTREAM_DOCTEST_VAR"]
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

from workers import environ


class ApplianceEnviron(MutableMapping):
    """``os.environ`` for the keys set through it, which are also tracked for the input workers."""

    def __getitem__(self, key):
        return os.environ[key]  # as the Cerebras class: reads see every variable

    def __setitem__(self, key, value):
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(
                f"appliance_environ[{key!r}] = {value!r}: keys and values are strings, as in "
                "os.environ."
            )
        os.environ[key] = value
        environ.track(key)

    def __delitem__(self, key):
        del os.environ[key]
        environ.untrack(key)

    def __iter__(self):
        return iter(environ.tracked())

    def __len__(self):
        return len(environ.tracked())

    def __repr__(self):
        return f"ApplianceEnviron({dict(self)!r})"


appliance_environ = ApplianceEnviron()
