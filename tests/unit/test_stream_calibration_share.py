"""The worker exports the OOD share its active model saw at calibration, per KB."""

from __future__ import annotations

from sidecar.stream import StreamMetrics


def _shares(m: StreamMetrics) -> dict[tuple[str, str], float]:
    return {
        (s.labels["kb"], s.labels["version"]): s.value
        for metric in m.registry.collect()
        if metric.name == "sidecar_model_calibration_ood_share"
        for s in metric.samples
    }


def test_the_calibration_share_follows_the_active_models() -> None:
    m = StreamMetrics()
    models = {"a": ("v1", "combined"), "b": ("v7", "combined")}
    m.refresh(models, {}, {}, {"a": 0.125, "b": None})
    assert _shares(m) == {("a", "v1"): 0.125}  # a model without a recorded share: absent
    text = m.render().decode()
    assert 'sidecar_model_calibration_ood_share{kb="a",version="v1"} 0.125' in text
    # a swap to a version with another share replaces the series, not adds one
    m.refresh({"a": ("v2", "combined")}, {}, {}, {"a": 0.3})
    assert _shares(m) == {("a", "v2"): 0.3}
    m.refresh({"a": ("v2", "combined")}, {}, {})
    assert _shares(m) == {}
