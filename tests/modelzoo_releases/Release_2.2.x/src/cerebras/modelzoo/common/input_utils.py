import cerebras.pytorch.distributed as dist


def get_streaming_batch_size(effective_batch_size):
    """This input worker's share of the effective batch (its CS-X's slice)."""
    return dist.get_streaming_batch_size(effective_batch_size)
