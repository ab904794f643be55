"""The agents: a `Dialect` per agent CLI (`dialect.py`; `claude/` and `codex/`), the
transport (`transport.py`) and the turns (`process.py`), redaction where events enter.

Nothing is imported here: `anima status` needs only the protocol's pure functions, and the
process layer (ctypes, ptys) would add to its start-up for nothing.
"""
