"""HTTP: the FastAPI app (``app``), the prediction protocols (TF Serving REST and the Open
Inference Protocol: ``protocols``, which re-exports ``tfserving``, ``oip``, ``oip_tensors`` and
``protocol_common``; ``openapi_docs``), the prediction routes (``predict_api``, which
re-exports ``predict_request``: a request's parts, ``predict_handlers``: what the routes do,
and ``early_admission``: the refusal from the request head), connection limits and admission
from the request head (``connections``: the protocol; ``connection_table``: the cap, eviction
and deadline sweep; ``connection_limits``: the limits and close responses), the token guard
(``auth``), the dashboard (``dashboard``: its routes; ``dashboard_stats``, ``dashboard_page``)
and the weights endpoints (``weights_api``).

Imports: ``inference``, ``weights`` (the store it serves), ``labels``, ``config``, ``metrics``,
``metrics_merge``, ``heartbeat`` (a group's serving process beats from its event loop).
"""
