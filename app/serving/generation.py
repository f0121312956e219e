"""Which generator writes an answer: by the name an expert gives, or the server's default."""

from __future__ import annotations

import re
from functools import partial

from app.core.settings import Settings
from engine.errors import InvalidSetting, NotConfigured
from engine.followup import REWRITE_SECONDS, REWRITE_TOKENS, Complete
from engine.generators import GENERATOR_NAME, ExtractiveGenerator, Generator, GeneratorError, OpenAIGenerator

TASK_TOKENS, TASK_SECONDS = 256, 30.0  # a chat UI's title, tags or follow-ups: short, and not worth a long wait


class Generators:
    """name -> Generator. "" is the server's default (`MOERAG_DEFAULT_GENERATOR`): the fallback's
    generator and that of experts created without one (proposals, re-fits, the sample)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def __call__(self, name: str) -> Generator:
        """'' (the default), 'extractive', or 'openai' / 'openai:MODEL' on the configured server."""
        s = self.settings
        name = name or s.default_generator or "extractive"
        if name == "extractive":
            return ExtractiveGenerator()
        if name == "openai" or name.startswith("openai:"):
            if not s.openai_base_url:
                raise GeneratorError(f"generator {name!r} needs MOERAG_OPENAI_BASE_URL")
            model = name.partition(":")[2] or s.openai_model
            key = s.openai_api_key.get_secret_value() if s.openai_api_key else ""
            return OpenAIGenerator(s.openai_base_url, model, key)
        raise GeneratorError(f"unknown generator {name!r}; use extractive, openai or openai:MODEL")

    def rewriter(self) -> Complete | None:
        """What makes a follow-up standalone besides the rule (engine.followup): the configured
        model when there is one and MOERAG_FOLLOWUP_REWRITE is `auto`; None: the rule alone."""
        s = self.settings
        if s.followup_rewrite != "auto" or not s.openai_base_url:
            return None
        key = s.openai_api_key.get_secret_value() if s.openai_api_key else ""
        model = OpenAIGenerator(s.openai_base_url, s.openai_model, key)
        return partial(model.complete, max_tokens=REWRITE_TOKENS, timeout=REWRITE_SECONDS)

    def task_model(self) -> Complete | None:
        """What answers a chat UI's own task prompts (engine.chat_tasks): the configured model, when
        there is one; None: they are answered briefly without a model."""
        s = self.settings
        if not s.openai_base_url:
            return None
        key = s.openai_api_key.get_secret_value() if s.openai_api_key else ""
        model = OpenAIGenerator(s.openai_base_url, s.openai_model, key)
        return partial(model.complete, max_tokens=TASK_TOKENS, timeout=TASK_SECONDS)

    def check(self, name: str) -> None:
        """A generator name an expert may be given: it resolves here, or InvalidSetting (422);
        an openai name on a server without MOERAG_OPENAI_BASE_URL is NotConfigured (409)."""
        try:
            self(name)
        except GeneratorError as exc:
            if re.fullmatch(GENERATOR_NAME, name):
                raise NotConfigured(f"{exc}, which this server lacks") from None
            raise InvalidSetting(str(exc)) from None
