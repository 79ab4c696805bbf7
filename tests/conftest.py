import os

os.environ.setdefault("NO_TORCH_COMPILE", "1")
