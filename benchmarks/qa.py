"""`contextspan bench qa`: the paper's answer-quality protocol, its `ref` column, on local JSONL sets.

Each question is said by espeak-ng, heard by our ASR (the bundled Whisper tiny.en, or `--asr-model`), answered by the
backend (the built-in router alone, and any OpenAI-compatible LLM given with `--llm-base-url`, side by side) and the
answer's span text is judged against the set's gold answers. The columns are as the paper's: `ref` (right, no
deadline but `--timeout`), and right within 0.8 s and 1.04 s of the question (the backend's time: the question's
final transcript is ready at `<ret>`, what follows is the agent).

Sets are the formats the reference's `benchmark/` reads, one JSON object a line, the kind from the file name
(`--kind` overrides): LlamaQ `{"question", "answer"}`; WebQ `{"question", "answers": [...]}`; TriviaQA
`{"question", "answer": {"value", "aliases", "normalized_aliases"}}`; HaluEval `{"question", "right_answer", ...}`;
the math sets `{"question" | "Body" + "Question" | "problem", "answer" | "Answer"}`, judged by number; GSM8K
`{"question", "answer": "... #### 72"}`, judged by number. The judge is a string one (a gold alias inside the
normalised span text; for numbers, the gold number among the span's numbers), not the paper's LLM judge.

`--sample DIR` writes the project's small set, one file per format, and runs on it (CI does, with the router and
with the bundled SmolLM2; `--llama` starts that one).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import string
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backend_agent.agent import Agent
from backend_agent.llm_client import ChatClient, LLMConfig
from backend_agent.tools import build_catalogue
from backend_agent.tools.numbers import replace_number_words
from benchmarks.report import machine_info, save_json

DEADLINES_S = (0.8, 1.04)  # the paper's deadline columns
KINDS = ("llamaq", "webq", "triviaqa", "halueval", "math", "gsm8k")
NUMERIC_KINDS = ("math", "gsm8k")
# The paper's GPT-4.1 `ref` column, for the comparison table.
PAPER_REF = {"llamaq": 89.9, "webq": 79.4, "triviaqa": 91.1, "halueval": 68.3, "math": 84.4, "gsm8k": 75.7}


@dataclass(frozen=True)
class Item:
    question: str
    golds: tuple[str, ...]
    numeric: bool


def kind_of(path: Path) -> str:
    """The set's kind from its file name ("triviaqa-dev.jsonl" is TriviaQA; "svamp" and "asdiv" are math)."""
    name = path.name.lower().replace("_", "").replace("-", "")
    for kind, aliases in {"llamaq": ("llamaq", "llamaquestions"), "webq": ("webq",), "triviaqa": ("trivia",),
                          "halueval": ("halueval",), "gsm8k": ("gsm8k",),
                          "math": ("math", "svamp", "asdiv", "multiarith", "addsub", "singleeq")}.items():
        if any(alias in name for alias in aliases):
            return kind
    raise ValueError(f"{path}: cannot tell the set's format from its name; pass --kind ({', '.join(KINDS)})")


def _question(row: dict[str, Any]) -> str:
    if "Body" in row and "Question" in row:  # SVAMP, ASDiv
        return f"{row['Body'].strip()} {row['Question'].strip()}"
    for key in ("question", "Question", "Questions", "problem", "query", "input"):
        if isinstance(row.get(key), str) and row[key].strip():
            return row[key].strip()
    raise ValueError(f"no question in {sorted(row)}")


def _golds(row: dict[str, Any], kind: str) -> tuple[str, ...]:
    if kind == "halueval":
        return (str(row["right_answer"]),)
    if kind == "gsm8k":
        return (str(row["answer"]).rsplit("####", 1)[-1].strip().replace(",", ""),)
    answer = row.get("answers", row.get("answer", row.get("Answer", row.get("numerical answer"))))
    if isinstance(answer, dict):  # TriviaQA
        return tuple(dict.fromkeys([answer.get("value", ""), *answer.get("aliases", []),
                                    *answer.get("normalized_aliases", [])]))
    if isinstance(answer, list):
        return tuple(str(a) for a in answer)
    if answer is None:
        raise ValueError(f"no answer in {sorted(row)}")
    return (str(answer),)


def read_set(path: Path, kind: str | None = None) -> tuple[str, list[Item]]:
    kind = kind or kind_of(path)
    items = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            items.append(Item(_question(row), _golds(row, kind), kind in NUMERIC_KINDS))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}:{number}: not a {kind} row: {exc}") from exc
    return kind, items


def normalise(text: str) -> str:
    """Lower case, number words as digits, no punctuation or articles: "The Red Planet." -> "red planet"."""
    text = replace_number_words(text.lower()).replace(",", "")
    text = "".join(" " if c in string.punctuation and c != "." else c for c in text)
    text = re.sub(r"\.(?!\d)", " ", text)
    return " ".join(w for w in text.split() if w not in ("a", "an", "the"))


def _numbers(text: str) -> list[float]:
    return [float(n) for n in re.findall(r"-?\d+(?:\.\d+)?", normalise(text))]


def judge(item: Item, span: str | None) -> bool:
    """A gold answer inside the span text (as words), or for numeric sets the gold number among its numbers."""
    if not span:
        return False
    if item.numeric:
        golds = [g for gold in item.golds for g in _numbers(gold)]
        return any(abs(n - g) <= 1e-6 * max(1.0, abs(g)) for n in _numbers(span) for g in golds)
    said = f" {normalise(span)} "
    return any(f" {gold} " in said for gold in map(normalise, item.golds) if gold)


def score(sets: dict[str, list[Item]], heard: dict[str, list[str]], llm: ChatClient | None,
          timeout_s: float) -> dict[str, Any]:
    """Ask the backend every heard question; per set the `ref` column and the deadline columns, and every row."""
    agent = Agent(build_catalogue(), llm)
    per_set: dict[str, dict[str, Any]] = {}
    rows = []

    async def run() -> None:
        for kind, items in sets.items():
            right = dict.fromkeys(["ref", *(f"{d:g}s" for d in DEADLINES_S)], 0)
            for item, question in zip(items, heard[kind], strict=True):
                started = time.perf_counter()
                result = await agent.answer(question, "", timeout_s)
                seconds = time.perf_counter() - started
                span = result.answer.text if result.answer else None
                ok = judge(item, span)
                right["ref"] += ok
                for deadline in DEADLINES_S:
                    right[f"{deadline:g}s"] += ok and seconds <= deadline
                rows.append({"set": kind, "said": item.question, "heard": question, "golds": list(item.golds[:5]),
                             "span": span, "tool": result.answer.tool if result.answer else None,
                             "outcome": result.outcome, "reason": result.reason, "right": ok,
                             "ms": round(seconds * 1e3, 1)})
            per_set[kind] = {"n": len(items), **{k: round(100 * v / len(items), 1) for k, v in right.items()}}
        if llm is not None:
            await llm.aclose()

    asyncio.run(run())
    return {"sets": per_set, "rows": rows}


def hear_all(sets: dict[str, list[Item]], asr_model: str | None, tmp: Path) -> dict[str, list[str]]:
    """espeak-ng -> our ASR, every question."""
    from backend_agent.asr.transcriber import WhisperTranscriber
    from benchmarks.spoken_questions import hear

    transcriber = WhisperTranscriber(asr_model)
    return {kind: [hear(transcriber, item.question, tmp / f"{kind}-{i}.wav") for i, item in enumerate(items)]
            for kind, items in sets.items()}


def print_table(runs: dict[str, dict[str, Any]]) -> None:
    names = list(runs)
    columns = ["ref", *(f"{d:g}s" for d in DEADLINES_S)]
    print("| set | n | " + " | ".join(f"{name}: {c}" for name in names for c in columns) + " | paper GPT-4.1 ref |")
    print("|---" * (2 + len(names) * len(columns) + 1) + "|")
    kinds = next(iter(runs.values()))["sets"]
    for kind, first in kinds.items():
        cells = [f"{runs[name]['sets'][kind][c]:.1f}" for name in names for c in columns]
        print(f"| {kind} | {first['n']} | " + " | ".join(cells) + f" | {PAPER_REF.get(kind, '')} |")


SAMPLE: dict[str, list[dict[str, Any]]] = {
    "llamaq": [{"question": "What is the capital of France?", "answer": "Paris"},
               {"question": "How many legs does a spider have?", "answer": "eight"}],
    "webq": [{"url": "http://www.freebase.com/view/en/eiffel_tower", "question": "what country is the eiffel tower in?",
              "answers": ["France"]}],
    "triviaqa": [{"question": "Which planet is known as the Red Planet?",
                  "answer": {"value": "Mars", "aliases": ["Mars", "Planet Mars"], "normalized_aliases": ["mars"]}}],
    "halueval": [{"knowledge": "Nineteen Eighty-Four is a novel by George Orwell published in 1949.",
                  "question": "Who wrote the novel Nineteen Eighty-Four?", "right_answer": "George Orwell",
                  "hallucinated_answer": "Aldous Huxley"}],
    "math": [{"question": "What is fifteen times twelve?", "answer": "180"},
             {"Body": "A box holds two hundred and fifty pens.", "Question": "What is 250 divided by 4?",
              "Answer": 62.5}],
    "gsm8k": [{"question": "What is 36 plus 48?", "answer": "36 + 48 = <<36+48=84>>84\n#### 84"},
              {"question": "A baker makes 12 loaves a day. How many loaves does he make in 7 days?",
               "answer": "12 * 7 = <<12*7=84>>84 loaves.\n#### 84"}],
}


def write_sample(directory: Path) -> list[Path]:
    """The project's small set, one JSONL file per format."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for kind, rows in SAMPLE.items():
        path = directory / f"{kind}.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="contextspan bench qa", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sets", type=Path, nargs="*", help="JSONL files (the kind from the name, or --kind)")
    parser.add_argument("--kind", choices=KINDS, default=None, help="the format of every file given")
    parser.add_argument("--sample", type=Path, default=None, help="write the project's small set here and run it")
    parser.add_argument("--limit", type=int, default=None, help="the first N questions of each set")
    parser.add_argument("--llm-base-url", default=None, help="an OpenAI-compatible LLM, beside the router alone")
    parser.add_argument("--llm-model", default="default")
    parser.add_argument("--llm-api-key", default=None)
    parser.add_argument("--llama", action="store_true", help="start the bundled SmolLM2 (llama.cpp) as the LLM")
    parser.add_argument("--asr-model", default=None, help="faster-whisper model (default: the bundled tiny.en)")
    parser.add_argument("--text", action="store_true", help="the questions as written, no speech or ASR")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds a question for the ref column")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    paths = list(args.sets) + (write_sample(args.sample) if args.sample else [])
    if not paths:
        parser.error("give JSONL sets or --sample DIR")
    sets: dict[str, list[Item]] = {}
    for path in paths:
        kind, items = read_set(path, args.kind)
        sets.setdefault(kind, []).extend(items[: args.limit])
    if args.text:
        heard = {kind: [item.question for item in items] for kind, items in sets.items()}
    else:
        with tempfile.TemporaryDirectory() as tmp:
            heard = hear_all(sets, args.asr_model, Path(tmp))
    llama, url, model = None, args.llm_base_url, args.llm_model
    if args.llama:
        from benchmarks.retrieval_latency import start_llama

        llama, url = start_llama()
        model = "smollm2"
    results: dict[str, Any] = {
        "benchmark": "qa", "asr": "none (text)" if args.text else f"faster-whisper {args.asr_model or 'tiny.en'}",
        "speech": None if args.text else "espeak-ng en-us", "timeout_s": args.timeout,
        "deadlines_s": list(DEADLINES_S), "judge": "string: gold alias in the span text; numbers for math sets",
        "paper_gpt41_ref": PAPER_REF, "machine": machine_info(), "runs": {},
    }
    try:
        results["runs"]["router"] = score(sets, heard, None, args.timeout)
        if url:
            client = ChatClient(LLMConfig(base_url=url, model=model, api_key=args.llm_api_key))
            results["runs"][f"llm {model}"] = score(sets, heard, client, args.timeout)
    finally:
        if llama is not None:
            llama.terminate()
    print_table(results["runs"])
    save_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
