"""memory_recall's answers: from a chat model speaking the OpenAI API, or extractive without one.

The chat model is a local HTTP server answering ``POST /v1/chat/completions``
in OpenAI's wire format, so the real ``openai`` client talks to it.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from accounts.tiers import Tier
from core.errors import ValidationFailed
from memories import services


class ChatServer:
    def __init__(self, reply: str) -> None:
        self.reply = reply
        self.requests: list[dict] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append({"path": self.path, "body": body})
                payload = json.dumps(
                    {
                        "id": "chatcmpl-1",
                        "object": "chat.completion",
                        "created": 0,
                        "model": body["model"],
                        "choices": [
                            {
                                "index": 0,
                                "finish_reason": "stop",
                                "message": {"role": "assistant", "content": server.reply},
                            }
                        ],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def memory(cast, agents):
    def add(text: str, agent=agents.research) -> str:
        [stored] = services.add_note(
            user_id=cast.alice.id, tier=Tier.PRO, agent_id=agent.id, content=text
        )
        return stored["id"]

    return add


def test_without_a_model_the_answer_is_extractive_and_says_so(cast, agents, memory):
    cat = memory("The user's cat is called Miso. She is a grey tabby.")
    memory("The office moved to Lisbon in March.")
    answer = services.recall_answer(
        user_id=cast.alice.id, agent_id=agents.research.id, query="What is the cat's name?"
    )
    assert answer["mode"] == "extractive"
    assert "extractive" in answer["note"]
    assert "Miso" in answer["answer"]
    assert answer["memory_ids"][0] == cat


def test_an_extractive_answer_quotes_a_note_without_sentence_breaks_in_part(cast, agents, memory):
    # A log line or a code block is one "sentence": the answer quoted all
    # 50,000 characters of it.
    log = memory("deploy " + " ".join(f"step{n}=ok" for n in range(4_000)))

    answer = services.recall_answer(
        user_id=cast.alice.id, agent_id=agents.research.id, query="deploy step results"
    )

    assert answer["memory_ids"] == [log]
    assert len(answer["answer"]) <= 402 and answer["answer"].endswith(" …")
    assert answer["answer"].startswith("deploy step0=ok step1=ok")


def test_without_a_model_an_answer_from_nothing_says_why_it_is_extractive_too(cast, agents):
    # The early return for no candidates left the note out.
    answer = services.recall_answer(
        user_id=cast.alice.id, agent_id=agents.research.id, query="What is the cat's name?"
    )

    assert (answer["answer"], answer["memory_ids"], answer["mode"]) == ("", [], "extractive")
    assert answer["note"] == "No chat model is configured; this answer is extractive."


def test_author_is_refused_with_messages_not_dropped(cast, agents):
    # A turn's author is its role: the argument was accepted and silently dropped.
    with pytest.raises(ValidationFailed, match="author applies to a note or a document"):
        services.add(
            user_id=cast.alice.id,
            agent_id=agents.research.id,
            tier=Tier.PRO,
            messages=[{"role": "user", "content": "Author test message."}],
            author="ignored?",
        )


def test_a_chat_model_chooses_and_condenses(cast, agents, memory, settings):
    memory("The office moved to Lisbon in March.")
    cat = memory("The user's cat is called Miso. She is a grey tabby.")
    chat = ChatServer('Sure: {"answer": "Your cat is Miso.", "used": [1, 7, "x"]}')
    settings.RECALL_CHAT_MODEL = "local-model"
    settings.OPENAI_BASE_URL = chat.url
    try:
        answer = services.recall_answer(
            user_id=cast.alice.id, agent_id=agents.research.id, query="What is the cat's name?"
        )
    finally:
        chat.close()
    assert answer == {
        "answer": "Your cat is Miso.",
        "memory_ids": [cat],  # number 1 is the best match; 7 and "x" are not candidates
        "mode": "llm",
        "model": "local-model",
    }
    [request] = chat.requests
    assert request["path"] == "/v1/chat/completions"
    assert request["body"]["model"] == "local-model"
    prompt = request["body"]["messages"][1]["content"]
    assert '<memory n="1">The user&#x27;s cat is called Miso.' in prompt


def test_a_model_that_answers_out_of_format_falls_back_to_extracts(cast, agents, memory, settings):
    memory("The user's cat is called Miso.")
    chat = ChatServer("I think the cat is Miso!")
    settings.RECALL_CHAT_MODEL = "local-model"
    settings.OPENAI_BASE_URL = chat.url
    try:
        answer = services.recall_answer(
            user_id=cast.alice.id, agent_id=agents.research.id, query="cat's name?"
        )
    finally:
        chat.close()
    assert answer["mode"] == "extractive"
    assert "did not answer" in answer["note"]


def test_recall_never_reaches_another_agents_memory(cast, agents, memory):
    memory("The writer's secret: the cat is really called Pixel.", agent=agents.writer)
    answer = services.recall_answer(
        user_id=cast.alice.id, agent_id=agents.research.id, query="What is the cat called?"
    )
    assert answer["memory_ids"] == []
    assert answer["answer"] == ""


def test_documents_are_chunked_filed_and_filterable(cast, agents):
    document = "# Setup\n\nInstall with make install.\n\n# Usage\n\n" + (
        "Run the server with make serve. " * 60
    )
    stored = services.add_document(
        user_id=cast.alice.id,
        tier=Tier.PRO,
        agent_id=agents.research.id,
        content=document,
        path="docs/readme.md",
        author="ops",
    )
    assert len(stored) >= 3
    services.add_turns(
        user_id=cast.alice.id,
        tier=Tier.PRO,
        agent_id=agents.research.id,
        turns=[{"role": "user", "content": "How do I install it?", "name": "sam"}],
        thread_id="t1",
    )
    filters = services.list_source_filters(user_id=cast.alice.id, agent_id=agents.research.id)
    assert filters == {
        "source_kinds": ["conversation", "document"],
        "authors": ["ops", "sam"],
        "paths": ["docs/readme.md"],
    }
    only_docs = services.search_sources(
        user_id=cast.alice.id,
        agent_id=agents.research.id,
        query="how to install",
        threshold=0,
        path="docs/readme.md",
    )
    assert only_docs and all(m["path"] == "docs/readme.md" for m in only_docs)
    assert only_docs[0]["metadata"]["heading"] == "Setup"
    nothing = services.search_sources(
        user_id=cast.alice.id,
        agent_id=agents.research.id,
        query="how to install",
        threshold=0,
        path="docs/other.md",
    )
    assert nothing == []
    # The writer sees none of it, filters included.
    assert services.list_source_filters(user_id=cast.alice.id, agent_id=agents.writer.id) == {
        "source_kinds": [],
        "authors": [],
        "paths": [],
    }


def test_filters_list_only_what_a_search_can_find(cast, agents):
    # The same agent's memories in another namespace (written over /mcp) and a
    # replaced note: memory_search finds neither, so neither is offered.
    services.remember(
        user_id=cast.alice.id,
        agent_id=agents.research.id,
        tier=Tier.PRO,
        content="Elsewhere: a note in another namespace.",
        namespace="scratch",
    )
    old = services.add_note(
        user_id=cast.alice.id,
        tier=Tier.PRO,
        agent_id=agents.research.id,
        content="The build server is ci-1.",
        author="old-bot",
    )[0]["id"]
    services.add_note(
        user_id=cast.alice.id,
        tier=Tier.PRO,
        agent_id=agents.research.id,
        content="The build server moved to ci-2.",
        author="new-bot",
        replaces=old,
    )

    filters = services.list_source_filters(user_id=cast.alice.id, agent_id=agents.research.id)

    assert filters == {"source_kinds": ["note"], "authors": ["new-bot"], "paths": []}


def test_a_task_shares_findings_between_agents(cast, agents):
    services.add_note(
        user_id=cast.alice.id,
        tier=Tier.PRO,
        agent_id=agents.research.id,
        content="Finding: the bug is in the date parser.",
        task_id="bug-42",
    )
    shared = services.search_sources(
        user_id=cast.alice.id,
        agent_id=agents.writer.id,
        query="where is the bug?",
        threshold=0,
        task_id="bug-42",
    )
    assert [m["content"] for m in shared] == ["Finding: the bug is in the date parser."]
    alone = services.search_sources(
        user_id=cast.alice.id, agent_id=agents.writer.id, query="where is the bug?", threshold=0
    )
    assert alone == []
    charlie = services.search_sources(
        user_id=cast.charlie.id,
        agent_id=agents.helper.id,
        query="where is the bug?",
        threshold=0,
        task_id="bug-42",
    )
    assert charlie == []
