"""Fakes the benchmarks need, shared with the tests: an OpenAI-compatible LLM server speaking the real wire format
(`fake_openai`), `contextspan serve` with faults injected (`python -m benchmarks.fakes.faulty_server`) and a fault
inside one row of the batched forward (`forward_fault`). They ship with the benchmarks so that `contextspan bench
faults` runs from an installed package; product code never imports them."""
