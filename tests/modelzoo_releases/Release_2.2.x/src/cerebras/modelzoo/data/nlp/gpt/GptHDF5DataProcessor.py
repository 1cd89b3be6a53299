import torch

from cerebras.modelzoo.common.registry import registry
from cerebras.modelzoo.data.common.HDF5IterableDataset import HDF5IterableDataset


@registry.register_datasetprocessor("GptHDF5DataProcessor")
class GptHDF5DataProcessor:
    """The GPT HDF5 processor's params keys: data_dir, batch_size, shuffle, shuffle_seed,
    num_workers, drop_last, prefetch_factor, persistent_workers."""

    def __init__(self, params):
        self.dataset = HDF5IterableDataset(params)
        self.batch_size = self.dataset.batch_size
        self.shuffle_seed = params.get("shuffle_seed", None)
        self.num_workers = params.get("num_workers", 0)
        self.drop_last = params.get("drop_last", True)
        self.prefetch_factor = params.get("prefetch_factor", 10) if self.num_workers else None
        self.persistent_workers = params.get("persistent_workers", True) if self.num_workers else False

    def create_dataloader(self):
        return torch.utils.data.DataLoader(
            self.dataset, batch_size=self.batch_size, drop_last=self.drop_last,
            num_workers=self.num_workers, prefetch_factor=self.prefetch_factor,
            persistent_workers=self.persistent_workers)
