"""The compose stack's monitoring side calls nowhere on its own, as the server does not (docs/security.md "Calls
out"): Grafana's defaults report usage to grafana.com, check for updates of itself and its plugins, and fetch a
news feed; the compose file turns each off. Grafana reads GF_<SECTION>_<KEY> over its grafana.ini."""

from __future__ import annotations

import yaml

from tests.deploy.manifests import ROOT

GRAFANA_CALLS_OUT = (
    "GF_ANALYTICS_REPORTING_ENABLED",
    "GF_ANALYTICS_CHECK_FOR_UPDATES",
    "GF_ANALYTICS_CHECK_FOR_PLUGIN_UPDATES",
    "GF_NEWS_NEWS_FEED_ENABLED",
)


def test_the_compose_grafana_calls_nowhere_on_its_own() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    environment = compose["services"]["grafana"]["environment"]
    assert {name: environment.get(name) for name in GRAFANA_CALLS_OUT} == dict.fromkeys(GRAFANA_CALLS_OUT, "false")
