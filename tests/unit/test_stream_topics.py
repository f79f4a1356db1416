"""Reading the broker's answer to CreateTopics: refusals are per-topic error codes."""

from __future__ import annotations

from types import SimpleNamespace

from sidecar.stream._topics import refused_topics


def test_refused_topics_are_named_with_the_brokers_reason() -> None:
    response = SimpleNamespace(
        topic_errors=[
            ("created", 0, None),
            ("raced", 36, "Topic 'raced' already exists."),  # another replica was first
            ("too-wide", 38, "Replication factor: 3 larger than available brokers: 1."),
            ("forbidden", 29),  # version-0 responses carry no message
        ]
    )
    assert refused_topics(response) == {
        "too-wide": "Replication factor: 3 larger than available brokers: 1.",
        "forbidden": "TopicAuthorizationFailedError",
    }


def test_an_answer_without_errors_refuses_nothing() -> None:
    assert refused_topics(SimpleNamespace(topic_errors=[("a", 0, None), ("b", 0, "")])) == {}
    assert refused_topics(SimpleNamespace()) == {}
