"""The fused DIFF attention kernels, apart from the model: tensors in, tensors out; they know nothing of the model.

``hook.py`` is the one door: imported here, it registers ``hook.fused_kernel`` in the model's table
(``model/attention/fused.py``), which the model's dispatcher asks whether a kernel takes a call. Behind
it: ``triton_diff.py`` (the fused Triton kernel, forward and backward), ``triton_decode.py`` (the split-KV decode
kernel), ``triton_tuning.py`` (the candidate tiles per GPU, chosen by measurement on first use), ``triton_fits.py``
(which candidates fit each GPU: generated data), ``launches.py`` (what the kernels and the hook share: head sizes,
kinds of launch, the failed ones) and ``blocked.py`` (the row-blocked CPU kernel). Nothing here runs by default
(``auto`` is sdpa); each kernel module is imported when its path first runs, and only the Triton ones need triton.
"""

from . import hook  # noqa: F401  (registers ``hook.fused_kernel`` in the model's table: model/attention/fused.py)
