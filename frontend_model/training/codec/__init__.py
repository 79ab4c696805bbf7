"""The tiny codec distilled from a speech encoder, so that its codes carry the words (issue 35; `bench hear`)."""
