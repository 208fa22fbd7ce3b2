"""Oracles through the real ``ollama`` client against a loopback Ollama stub; prompt; phantom oracle."""
from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ollama_stub import OllamaStub

from core.text.llm import (
    PROMPT_VERSION,
    SYSTEM_PROMPT,
    OllamaOracle,
    OracleAnswerError,
    OracleUnavailable,
    PhantomOracle,
    Question,
    build_messages,
    parse_answer,
)

ANCHOR = "deep ulcer with red granulation tissue and fibrin"
NEAR = "deep ulcer with granulation tissue and some fibrin"
FAR = "healed scarred skin, hyperkeratotic border"


@pytest.fixture
def stub():
    with OllamaStub(models=("stub-model:latest",)) as s:
        yield s


def oracle(stub: OllamaStub, **kw) -> OllamaOracle:
    return OllamaOracle("stub-model", host=stub.host, **{"timeout": 2.0, "retries": 2, "backoff": 0.01, **kw})


def test_prompt_is_versioned_and_holds_the_three_descriptions() -> None:
    msgs = build_messages(ANCHOR, NEAR, FAR)
    assert msgs[0] == {"role": "system", "content": SYSTEM_PROMPT} and "RDEB" in SYSTEM_PROMPT
    user = msgs[1]["content"]
    assert "Is wound i more similar to wound j or to wound k?" in user
    assert user.index(ANCHOR) < user.index(NEAR) < user.index(FAR)
    assert PROMPT_VERSION == "triderm-v2"
    for told in ("pain", "itch", "bleeding", "how long"):  # what photos cannot show, the prompt asks to weigh
        assert told in SYSTEM_PROMPT
    assert "ignore what is not clinical" in SYSTEM_PROMPT


def test_parse_answer() -> None:
    assert parse_answer('{"answer": "k"}') == "k"
    for bad in ('{"answer": "maybe"}', "j", '["j"]', "{"):
        with pytest.raises(ValueError):
            parse_answer(bad)


def test_normal_answers_through_real_client(stub: OllamaStub) -> None:
    o = oracle(stub)
    o.check()
    a = o.answer(ANCHOR, NEAR, FAR)
    b = o.answer(ANCHOR, FAR, NEAR)
    assert (a.choice, b.choice) == ("j", "k")
    assert json.loads(a.raw) == {"answer": "j"}
    assert a.tokens_in and a.tokens_out == 5 and a.latency_ms > 0
    body = stub.chats[0]
    assert body["format"]["properties"]["answer"]["enum"] == ["j", "k"]
    assert body["options"]["temperature"] == 0 and body["stream"] is False
    assert stub.tags_requests == 1 and len(stub.chats) == 2


@pytest.mark.parametrize("behaviour", ["error500", "malformed", "bad_content", "outside", "slow"])
def test_transient_failures_are_retried(stub: OllamaStub, behaviour: str) -> None:
    stub.slow_s = 3.0
    stub.queue(behaviour, 2)
    a = oracle(stub, timeout=1.0).answer(ANCHOR, NEAR, FAR)
    assert a.choice == "j"
    assert len(stub.chats) == 3  # two failures, then the answer


@pytest.mark.parametrize("behaviour, reason", [("error500", "HTTP 500"), ("outside", "'j' or 'k'"),
                                               ("malformed", "Error"), ("slow", "Timeout")])
def test_persistent_failures_raise_after_retries(stub: OllamaStub, behaviour: str, reason: str) -> None:
    stub.behaviour = behaviour
    stub.slow_s = 2.0
    with pytest.raises(OracleAnswerError, match=reason):
        oracle(stub, timeout=0.5, retries=1).answer(ANCHOR, NEAR, FAR)
    assert len(stub.chats) == 2


def test_missing_model_fails_clearly(stub: OllamaStub) -> None:
    with pytest.raises(OracleUnavailable, match="ollama pull other-model"):
        OllamaOracle("other-model", host=stub.host).check()
    stub.queue("missing")
    with pytest.raises(OracleUnavailable, match="not there"):
        oracle(stub).answer(ANCHOR, NEAR, FAR)
    assert len(stub.chats) == 1  # a 404 is not retried


def test_unreachable_server_fails_clearly_without_hanging() -> None:
    with OllamaStub() as s:
        host = s.host
    errors: list[BaseException] = []

    def check() -> None:
        try:
            OllamaOracle("stub-model", host=host, connect_timeout=2.0).check()
        except OracleUnavailable as e:  # anything else fails the thread and leaves ``errors`` empty
            errors.append(e)

    worker = threading.Thread(target=check, daemon=True)
    worker.start()
    worker.join(timeout=120)  # generous: the connect timeout is 2 s; a shared machine may be slow
    assert not worker.is_alive(), "check() against a closed port still blocked after 120 s"
    assert len(errors) == 1 and "cannot reach an Ollama server" in str(errors[0]), errors


def test_phantom_oracle_answers_from_the_descriptions_only(demo_workspace) -> None:
    from core.text.queries import photo_texts

    ws = demo_workspace
    o = PhantomOracle(ws.truth_dir, seed=0, skips=False)
    texts = photo_texts(ws)
    ids = sorted(texts)
    vec = {im: o.text_oracle.vector(texts[im]) for im in ids}
    agree = total = 0
    for a in range(53):
        for j, k in ((a + 1, a + 2), (a + 3, a + 5), (a + 7, a + 11)):
            i_, j_, k_ = ids[a], ids[j % 53], ids[k % 53]
            q = Question(i_, j_, k_, texts[i_], texts[j_], texts[k_])
            first = o.answer_question(q).choice
            assert o.answer_question(q).choice == first
            total += 1
            near = ((vec[i_] - vec[j_]) ** 2).sum() < ((vec[i_] - vec[k_]) ** 2).sum()
            agree += (first == "j") == near
    # noisy (85 % expected) but it follows what the texts say: over 159 questions 75 % is 3 sd below
    # the expected 85 %, and a coin flip reaches it with probability < 1e-9
    assert agree / total > 0.75, f"{agree} of {total}"
    # The hidden truth is not consulted: without truth/images.csv and truth/wounds.csv the answers stay.
    q = Question(ids[0], ids[1], ids[2], texts[ids[0]], texts[ids[1]], texts[ids[2]])
    before = [o.answer_question(Question(ids[a], ids[a + 1], ids[a + 2], texts[ids[a]], texts[ids[a + 1]],
                                         texts[ids[a + 2]])).raw for a in range(20)]
    (ws.truth_dir / "images.csv").unlink()
    (ws.truth_dir / "wounds.csv").unlink()
    o2 = PhantomOracle(ws.truth_dir, seed=0, skips=False)
    assert [o2.answer_question(Question(ids[a], ids[a + 1], ids[a + 2], texts[ids[a]], texts[ids[a + 1]],
                                        texts[ids[a + 2]])).raw for a in range(20)] == before
    # Same ids, other texts: the answer probability follows the texts.
    swapped = Question(q.anchor, q.ref_j, q.ref_k, q.anchor_text, q.k_text, q.j_text)
    assert json.loads(o.answer_question(swapped).raw)["p_j"] == pytest.approx(
        1 - json.loads(o.answer_question(q).raw)["p_j"])
    with pytest.raises(OracleUnavailable, match="truth"):
        PhantomOracle(demo_workspace.root / "nowhere")
