"""The public surface of ``sidecar.stream`` is pinned."""

import sidecar.stream as stream


def test_all_is_pinned() -> None:
    assert sorted(stream.__all__) == sorted(
        [
            "NO_MODEL",
            "REASONS",
            "STAGES",
            "BatchOutcome",
            "BatchScorer",
            "DeadLetter",
            "InputPolicy",
            "Publisher",
            "Query",
            "Raw",
            "Rejected",
            "Runtime",
            "StreamMetrics",
            "TopicNames",
            "Verdict",
            "WorkerProcess",
            "bootstrap_servers",
            "create_app",
            "ensure_topics",
            "parse_query",
            "reach_brokers",
            "settings_env",
            "sidecar_topics",
        ]
    )
    for name in stream.__all__:
        assert getattr(stream, name) is not None


def test_bootstrap_servers_parses_faust_urls() -> None:
    assert stream.bootstrap_servers("kafka://a:1;kafka://b:2") == ["a:1", "b:2"]
    assert stream.bootstrap_servers("c:3") == ["c:3"]


def test_settings_env_round_trips() -> None:
    from sidecar.settings import Settings, load_settings

    s = load_settings(scoring={"kbs": ("a", "b"), "default_kb": "b"}, kafka={"route_topics": True})
    env = stream.settings_env(s)
    assert env["SIDECAR_SCORING__KBS"] == '["a", "b"]'
    assert env["SIDECAR_KAFKA__ROUTE_TOPICS"] == "true"
    import os

    old = dict(os.environ)
    try:
        os.environ.update(env)
        again = Settings()
    finally:
        os.environ.clear()
        os.environ.update(old)
    assert again.scoring.kbs == ("a", "b") and again.kafka.route_topics is True
