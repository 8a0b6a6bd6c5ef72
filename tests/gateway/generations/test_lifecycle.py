"""A generation's lifecycle (generations/lifecycle.py): the table of moves as documented, its
rules under random event sequences, and the generation that keeps them in place (its per-chunk
append included) agreeing with the pure value at every step."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamsafe.gateway.errors import Failure
from streamsafe.gateway.generations import lifecycle
from streamsafe.gateway.generations.generation import Generation
from streamsafe.gateway.generations.lifecycle import (
    ENDING,
    FINISHED,
    LIVE,
    TRANSITIONS,
    Event,
    IllegalTransition,
    Lifecycle,
    State,
    after,
)
from streamsafe.gateway.generations.request import GenerationRequest
from streamsafe.gateway.generations.store import MemoryEventLog
from streamsafe.gateway.upstream.kinds import KINDS

#: The route of a chat completion to vLLM (every request has its route).
CHAT = KINDS["vllm"].route("/v1/chat/completions")

pytestmark = pytest.mark.unit

_ROOT = Path(__file__).resolve().parents[3]
_GATEWAY = _ROOT / "src" / "streamsafe" / "gateway"
_FAILURE = Failure(503, b'{"error":{"message":"full"}}', 1)


def _documented(rows: list[list[str]]) -> dict[tuple[State, Event], State]:
    """The moves a table's rows (event, from, to) name; ``unchanged``: the state it was in."""
    moves: dict[tuple[State, Event], State] = {}
    for event_name, sources, target in rows:
        event = Event(event_name)
        for source in (State(s.strip()) for s in sources.split(",")):
            moves[source, event] = source if target == "unchanged" else State(target)
    return moves


def _docstring_rows() -> list[list[str]]:
    doc = lifecycle.__doc__ or ""
    lines = doc.splitlines()
    rules = [i for i, line in enumerate(lines) if line.startswith("=====")]
    assert len(rules) == 3, "the module's table: a head, its rule, the rows, a closing rule"
    return [re.split(r"\s{2,}", line.strip()) for line in lines[rules[1] + 1 : rules[2]]]


def _design_rows() -> list[list[str]]:
    text = (_ROOT / "docs" / "design.md").read_text()
    start = text.index("| event | from | to |")
    rows = []
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def test_the_table_is_the_one_the_module_and_the_design_document() -> None:
    assert _documented(_docstring_rows()) == dict(TRANSITIONS)
    assert _documented(_design_rows()) == dict(TRANSITIONS)


def test_every_live_state_can_end_each_way_and_no_final_state_moves() -> None:
    for state in LIVE:
        assert {after(state, ENDING[end]) for end in FINISHED} == FINISHED
    for state in FINISHED:
        for event in Event:
            with pytest.raises(IllegalTransition):
                after(state, event)
    assert set(ENDING) == FINISHED and set(State) == LIVE | FINISHED


def test_a_failure_comes_only_with_a_failed_end() -> None:
    for end in (State.DONE, State.ABORTED):
        with pytest.raises(IllegalTransition, match="failure"):
            Lifecycle().ended(end, _FAILURE)
    assert Lifecycle().ended(State.FAILED, _FAILURE).failure == _FAILURE
    for state in LIVE:
        with pytest.raises(IllegalTransition, match="no end"):
            Lifecycle().ended(state)


def test_the_log_never_goes_back_and_takes_nothing_after_the_end() -> None:
    running = Lifecycle().on(Event.ADMITTED).appended(3)
    assert running.appended(3).length == 3  # a mirror's copy told the same length again
    with pytest.raises(IllegalTransition, match="went back"):
        running.appended(2)
    with pytest.raises(IllegalTransition):
        running.ended(State.DONE).appended(3)
    gen = _generation()
    gen.admitted()
    gen.appended_one(b"{}", 1)
    with pytest.raises(IllegalTransition, match="went back"):
        gen.appended(0)
    gen.end(State.DONE)
    for append in (lambda: gen.appended(1), lambda: gen.appended_one(b"{}", 2)):
        with pytest.raises(IllegalTransition, match="appended in state done"):
            append()
    assert (gen.state, gen.length, gen.failure) == (State.DONE, 1, None)


# -- random event sequences -------------------------------------------------------------------


@dataclass(frozen=True)
class _Step:
    """One thing that may happen to a generation: an event, an append to ``length`` (by the
    per-read path, or the per-chunk one), or an end in ``state`` with or without a failure."""

    kind: str
    event: Event | None = None
    length: int = 0
    state: State | None = None
    failure: bool = False


_steps = st.one_of(
    st.sampled_from([Event.ADMITTED, Event.LEASE_LOST, Event.TAKEN_OVER]).map(
        lambda e: _Step("event", event=e)
    ),
    st.builds(_Step, st.sampled_from(["appended", "appended_one"]), length=st.integers(1, 40)),
    st.builds(_Step, st.just("end"), state=st.sampled_from(State), failure=st.booleans()),
)


def _on_value(value: Lifecycle, step: _Step) -> Lifecycle:
    if step.kind == "event":
        assert step.event is not None
        return value.on(step.event)
    if step.kind == "end":
        assert step.state is not None
        return value.ended(step.state, _FAILURE if step.failure else None)
    return value.appended(step.length)


def _on_generation(gen: Generation, step: _Step) -> None:
    if step.kind == "event":
        {
            Event.ADMITTED: gen.admitted,
            Event.LEASE_LOST: gen.lease_lost,
            Event.TAKEN_OVER: gen.taken_over,
        }[step.event]()  # type: ignore[index]
    elif step.kind == "end":
        assert step.state is not None
        gen.end(step.state, _FAILURE if step.failure else None)
    elif step.kind == "appended":
        gen.appended(step.length)
    else:
        gen.appended_one(b'{"n":1}', step.length)


def _generation() -> Generation:
    req = GenerationRequest("t", "/v1/chat/completions", b"{}", b"f" * 16, 1, True, route=CHAT)
    return Generation("gen-1", req, MemoryEventLog(), None)


@given(st.lists(_steps, max_size=30))
def test_random_events_keep_the_rules_and_the_generation_agrees_with_the_table(
    steps: list[_Step],
) -> None:
    value: Lifecycle = Lifecycle()
    gen = _generation()
    ended_as: tuple[State, int, object | None] | None = None
    for step in steps:
        before = value
        try:
            value = _on_value(value, step)
        except IllegalTransition:
            with pytest.raises(IllegalTransition):
                _on_generation(gen, step)
            assert value == before  # a refused move changes nothing
        else:
            _on_generation(gen, step)
        # The generation in place is the value, step for step (its one-comparison append too).
        assert (gen.state, gen.length, gen.failure) == (value.state, value.length, value.failure)
        assert gen.finished == value.finished and gen.live == (not value.finished)
        # What must hold whatever happened:
        assert value.length >= before.length  # the log never goes back
        assert value.failure is None or value.state is State.FAILED
        if before.finished:  # nothing moves a finished generation
            assert value == before
        if value.finished and ended_as is None:
            ended_as = (value.state, value.length, value.failure)
    if ended_as is not None:
        assert (value.state, value.length, value.failure) == ended_as


# -- one owner --------------------------------------------------------------------------------

#: Objects of other kinds with a ``state`` or a ``failure``, by module and name: the admission
#: queue's waiters, the relay's broken attempt. Everything else that assigns one assigns its
#: own (``self.``).
_OTHER_KINDS = {
    "admission/admission.py": {"waiter"},
    "admission/fair_queue.py": {"waiter", "victim", "head"},
    "relay/relay.py": {"refused"},
}


def test_only_a_generation_writes_its_state_length_and_failure() -> None:
    # A generation's are plain attributes (read per chunk, a property would cost the hot path):
    # what keeps them one owner's is that no other module assigns them.
    found = []
    for path in sorted(_GATEWAY.rglob("*.py")):
        name = path.relative_to(_GATEWAY).as_posix()
        if name == "generations/generation.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, ast.AugAssign | ast.AnnAssign)
                else []
            )
            for target in targets:
                if not isinstance(target, ast.Attribute) or target.attr not in (
                    "state",
                    "length",
                    "failure",
                ):
                    continue
                owner = target.value
                if isinstance(owner, ast.Name) and (
                    owner.id == "self" or owner.id in _OTHER_KINDS.get(name, set())
                ):
                    continue
                found.append(f"{name}:{node.lineno}: {ast.unparse(target)}")
    assert found == []
