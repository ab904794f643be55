"""The scheduler's transition table on its own: legal moves pass, everything else raises."""

from __future__ import annotations

import pytest

from anima.loop.phases import TRANSITIONS, IllegalTransition, check_transition
from anima.phases import Phase

LEGAL = [
    (Phase.IDLE, Phase.STARTING), (Phase.IDLE, Phase.RECOVERING),
    (Phase.IDLE, Phase.PAUSED),  # stopped by you before its first step
    (Phase.STARTING, Phase.DEVELOPER), (Phase.RECOVERING, Phase.DEVELOPER),
    (Phase.DEVELOPER, Phase.ACCEPTOR), (Phase.DEVELOPER, Phase.FINAL_ACCEPTANCE),
    (Phase.DEVELOPER, Phase.DEVELOPER),  # a rejected round (git check, timeout) goes round
    (Phase.ACCEPTOR, Phase.DEVELOPER), (Phase.ACCEPTOR, Phase.PAUSED),
    (Phase.FINAL_ACCEPTANCE, Phase.MERGING), (Phase.FINAL_ACCEPTANCE, Phase.AWAITING_REVIEW),
    (Phase.MERGING, Phase.COMPLETED), (Phase.MERGING, Phase.DEVELOPER),  # the merge queue
    (Phase.ACCEPTOR, Phase.MERGING), (Phase.RECOVERING, Phase.MERGING),
    (Phase.FINAL_ACCEPTANCE, Phase.DEVELOPER), (Phase.PAUSED, Phase.RECOVERING),
    (Phase.AWAITING_REVIEW, Phase.RECOVERING), (Phase.PAUSED, Phase.CANCELLED),
    (Phase.COMPLETED, Phase.RECOVERING),  # its merge still owed, and it now conflicts
]

ILLEGAL = [
    (Phase.IDLE, Phase.DEVELOPER), (Phase.STARTING, Phase.ACCEPTOR),
    (Phase.DEVELOPER, Phase.COMPLETED),  # completion only through final acceptance
    (Phase.FINAL_ACCEPTANCE, Phase.COMPLETED),  # … and the merge queue
    (Phase.DEVELOPER, Phase.MERGING),  # only reviewed work is merged
    (Phase.ACCEPTOR, Phase.COMPLETED), (Phase.ACCEPTOR, Phase.FINAL_ACCEPTANCE),
    (Phase.PAUSED, Phase.DEVELOPER),  # a resume goes through recovery
    (Phase.COMPLETED, Phase.DEVELOPER), (Phase.COMPLETED, Phase.PAUSED),
    (Phase.CANCELLED, Phase.RECOVERING),
]


@pytest.mark.parametrize(("current", "target"), LEGAL)
def test_legal_transitions(current: Phase, target: Phase) -> None:
    check_transition(current, target)


@pytest.mark.parametrize(("current", "target"), ILLEGAL)
def test_illegal_transitions_raise(current: Phase, target: Phase) -> None:
    with pytest.raises(IllegalTransition, match=f"{current} → {target}"):
        check_transition(current, target)


def test_every_phase_has_a_row_and_every_active_phase_can_pause() -> None:
    assert set(TRANSITIONS) == set(Phase)
    for phase in (Phase.DEVELOPER, Phase.ACCEPTOR, Phase.FINAL_ACCEPTANCE):
        assert Phase.PAUSED in TRANSITIONS[phase]
    assert TRANSITIONS[Phase.COMPLETED] == frozenset({Phase.RECOVERING})
    assert TRANSITIONS[Phase.CANCELLED] == frozenset()
