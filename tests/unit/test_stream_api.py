"""The public surface of ``sidecar.stream`` is pinned."""

import sidecar.stream as stream


def test_all_is_pinned() -> None:
    assert sorted(stream.__all__) == sorted(
        [
            "BatchOutcome",
            "BatchScorer",
            "DeadLetter",
            "ENCODER_HEADER",
            "LANGUAGE_HEADER",
            "EncoderThread",
            "InputPolicy",
            "NO_MODEL",
            "ProbeCheck",
            "Publisher",
            "Query",
            "REASONS",
            "Raw",
            "Rejected",
            "Runtime",
            "STAGES",
            "StreamMetrics",
            "TopicNames",
            "Verdict",
            "bootstrap_servers",
            "check_probe_embeddings",
            "create_app",
            "ensure_topics",
            "parse_query",
            "probe_sheet",
            "reach_brokers",
            "register_explain_agent",
            "score_once",
            "sidecar_topics",
        ]
    )
    for name in stream.__all__:
        assert getattr(stream, name) is not None


def test_bootstrap_servers_parses_faust_urls() -> None:
    assert stream.bootstrap_servers("kafka://a:1;kafka://b:2") == ["a:1", "b:2"]
    assert stream.bootstrap_servers("c:3") == ["c:3"]
