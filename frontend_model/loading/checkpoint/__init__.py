"""Reading checkpoints from disk in the file layouts they are released in (Kyutai, PersonaPlex, Context Spanning)."""
