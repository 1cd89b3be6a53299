import torch

import cerebras_pytorch as cstorch
import cerebras_pytorch.distributed as dist
from modelzoo.common.pytorch.input_utils import get_streaming_batch_size
from modelzoo.fc_mnist.pytorch.mnist import MNIST


def _dataloader(params, section, train):
    input_params = params[section]
    use_cs = cstorch.use_cs()
    batch_size = get_streaming_batch_size(input_params.get("batch_size"))
    dataset = MNIST(
        input_params["data_dir"],
        train=train,
        download=False,
        transform=lambda x: (x - 0.1307) / 0.3081,
        target_transform=(lambda x: torch.as_tensor(x, dtype=torch.int32)) if use_cs else None,
    )
    sampler = None
    if use_cs and dist.num_streamers() > 1 and dist.is_streamer():
        sampler = torch.utils.data.distributed.DistributedSampler(
            dataset, num_replicas=dist.num_streamers(), rank=dist.get_streaming_rank(),
            shuffle=train and input_params["shuffle"])
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        drop_last=input_params["drop_last_batch"],
        shuffle=False if sampler or not train else input_params["shuffle"],
        num_workers=input_params.get("num_workers", 0),
    )


def get_train_dataloader(params):
    return _dataloader(params, "train_input", train=True)


def get_eval_dataloader(params):
    return _dataloader(params, "eval_input", train=False)
