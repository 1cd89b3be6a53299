"""``pad_index``: the index a sampler puts in a last, short batch's empty places.

A sampler that pads its last batch to the full batch size (so that every CS-X batch has one size)
fills the missing places with this object; a map dataset that sees it returns a padding sample.
Compare with ``is``/``==``: it equals only itself.
"""

pad_index = object()
