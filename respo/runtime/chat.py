"""Chat-formatted prompts: a task's question rendered through the tokenizer's chat template.

An instruct model answers a bare question poorly and never in a checkable form; asked through its
chat template with an answer-format instruction it reasons in words and ends with "Answer: X".
``ChatTask`` wraps a task so that every example's prompt is

    apply_chat_template([{"role": "user", "content": question + "\\n\\n" + instruction}],
                        add_generation_prompt=True)

(the instruction is the task's ``answer_format``, or ``DEFAULT_INSTRUCTION``), and a completion is
graded on its extracted final answer (``respo.runtime.answers``): the wrapped task's own verifier
sees the extracted answer, and an answer equal to the reference (integers exactly, else math-verify)
is correct too.

``prompt_rendering(tokenizer, mode)`` decides: ``"auto"`` renders through the chat template when the
tokenizer has one (a pretrained instruct model) and leaves prompts raw otherwise (the character
tokenizer: its path is untouched, bit for bit); ``"chat"`` insists on a template; ``"raw"`` never
renders.
"""

from __future__ import annotations

from .answers import answers_match, extract_answer
from .tasks.base import Example, Task, TaskError

__all__ = ["ChatTask", "DEFAULT_INSTRUCTION", "PROMPT_FORMATS", "prompt_rendering", "render_prompt", "chat_task"]

DEFAULT_INSTRUCTION = ("Think step by step, then give the final answer on the last line "
                       "in the form \"Answer: <answer>\".")
PROMPT_FORMATS = ("auto", "chat", "raw")


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def prompt_rendering(tokenizer, mode: str = "auto") -> str:
    """``"chat"`` or ``"raw"``: how prompts are rendered for ``tokenizer`` under ``mode``."""
    if mode not in PROMPT_FORMATS:
        raise TaskError(f"prompt format {mode!r} is unknown; choose one of {', '.join(PROMPT_FORMATS)}")
    if mode == "auto":
        return "chat" if has_chat_template(tokenizer) else "raw"
    if mode == "chat" and not has_chat_template(tokenizer):
        raise TaskError("prompt format 'chat' needs a tokenizer with a chat template; this one has none")
    return mode


def render_prompt(tokenizer, question: str, instruction: str = DEFAULT_INSTRUCTION) -> str:
    """The chat-template text of one user turn (question, blank line, instruction) + the assistant header."""
    content = f"{question}\n\n{instruction}" if instruction else question
    return tokenizer.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                         add_generation_prompt=True)


class ChatTask(Task):
    """``task`` with chat-rendered prompts and extracted-answer grading (splits and answers unchanged)."""

    rendering = "chat"

    def __init__(self, task: Task, tokenizer, instruction: str | None = None):
        self.inner, self.tokenizer = task, tokenizer
        self.instruction = instruction if instruction is not None else getattr(task, "answer_format", DEFAULT_INSTRUCTION)
        self.name, self.alphabet, self.overlong = task.name, task.alphabet, task.overlong

    def wrap(self, example: Example) -> Example:
        return Example(prompt=render_prompt(self.tokenizer, example.prompt, self.instruction), answer=example.answer,
                       meta={**example.meta, "question": example.prompt})

    def unwrap(self, example: Example) -> Example:
        meta = dict(example.meta)
        question = meta.pop("question", example.prompt)
        return Example(prompt=question, answer=example.answer, meta=meta)

    def examples(self, split: str, n: int, seed: int) -> list[Example]:
        return [self.wrap(ex) for ex in self.inner.examples(split, n, seed)]

    def is_correct(self, completion: str, example: Example) -> bool:
        answer = extract_answer(completion)
        if answer is None:
            return False
        return answers_match(answer, example.answer) or self.inner._verified(answer, self.unwrap(example))

    def demonstration(self, example: Example) -> str:
        return self.inner.demonstration(self.unwrap(example))


def chat_task(task: Task, tokenizer, mode: str = "auto") -> Task:
    """``ChatTask(task, tokenizer)`` when prompts are to be chat-rendered (``prompt_rendering``), else ``task``
    itself (with ``rendering = "raw"`` readable through ``getattr(task, "rendering", "raw")``)."""
    return ChatTask(task, tokenizer) if prompt_rendering(tokenizer, mode) == "chat" else task


def render_for(tokenizer, mode: str, task: Task, *example_lists: list[Example]) -> tuple:
    """``(task', *lists')``: the task and example lists a run uses with ``tokenizer`` under prompt format ``mode``.

    With chat rendering every example's prompt goes through the template (``ChatTask.wrap``); with raw
    prompts the very same objects come back (the character-tokenizer path is untouched).
    """
    wrapped = chat_task(task, tokenizer, mode)
    if wrapped is task:
        return (task, *example_lists)
    return (wrapped, *[[wrapped.wrap(ex) for ex in exs] for exs in example_lists])
