import os

from frontend_model.compile_policy import apply_compile_policy

apply_compile_policy()

if os.environ.get("CONTEXTSPAN_TEST_DEVICE", "cpu").startswith("cuda"):
    import torch

    # Exact float32 comparisons on a GPU: TF32 would round matmul and convolution inputs to 10-bit mantissas.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
