"""The build: checkpoint -> bundle (export) -> engine directory (compile)."""

import os

# transformers 5.25 replaces layers with kernels fetched from the Hugging Face hub at from_pretrained
# (use_kernels defaults on): the build traces and converts the checkpoint's own torch code, reproducibly
# and offline, so it turns them off unless the user's environment says otherwise.
os.environ.setdefault("USE_HUB_KERNELS", "0")
