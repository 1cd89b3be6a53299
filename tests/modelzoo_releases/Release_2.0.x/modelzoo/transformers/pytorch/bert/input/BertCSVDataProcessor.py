"""BERT pre-training CSV files: ``meta.dat`` in data_dir lists ``<file> <examples>`` per line;
each CSV row holds the features as list literals."""

import ast
import csv
import os
import random
import time

import numpy as np
import torch

import cerebras_pytorch.distributed as dist
from modelzoo.common.pytorch.input_utils import get_streaming_batch_size

FEATURES = ("input_ids", "masked_lm_positions", "masked_lm_weights", "attention_mask", "labels",
            "next_sentence_label", "token_type_ids")


def get_meta_data(data_dir):
    meta_data = {}
    for folder in data_dir if isinstance(data_dir, list) else [data_dir]:
        with open(os.path.join(folder, "meta.dat")) as fin:
            for line in fin:
                name, count = line.split()
                meta_data[os.path.join(folder, name)] = int(count)
    return meta_data


class BertCSVDataProcessor(torch.utils.data.IterableDataset):
    def __init__(self, params):
        super().__init__()
        self.meta_data = get_meta_data(params["data_dir"])
        self.batch_size = get_streaming_batch_size(params["batch_size"])
        self.shuffle = params.get("shuffle", True)
        self.shuffle_seed = params.get("shuffle_seed", None)
        self.num_workers = params.get("num_workers", 0)
        self.drop_last = params.get("drop_last", True)
        self.prefetch_factor = params.get("prefetch_factor", 2)
        self.persistent_workers = params.get("persistent_workers", False)
        self.read_latency_s = params.get("simulated_read_latency_s", 0.0)
        tasks = dist.num_streamers() if dist.is_streamer() else 1
        rank = dist.get_streaming_rank() if dist.is_streamer() else 0
        self.files_in_task = sorted(self.meta_data)[rank::tasks]

    def __iter__(self):
        files = list(self.files_in_task)
        if self.shuffle:
            random.Random(self.shuffle_seed).shuffle(files)
        batch = []
        for path in files:
            with open(path, newline="") as fin:
                for row in csv.DictReader(fin):
                    batch.append({k: np.array(ast.literal_eval(row[k]), dtype=np.int32)
                                  for k in FEATURES})
                    if len(batch) == self.batch_size:
                        time.sleep(self.read_latency_s)
                        yield {k: torch.from_numpy(np.stack([b[k] for b in batch]))
                               for k in FEATURES}
                        batch = []

    def create_dataloader(self):
        if self.num_workers:
            return torch.utils.data.DataLoader(
                self, batch_size=None, num_workers=self.num_workers,
                prefetch_factor=self.prefetch_factor, persistent_workers=self.persistent_workers)
        return torch.utils.data.DataLoader(self, batch_size=None)
