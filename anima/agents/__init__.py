"""The `claude` agent layer: discovery, the stream-json protocol, role profiles, the process."""

from anima.agents.discovery import ClaudeBinary, find_claude
from anima.agents.process import AgentProcess
from anima.agents.profiles import ACCEPTOR, DEVELOPER, RoleProfile, profile_for

__all__ = ["ACCEPTOR", "DEVELOPER", "AgentProcess", "ClaudeBinary", "RoleProfile",
           "find_claude", "profile_for"]
