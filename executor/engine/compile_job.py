"""``python -m executor.engine.compile_job JOB``: compile one captured step with inductor in
its own process and save the artifact in the compile cache (see
:func:`executor.engine.compiler.start_inductor_compile`)."""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path

from workers.torch_compat import import_for_unpickling_graphs

import_for_unpickling_graphs()  # before the job's graph is unpickled

import torch  # noqa: E402

from executor.engine.compiler import CacheEntry, compile_inductor_artifact  # noqa: E402


def main(job_path: str) -> int:
    job = pickle.loads(Path(job_path).read_bytes())
    device = job["device"]
    example = tuple([torch.zeros(s, dtype=d, device=device) for s, d in part]
                    for part in job["metas"])
    torch.set_num_threads(job["num_threads"])  # inductor generates kernels for this many threads
    graph = job["graph"]
    if device != "cpu":
        graph = graph.to(device)  # tensors the graph holds, where its inputs are (as fx_step)
    compile_inductor_artifact(graph, example, CacheEntry(job["compile_dir"], job["key"]))
    os.remove(job_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
