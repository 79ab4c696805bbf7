"""Training a tiny Context Spanning model on this machine: synthetic spoken conversations, the trainer, the writer of
the checkpoint layout and the per-machine cache."""
