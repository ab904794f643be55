"""The `claude` (Claude Code) dialect: its stream-json protocol, role profiles and flags,
discovery of the binary, and what its error results mean. `anima.agents.claude.dialect.CLAUDE`
is the `Dialect` the rest of Anima speaks through."""
