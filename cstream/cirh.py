"""``cstorch.cirh``: the Cerebras compiler's own ops (``torch.ops.cirh``). The Model Zoo calls
``FusedTopK`` and ``FusedTopP`` to sample tokens in its on-device generation loop; they have no
CPU kernel in the Cerebras package either (they run on a CS-X only). cstream does not simulate
the generation loop, so they raise UnsupportedFeatureError."""

from cstream.unsupported import unsupported

FusedTopK = unsupported("the compiler's fused top-k sampling op (cerebras.pytorch.cirh.FusedTopK, "
                        "used by on-device generation)")
FusedTopP = unsupported("the compiler's fused top-p sampling op (cerebras.pytorch.cirh.FusedTopP, "
                        "used by on-device generation)")
