"""The coordinator's ``/v1`` HTTP route paths, the one spelling the server's routes and every client share.

The ledger's FastAPI decorators (:mod:`coordinator.serving.api_routes`, the dashboard, the gossip bootstrap)
are declared with these paths and :class:`protocol.ledger_client.LedgerClient` calls them, so a
renamed route cannot leave a caller behind. A path with a ``{param}`` is a template in FastAPI's
syntax, as the decorator takes it; :func:`fill` makes the concrete path a client asks for.
"""

from __future__ import annotations

import string
from typing import Final
from urllib.parse import quote

PREFIX: Final = "/v1/"
"""Every ledger call's path starts with this; anything else (``/shardcast``, ``/dashboard``) is not a ledger call."""

NODES_REGISTER: Final = "/v1/nodes/register"
NODES_HEARTBEAT: Final = "/v1/nodes/heartbeat"
LEASES: Final = "/v1/leases"
LEASES_RENEW: Final = "/v1/leases/renew"
LEASES_ABANDON: Final = "/v1/leases/abandon"
SUBMISSIONS: Final = "/v1/submissions"
SUBMISSIONS_PENDING: Final = "/v1/submissions/pending"
VERDICTS: Final = "/v1/verdicts"
POLICY_VERSIONS: Final = "/v1/policy-versions"
POLICY_VERSION_LATEST: Final = "/v1/policy-versions/latest"
POLICY_VERSION: Final = "/v1/policy-versions/{version}"
RUN_SPEC: Final = "/v1/run-spec"
STATUS: Final = "/v1/status"
STATS: Final = "/v1/stats"
EVENTS: Final = "/v1/events"
P2P: Final = "/v1/p2p"
DASHBOARD: Final = "/v1/dashboard"


def fill(template: str, **params: int | str) -> str:
    """``template`` with each ``{name}`` replaced by ``params[name]``, percent-encoded as one path segment.

    ValueError unless ``params`` names exactly the template's parameters: a misspelt one would
    otherwise go out as a literal ``{name}`` or be dropped without a word.
    """
    names = {field for _, field, _, _ in string.Formatter().parse(template) if field is not None}
    if names != params.keys():
        raise ValueError(f"{template} takes {sorted(names)}, got {sorted(params)}")
    return template.format(**{name: quote(str(value), safe="") for name, value in params.items()})
