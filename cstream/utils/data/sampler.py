"""``pad_index``: the index a sampler puts in a last, short batch's empty places; the stages of
the Release 2.x ``DistributedSampler`` (``ShuffleSampler``, ``BatchSampler``).

A sampler that pads its last batch to the full batch size (so that every CS-X batch has one size)
fills the missing places with this object; a map dataset that sees it returns a padding sample.
Compare with ``is``/``==``: it equals only itself.
"""

from workers.global_batches import PAD_INDEX as pad_index  # noqa: F401
from workers.global_batches import BatchSampler, ShuffleSampler  # noqa: F401
from workers.sharding import DistributedSampler, GlobalBatchSampler  # noqa: F401
