"""GPT token files as the Model Zoo's preprocessing writes them: dataset ``data`` of shape
``[n_examples, 3, max_sequence_length]`` (input ids, attention mask, labels), attribute
``n_examples``. Each streaming task (input worker) reads whole files: ``files[rank::tasks]``."""

import time
from pathlib import Path

import h5py
import torch

import cerebras.pytorch.distributed as dist
from cerebras.modelzoo.common.input_utils import get_streaming_batch_size

FEATURES = ("input_ids", "attention_mask", "labels")


class HDF5IterableDataset(torch.utils.data.IterableDataset):
    def __init__(self, params):
        super().__init__()
        self.data_dir = params["data_dir"]
        self.batch_size = get_streaming_batch_size(params["batch_size"])
        self.shuffle = params["shuffle"]
        self.shuffle_seed = params.get("shuffle_seed", None)
        self.read_latency_s = params.get("simulated_read_latency_s", 0.0)
        dirs = self.data_dir if isinstance(self.data_dir, list) else [self.data_dir]
        self.files = []
        for directory in dirs:
            p = Path(directory)
            if not p.is_dir():
                raise FileNotFoundError(f"The path {directory} does not exist or is not a directory.")
            self.files.extend(p.glob("*.h5"))
        self.files = sorted(self.files)
        if not self.files:
            raise RuntimeError("No .h5 dataset files found.")
        self.num_tasks = dist.num_streamers() if dist.is_streamer() else 1
        self.task_id = dist.get_streaming_rank() if dist.is_streamer() else 0
        self.files_in_this_task = self.files[self.task_id :: self.num_tasks]

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        worker_id, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        for path in self.files_in_this_task[worker_id::num_workers]:
            with h5py.File(path, mode="r") as h5_file:
                n = int(h5_file.attrs["n_examples"])
                for idx in range(0, n, self.batch_size):
                    time.sleep(self.read_latency_s)  # the storage's latency per batch read
                    chunk = h5_file["data"][idx : idx + self.batch_size]
                    for sample in chunk:
                        yield {name: sample[i] for i, name in enumerate(FEATURES)}
