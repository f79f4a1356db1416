"""The worker launcher hands settings to a child ``sidecar worker`` through its environment."""

import sidecar.local as local


def test_settings_env_round_trips() -> None:
    from sidecar.settings import Settings, load_settings

    s = load_settings(scoring={"kbs": ("a", "b"), "default_kb": "b"}, kafka={"route_topics": True})
    env = local.settings_env(s)
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
