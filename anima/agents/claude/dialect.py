"""`claude -p` as a `Dialect`: the protocol's and the faults' pure functions behind one object."""

from __future__ import annotations

import uuid

from anima.agents.claude import faults, protocol
from anima.agents.dialect import Fault, LineParser
from anima.config import RoleConfig
from anima.events import RateLimitChanged, TurnResult


class ClaudeDialect:
    """Claude Code in print mode with stream-json on both sides (tests/test_real_claude.py)."""

    def argv(self, binary_argv: list[str], role_config: RoleConfig, *, session_id: str,
             resume: bool, system_prompt: str, session_model: str | None = None) -> list[str]:
        return protocol.build_argv(binary_argv, role_config, session_id=session_id,
                                   resume=resume, system_prompt=system_prompt,
                                   session_model=session_model)

    def user_message(self, prompt: str) -> bytes:
        return protocol.user_message(prompt)

    def interrupt_request(self) -> bytes:
        return protocol.interrupt_request(f"anima_{uuid.uuid4().hex[:12]}")

    def parser(self, role: str) -> LineParser:
        meter = protocol.ContextMeter()
        return lambda line: protocol.parse_line(role, line, meter)

    def clean_text(self, raw: str) -> str:
        return protocol.clean_text(raw)

    def session_lost(self, result: TurnResult) -> bool:
        """A failed --resume answers `error_during_execution` before any turn ran."""
        return result.subtype == protocol.ERROR_DURING_EXECUTION

    def classify(self, result: TurnResult, rate_limit: RateLimitChanged | None) -> Fault | None:
        return faults.classify(result, rate_limit)


CLAUDE = ClaudeDialect()
