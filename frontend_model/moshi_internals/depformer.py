"""PersonaPlex-family checkpoints step with moshi's own LMGen by running the depformer for the agent rows only.

Their depformer predicts 16 codebooks, the 8 agent ones first, then the 8 user ones, one weight set per step, and
is causal: the user steps never influence the agent rows. LMGen counts the user rows it takes from the input as
`num_codebooks - dep_q - 1`, so with `dep_q` left at 16 it would drop the user's input and let the depformer
overwrite the user rows. Lowering `dep_q` to the agent codebook count after the weights are loaded makes LMGen
read the user rows from the input and run the first 8 depformer steps, with their own weights: the reference's
agent output, at half the depformer cost.
"""

from __future__ import annotations

from moshi.models.lm import LMModel


def agent_codebooks(lm: LMModel) -> int:
    return lm.n_q // 2


def run_depformer_for_agent_only(lm: LMModel) -> int:
    """Make LMGen step a dep_q = n_q checkpoint; returns the checkpoint's own dep_q (the weights stay all there)."""
    trained = lm.dep_q
    agent = agent_codebooks(lm)
    if trained < agent:
        raise ValueError(f"depformer predicts {trained} codebooks, fewer than the {agent} agent codebooks")
    lm.dep_q = agent
    return trained
