"""The `codex` (OpenAI Codex CLI) backend: `codex app-server`, one persistent JSON-RPC process
per role (see `anima.agents.codex.protocol` for why not `codex exec` per turn), its faults,
profiles and discovery. `anima.agents.codex.backend.CodexBackend` is what the factory uses."""
