"""A reply goes one way, from the input worker to the wafer (tools/reply_path.py): 20 steps of
one CS-X under each assignment, followed with a profiler in every thread, call no file already
on the call stack."""

import pytest

from tools import reply_path


@pytest.mark.parametrize("plan_name", ["static", "dynamic"])
def test_a_reply_calls_back_into_no_file_on_its_path(ray_session, plan_name):
    tracer = reply_path.follow(plan_name)
    files = {f for edge in tracer.edges for f in edge}
    assert {"workers/link.py", "workers/stream.py", "executor/wafer/feed.py"} <= files, files
    assert tracer.backs == {}
