"""The engine's accounting, driven step by step by hand (no loop, no clock): exact memory through
waiting, running, completion, abort and death."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamsafe.engine_sim import EngineDeadError, SimConfig
from streamsafe.engine_sim.engine import Engine
from streamsafe.engine_sim.generation import GenState

pytestmark = pytest.mark.unit


def _engine(**kw) -> Engine:
    return Engine(SimConfig(**kw))


def test_waiting_holds_prompt_and_running_holds_prompt_plus_generated():
    eng = _engine(max_num_seqs=1, memory_tokens=1000)
    a = eng.submit(10, 3)
    b = eng.submit(20, 2)
    assert eng.stats()["memory_used_tokens"] == 30
    assert eng.schedule() == (1, 10)
    assert (eng.stats()["active"], eng.stats()["waiting"]) == (1, 1)
    eng.step()
    eng.step()
    assert eng.stats()["memory_used_tokens"] == 32
    eng.step()  # a's third and last token: a frees 13
    assert a.state == GenState.DONE and a.generated == 3
    assert eng.stats()["memory_used_tokens"] == 20
    assert eng.schedule() == (1, 20)
    eng.step()
    eng.step()
    assert b.state == GenState.DONE
    stats = eng.stats()
    assert stats["memory_used_tokens"] == 0
    assert stats["memory_peak_tokens"] == 33
    assert stats["generations_completed"] == 2 and stats["tokens_generated"] == 5


def test_abort_frees_exactly_what_the_generation_held():
    eng = _engine(max_num_seqs=1)
    a = eng.submit(10, 100)
    b = eng.submit(7, 100)
    eng.schedule()
    for _ in range(4):
        eng.step()
    eng.client_gone(b)  # aborted while waiting: frees its prompt
    assert eng.stats()["memory_used_tokens"] == 14
    a.sent = 1
    eng.client_gone(a)  # aborted while running: frees prompt + generated
    stats = eng.stats()
    assert stats["memory_used_tokens"] == 0
    assert stats["generations_aborted"] == 2
    assert stats["tokens_unread"] == 3  # generated 4, sent 1
    assert a.state == b.state == GenState.ABORTED


def test_without_abort_a_vanished_client_keeps_generating_unread_tokens():
    eng = _engine(abort_on_disconnect=False)
    gen = eng.submit(5, 6)
    eng.schedule()
    eng.step()
    eng.step()
    gen.sent = 2
    eng.client_gone(gen)
    for _ in range(4):
        eng.step()
    stats = eng.stats()
    assert gen.state == GenState.DONE
    assert stats["generations_completed"] == 1 and stats["generations_aborted"] == 0
    assert stats["tokens_unread"] == 4
    assert stats["memory_used_tokens"] == 0


def test_step_that_would_pass_capacity_kills_the_engine():
    eng = _engine(memory_tokens=24)
    a = eng.submit(10, 100)
    b = eng.submit(10, 100)
    eng.schedule()
    eng.step()
    eng.step()  # 24: exactly at capacity is fine
    assert not eng.dead
    eng.step()  # 26 > 24
    stats = eng.stats()
    assert stats["engine_dead"] and stats["crashes"] == 1
    assert stats["generations_failed"] == 2 and stats["memory_used_tokens"] == 0
    assert a.state == b.state == GenState.FAILED
    assert "OutOfResources(26, 24, 'shared memory')" in a.error
    with pytest.raises(EngineDeadError):
        eng.submit(1, 1)
    eng.restart()
    assert not eng.dead
    assert eng.submit(1, 1).state == GenState.WAITING


def test_admission_past_capacity_kills_the_engine():
    eng = _engine(memory_tokens=50)
    waiting = eng.submit(30, 5)
    with pytest.raises(EngineDeadError, match="OutOfResources"):
        eng.submit(21, 5)
    assert eng.dead and waiting.state == GenState.FAILED


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["submit", "step", "gone"]), st.integers(1, 40)), max_size=60
    ),
    abort=st.booleans(),
)
def test_memory_always_equals_what_live_generations_hold(ops, abort):
    eng = _engine(memory_tokens=400, max_num_seqs=3, abort_on_disconnect=abort)
    gens = []
    for op, arg in ops:
        if op == "submit":
            try:
                gens.append(eng.submit(arg, arg % 7 + 1))
            except EngineDeadError:
                eng.restart()
        elif op == "step":
            eng.schedule()
            eng.step()
        elif gens:
            eng.client_gone(gens[arg % len(gens)])
        live = [g for g in gens if not g.finished]
        assert eng.stats()["memory_used_tokens"] == sum(g.prompt_tokens + g.generated for g in live)
        assert eng.stats()["memory_used_tokens"] <= 400
